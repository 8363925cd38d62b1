-- idempotency 0.1.0: the install script of release 0.1.0, kept as released; do not edit
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- sql/install/00_keys.sql
-- Key storage and the key lifecycle: reserve, complete, release, checkpoint,
-- lookup.  The functions are C and run inside the caller's transaction.

-- The key columns compare bytewise (COLLATE "C"): keys are identifiers, and
-- every reservation descends the primary key, which with a linguistic
-- collation would call strcoll() at each step.
CREATE TABLE @extschema@.idem_keys (
	scope			text		COLLATE "C" NOT NULL,
	operation		text		COLLATE "C" NOT NULL,
	key				text		COLLATE "C" NOT NULL,
	request_hash	bytea,
	status			text		NOT NULL
		CONSTRAINT idem_keys_status_check
		CHECK (status IN ('processing', 'completed', 'stuck')),
	response_status	integer,
	response		jsonb,
	resource_id		text,
	recovery_point	text,
	created_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	updated_at		timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	expires_at		timestamptz	NOT NULL,
	CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, operation, key)
) WITH (fillfactor = 90);

COMMENT ON TABLE @extschema@.idem_keys IS
	'idempotency records: one row per (scope, operation, key)';

-- Keep the records in pg_dump output: they are user data, not extension code.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_keys', '');

-- The row idem_reserve returns.  A named type rather than OUT parameters:
-- the caller's executor finds its descriptor in the type cache instead of
-- building it on every call.
CREATE TYPE @extschema@.idem_reservation AS (
	outcome			text,
	http_status		integer,
	response_status	integer,
	response		jsonb,
	resource_id		text,
	recovery_point	text,
	expires_at		timestamptz
);

CREATE FUNCTION @extschema@.idem_reserve(
	operation text,
	key text,
	request jsonb DEFAULT NULL,
	scope text DEFAULT '',
	ttl interval DEFAULT NULL)
