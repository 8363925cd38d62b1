-- Maintenance: expiry of completed records, stuck detection and
-- reconciliation.  The background worker and these functions run the same
-- C routines (src/maintenance.c); the functions let you run or schedule the
-- work yourself, for example with pg_cron.

-- Finds expired records without reading the table.  idem_complete sets
-- expires_at (completion time + ttl), so a completion also adds an entry
-- here and to the primary key.
CREATE INDEX idem_keys_expires_at_idx ON @extschema@.idem_keys (expires_at);

-- Finds the candidates of stuck detection without reading the table: only
-- processing records have an entry, so it stays as small as the number of
-- requests under way.  Its column and its predicate are ones a heartbeat
-- (idem_checkpoint, which changes updated_at) leaves alone, so that update
-- stays HOT; completion changes the status anyway.  Maintenance finds it by
-- this definition, whatever its name.
CREATE INDEX idem_keys_processing_idx ON @extschema@.idem_keys (created_at)
	WHERE status OPERATOR(pg_catalog.=) 'processing'::pg_catalog.text;

-- A reconciler runs as run_as.  handler is the function's signature, text
-- and not regprocedure: a reg* column that names a function would stop
-- pg_upgrade of the whole cluster.  The trigger below checks every row
-- written, through idem_set_reconciler or by hand: handler must be a
-- reconciler's signature (stored schema-qualified), the writer must be
-- able to become run_as, and registered_by becomes the writer.  Maintenance
-- checks all of it again before each call (src/maintenance.c), so that
-- rights revoked and functions changed since the write take effect.
CREATE TABLE @extschema@.idem_reconcilers (
	operation	text		NOT NULL,
	handler		text		NOT NULL,
	run_as		regrole		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	registered_by regrole	NOT NULL,
	CONSTRAINT idem_reconcilers_pkey PRIMARY KEY (operation)
);

COMMENT ON TABLE @extschema@.idem_reconcilers IS
	'reconciler of each operation (see idem_set_reconciler): handler is the function''s signature, run_as the role it runs as, registered_by the role that wrote the row';

CREATE FUNCTION @extschema@.idem_reconcilers_check()
RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_reconcilers_check'
LANGUAGE C;

COMMENT ON FUNCTION @extschema@.idem_reconcilers_check() IS
	'trigger of idem_reconcilers: checks the handler and that the writer may act as run_as, and records the writer as registered_by';

CREATE TRIGGER idem_reconcilers_check
	BEFORE INSERT OR UPDATE ON @extschema@.idem_reconcilers
	FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_reconcilers_check();

-- Registrations are configuration the user made: keep them in pg_dump output.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_reconcilers', '');

CREATE FUNCTION @extschema@.idem_sweep(batch_size integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_sweep'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_sweep(integer) IS
	'deletes completed records past expires_at, batch_size at a time (NULL: idempotency.sweep_batch_size); returns how many';

CREATE FUNCTION @extschema@.idem_flag_stuck()
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_flag_stuck'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_flag_stuck() IS
	'flags processing records older than idempotency.processing_timeout as stuck, with NOTIFY idem_stuck each; returns how many';

CREATE FUNCTION @extschema@.idem_reconcile()
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_reconcile'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_reconcile() IS
	'calls the registered reconciler of each stuck record; returns how many calls returned without error';

CREATE PROCEDURE @extschema@.idem_maintain()
AS 'MODULE_PATHNAME', 'idem_maintain'
LANGUAGE C;

COMMENT ON PROCEDURE @extschema@.idem_maintain() IS
	'one maintenance pass as the background worker runs it: sweep, flag, reconcile, committing after each batch and each reconciler call';

CREATE FUNCTION @extschema@.idem_set_reconciler(operation text, handler regprocedure)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_set_reconciler'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_set_reconciler(text, regprocedure) IS
	'registers handler(idem_keys) as the reconciler of an operation, run as the current role; NULL removes it';

-- Records whose outcome is unknown: flagged stuck, or processing for longer
-- than idempotency.processing_timeout (idem_reserve answers stuck for both).
CREATE VIEW @extschema@.idem_stuck AS
SELECT k.scope,
	   k.operation,
	   k.key,
	   k.status OPERATOR(pg_catalog.=) 'stuck'::pg_catalog.text AS flagged,
	   k.recovery_point,
	   k.created_at,
	   k.updated_at,
	   pg_catalog.now() OPERATOR(pg_catalog.-) k.updated_at AS idle_for,
	   r.handler AS reconciler
FROM @extschema@.idem_keys k
LEFT JOIN @extschema@.idem_reconcilers r
	   ON r.operation OPERATOR(pg_catalog.=) k.operation
WHERE k.status OPERATOR(pg_catalog.=) 'stuck'::pg_catalog.text
   OR (k.status OPERATOR(pg_catalog.=) 'processing'::pg_catalog.text
	   AND k.updated_at OPERATOR(pg_catalog.<=) (pg_catalog.now() OPERATOR(pg_catalog.-)
		   (SELECT CASE WHEN t.v OPERATOR(pg_catalog.~) '^[0-9]+$'
						THEN pg_catalog.make_interval(secs => t.v::pg_catalog.float8 OPERATOR(pg_catalog./) 1000)
						ELSE t.v::pg_catalog.interval END
			FROM (SELECT COALESCE(
						pg_catalog.current_setting('idempotency.processing_timeout', true),
						'5min') AS v) t)));

COMMENT ON VIEW @extschema@.idem_stuck IS
	'records whose outcome is unknown: flagged stuck, or processing past idempotency.processing_timeout';