RETURNS @extschema@.idem_reservation
AS 'MODULE_PATHNAME', 'idem_reserve'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_complete(
	operation text,
	key text,
	response jsonb DEFAULT NULL,
	response_status integer DEFAULT 200,
	resource_id text DEFAULT NULL,
	scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_release(
	operation text,
	key text,
	scope text DEFAULT '')
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_checkpoint(
	operation text,
	key text,
	recovery_point text,
	scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_checkpoint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_lookup(
	operation text,
	key text,
	scope text DEFAULT '')
RETURNS SETOF @extschema@.idem_keys
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C STABLE PARALLEL SAFE ROWS 1;

-- sql/install/10_canonical.sql
-- The canonical request fingerprint: RFC 8785 (JSON Canonicalization Scheme)
-- serialization of a jsonb value and the SHA-256 of its UTF-8 bytes.  Both
-- are C; idem_reserve computes request_hash with the same C routine.

CREATE FUNCTION @extschema@.idem_canonical(value jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_canonical(jsonb) IS
	'RFC 8785 canonical JSON text of a jsonb value';

CREATE FUNCTION @extschema@.idem_hash(value jsonb)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_hash'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_hash(jsonb) IS
	'SHA-256 of the UTF-8 bytes of idem_canonical(value): the request fingerprint';

-- sql/install/20_maintenance.sql
-- Maintenance: expiry of completed records, stuck detection and
-- reconciliation.  The background worker and these functions run the same
-- C routines (src/maintenance.c); the functions let you run or schedule the
-- work yourself, for example with pg_cron.

-- Finds expired records without reading the table.  Only expires_at is
-- indexed: idem_complete changes status, response and updated_at but not
-- expires_at, so completing a key stays a HOT update.
CREATE INDEX idem_keys_expires_at_idx ON @extschema@.idem_keys (expires_at);

-- A reconciler runs as run_as.  Whoever writes a row must be able to become
-- that role, so write access to this table never lends another role's rights.
CREATE TABLE @extschema@.idem_reconcilers (
	operation	text		NOT NULL,
	handler		text		NOT NULL,
	run_as		regrole		NOT NULL,
	created_at	timestamptz	NOT NULL DEFAULT pg_catalog.now(),
	CONSTRAINT idem_reconcilers_pkey PRIMARY KEY (operation),
	CONSTRAINT idem_reconcilers_run_as_check
		CHECK (pg_catalog.pg_has_role(run_as::pg_catalog.oid, 'MEMBER'))
);

COMMENT ON TABLE @extschema@.idem_reconcilers IS
	'reconciler of each operation (see idem_set_reconciler): handler is the function''s signature, run_as the role it runs as';

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

-- sql/install/30_stats.sql
-- Statistics: counters per operation of the current database, kept in shared
-- memory by the C code (src/stats.c).  Needs shared_preload_libraries; without
-- it, reading them raises an error that says so.

CREATE FUNCTION @extschema@.idem_stats(
	OUT operation text,
	OUT reserves bigint,
	OUT "new" bigint,
	OUT replays bigint,
	OUT in_progress bigint,
	OUT mismatches bigint,
	OUT stuck bigint,
	OUT completes bigint,
	OUT releases bigint,
	OUT consumed bigint,
	OUT duplicates bigint,
	OUT expired bigint,
	OUT flagged_stuck bigint,
	OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

-- collision_rate is NULL while an operation has no reservations: there is no
-- rate to report yet, and NULL keeps such rows out of "collision_rate > x".
CREATE VIEW @extschema@.idem_stats AS
SELECT s.operation,
	s.reserves,
	s."new",
	s.replays,
	s.in_progress,
	s.mismatches,
	s.stuck,
	s.completes,
	s.releases,
	s.consumed,
	s.duplicates,
	s.expired,
	s.flagged_stuck,
	CASE WHEN s.reserves OPERATOR(pg_catalog.>) 0
		THEN (s.replays OPERATOR(pg_catalog.+) s.in_progress
			  OPERATOR(pg_catalog.+) s.mismatches)::pg_catalog.float8
			OPERATOR(pg_catalog./) s.reserves::pg_catalog.float8
	END AS collision_rate,
	s.stats_reset
FROM @extschema@.idem_stats() s;

COMMENT ON VIEW @extschema@.idem_stats IS
	'idempotency counters per operation of the current database since stats_reset';

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

-- Monitoring roles read the statistics through pg_read_all_stats, as they do
-- PostgreSQL's own; the view's functions run with the reader's privileges, so
-- idem_stats() is granted too.  Nothing goes to PUBLIC (90_security.sql
-- revokes EXECUTE), and idem_stats_reset() stays with the owner.
REVOKE ALL ON @extschema@.idem_stats FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_stats TO pg_read_all_stats;
GRANT EXECUTE ON FUNCTION @extschema@.idem_stats() TO pg_read_all_stats;

-- sql/install/40_patterns.sql
-- Patterns on top of the key lifecycle: idem_call for stored procedures and
-- idem_consume for message consumers.  Both are C, run inside the caller's
-- transaction and share idem_keys, expiry and statistics with idem_reserve.

CREATE FUNCTION @extschema@.idem_call(
	operation text,
	key text,
	request jsonb,
	handler regprocedure,
	scope text DEFAULT '',
	ttl interval DEFAULT NULL)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'idem_call'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_call(text, text, jsonb, regprocedure, text, interval) IS
	'reserve a key, run handler(request) once and complete with its result; replay it on retries';

CREATE FUNCTION @extschema@.idem_consume(
	consumer text,
	message_id text,
	ttl interval DEFAULT NULL,
	wait boolean DEFAULT true)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_consume'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION @extschema@.idem_consume(text, text, interval, boolean) IS
	'inbox de-duplication: true the first time a message is processed, false for a duplicate, NULL while another transaction holds it (wait => false)';

-- sql/install/90_security.sql
-- Nothing is granted to PUBLIC.  CREATE FUNCTION grants EXECUTE to PUBLIC by
-- default; take that back for every function (and procedure: ON ROUTINE)
-- this script created.  Grant recipes for application and monitoring roles
-- are in the README.
DO $$
DECLARE
	f regprocedure;
BEGIN
	FOR f IN
		SELECT p.oid::regprocedure
		FROM pg_catalog.pg_proc p
		JOIN pg_catalog.pg_depend d
		  ON d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
		 AND d.objid = p.oid
		 AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass
		 AND d.deptype = 'e'
		JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
		WHERE e.extname = 'idempotency'
	LOOP
		EXECUTE pg_catalog.format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', f);
	END LOOP;
END
$$;
