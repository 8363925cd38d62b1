-- idempotency: the install script.  make copies it to idempotency--VERSION.sql
-- (VERSION from idempotency.control); the scripts of earlier releases and
-- the upgrade scripts beside it are kept as released.
\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-- keys ------------------------------------------------------------------

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
	-- the ttl given at reservation: completion sets expires_at to its time
	-- plus ttl (NULL, in a record of 0.1.0 or one written by hand:
	-- expires_at - created_at, or idempotency.default_ttl if not positive)
	ttl				interval,
	CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, operation, key)
) WITH (fillfactor = 90);

COMMENT ON TABLE @extschema@.idem_keys IS
	'idempotency records: one row per (scope, operation, key)';

-- Keep the records in pg_dump output: they are user data, not extension code.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idem_keys', '');

-- The row idem_reserve returns, as a type of its own for callers that
-- declare variables of it.  idem_reserve itself declares OUT parameters of
-- the same names and types: a function whose result is a composite type
-- has that type's relation opened for each call after parse analysis found
-- the function, without a lock that keeps it, and a call racing DROP
-- EXTENSION failed with XX000 "could not open relation with OID ...".
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
	ttl interval DEFAULT NULL,
	OUT outcome text,
	OUT http_status integer,
	OUT response_status integer,
	OUT response jsonb,
	OUT resource_id text,
	OUT recovery_point text,
	OUT expires_at timestamptz)
RETURNS record
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

-- The columns of idem_keys, declared here rather than as SETOF idem_keys
-- for the same reason as idem_reserve's OUT parameters
CREATE FUNCTION @extschema@.idem_lookup(
	operation text,
	key text,
	scope text DEFAULT '')
RETURNS TABLE (
	scope			text,
	operation		text,
	key				text,
	request_hash	bytea,
	status			text,
	response_status	integer,
	response		jsonb,
	resource_id		text,
	recovery_point	text,
	created_at		timestamptz,
	updated_at		timestamptz,
	expires_at		timestamptz,
	ttl				interval)
AS 'MODULE_PATHNAME', 'idem_lookup'
LANGUAGE C STABLE PARALLEL RESTRICTED ROWS 1;

-- canonical ------------------------------------------------------------------

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

-- maintenance ------------------------------------------------------------------

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
-- this definition, whatever its name, and works without it (the update
-- from 0.1.0 leaves it to CREATE INDEX CONCURRENTLY: README, "Upgrading").
CREATE INDEX idem_keys_processing_idx ON @extschema@.idem_keys (created_at)
	WHERE status OPERATOR(pg_catalog.=) 'processing'::pg_catalog.text;

-- A reconciler runs as run_as.  handler is the function's signature, text
-- and not regprocedure: a reg* column that names a function would stop
-- pg_upgrade of the whole cluster.  The trigger below checks every row
-- written, through idem_set_reconciler or by hand: handler must be a
-- reconciler's signature (stored schema-qualified), the writer must be
-- able to become run_as, and registered_by becomes the writer (0, no role,
-- only in a row registered by 0.1.0: run_as registered it).  Maintenance
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
-- Read with its owner's rights (idem_monitor needs no access to idem_keys),
-- so a security_barrier view: a reader's function in the WHERE clause sees
-- only the rows the view returns, never the rest of idem_keys.
CREATE VIEW @extschema@.idem_stuck WITH (security_barrier) AS
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

-- stats ------------------------------------------------------------------

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

-- monitoring ------------------------------------------------------------------

-- The background worker's state per database, kept in shared memory by the
-- C code (src/status.c): what the last maintenance pass did and when, and
-- when the next is due.  Needs shared_preload_libraries, like idem_stats.

CREATE FUNCTION @extschema@.idem_worker_status(
	OUT datid oid,
	OUT passes bigint,
	OUT last_pass_start timestamptz,
	OUT last_pass_end timestamptz,
	OUT deleted bigint,
	OUT flagged bigint,
	OUT reconciled bigint,
	OUT failed bigint,
	OUT skipped bigint,
	OUT write_errors bigint,
	OUT batches bigint,
	OUT longest_batch interval,
	OUT stopped_early boolean,
	OUT total_deleted bigint,
	OUT total_flagged bigint,
	OUT total_reconciled bigint,
	OUT total_failed bigint,
	OUT total_skipped bigint,
	OUT total_write_errors bigint,
	OUT next_pass_due timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_worker_status'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW @extschema@.idem_worker_status AS
SELECT s.datid,
	d.datname,
	s.passes,
	s.last_pass_start,
	s.last_pass_end,
	s.last_pass_end OPERATOR(pg_catalog.-) s.last_pass_start AS last_pass_duration,
	s.deleted,
	s.flagged,
	s.reconciled,
	s.failed,
	s.skipped,
	s.write_errors,
	s.batches,
	s.longest_batch,
	s.stopped_early,
	s.total_deleted,
	s.total_flagged,
	s.total_reconciled,
	s.total_failed,
	s.total_skipped,
	s.total_write_errors,
	s.next_pass_due
FROM @extschema@.idem_worker_status() s
LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.datid;

COMMENT ON VIEW @extschema@.idem_worker_status IS
	'the background worker''s last maintenance pass in each database since the server started, and when the next is due';

-- Read like idem_stats: through pg_read_all_stats, nothing to PUBLIC
-- (90_security.sql revokes EXECUTE from PUBLIC).
REVOKE ALL ON @extschema@.idem_worker_status FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_worker_status TO pg_read_all_stats;
GRANT EXECUTE ON FUNCTION @extschema@.idem_worker_status() TO pg_read_all_stats;

-- The reconcilers the worker holds back (src/backoff.c): stuck records whose
-- reconciler failed, timed out or had its process ended, each tried again
-- after a delay that grows with each failure, and operations whose
-- reconciler is skipped, with the reason.  Kept in shared memory since the
-- server started; needs shared_preload_libraries, like idem_worker_status.

CREATE FUNCTION @extschema@.idem_reconciler_status(
	OUT datid oid,
	OUT state text,
	OUT operation text,
	OUT scope text,
	OUT key text,
	OUT reason text,
	OUT attempts integer,
	OUT since timestamptz,
	OUT last timestamptz,
	OUT next_attempt timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_reconciler_status'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW @extschema@.idem_reconciler_status AS
SELECT s.datid,
	d.datname,
	s.state,
	s.operation,
	s.scope,
	s.key,
	s.reason,
	s.attempts,
	s.since,
	s.last,
	s.next_attempt
FROM @extschema@.idem_reconciler_status() s
LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.datid;

COMMENT ON VIEW @extschema@.idem_reconciler_status IS
	'skipped reconcilers and stuck records whose reconciler failed, with the reason and the next attempt, since the server started';

REVOKE ALL ON @extschema@.idem_reconciler_status FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_reconciler_status TO pg_read_all_stats;
GRANT EXECUTE ON FUNCTION @extschema@.idem_reconciler_status() TO pg_read_all_stats;

-- What the maintenance has not done yet, for alerts: completed records past
-- expires_at that are not deleted yet (the sweeper's backlog), and the
-- records of idem_stuck.  Read with the view owner's rights, so a
-- monitoring role needs no access to idem_keys itself; a security_barrier
-- view, as every view over idem_keys.
CREATE VIEW @extschema@.idem_backlog WITH (security_barrier) AS
SELECT e.expired,
	e.oldest_expired,
	s.stuck,
	s.oldest_stuck
FROM (SELECT pg_catalog.count(*) AS expired,
			 pg_catalog.min(k.expires_at) AS oldest_expired
	  FROM @extschema@.idem_keys k
	  WHERE k.status OPERATOR(pg_catalog.=) 'completed'::pg_catalog.text
		AND k.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()) e,
	 (SELECT pg_catalog.count(*) AS stuck,
			 pg_catalog.min(t.updated_at) AS oldest_stuck
	  FROM @extschema@.idem_stuck t) s;

COMMENT ON VIEW @extschema@.idem_backlog IS
	'expired completed records not deleted yet, and records whose outcome is unknown (idem_stuck): how many, and the oldest';

REVOKE ALL ON @extschema@.idem_backlog FROM PUBLIC;
GRANT SELECT ON @extschema@.idem_backlog TO pg_read_all_stats;

-- patterns ------------------------------------------------------------------

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

-- citus ------------------------------------------------------------------

-- Scale-out on Citus (doc/citus.md).  The one supported
-- mode: idem_keys distributed by scope, co-located with the tenant's
-- table, so that a reservation, the effect and the completion of one scope
-- run in one shard's transaction on one node.  The C code reads and writes
-- the shard relation that holds the scope (src/records.c, RecordsResolve);
-- with Citus installed and idem_keys not distributed, every call refuses.
CREATE FUNCTION @extschema@.idem_distribute(colocate_with regclass)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
	keys pg_catalog.regclass := '@extschema@.idem_keys';
	f pg_catalog.regprocedure;
	arg pg_catalog.text;
BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
		RAISE EXCEPTION 'extension "citus" is not installed'
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'idem_distribute distributes table "idem_keys" with Citus.',
				  HINT = 'Without Citus, idem_keys needs no set-up.';
	END IF;
	IF colocate_with IS NULL THEN
		RAISE EXCEPTION 'argument "colocate_with" must not be null'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;

	-- The records move into the shards; the shell keeps none of them.
	PERFORM pg_catalog.create_distributed_table(keys, 'scope',
		colocate_with => colocate_with::pg_catalog.text);
	PERFORM pg_catalog.truncate_local_data_after_distributing_table(keys);

	-- Each function that takes a scope runs on the node of that scope's
	-- shard, inside the caller's transaction (force_delegation).
	FOR f, arg IN VALUES
		('@extschema@.idem_reserve(text, text, jsonb, text, interval)'::pg_catalog.regprocedure, '$4'),
		('@extschema@.idem_complete(text, text, jsonb, integer, text, text)'::pg_catalog.regprocedure, '$6'),
		('@extschema@.idem_release(text, text, text)'::pg_catalog.regprocedure, '$3'),
		('@extschema@.idem_checkpoint(text, text, text, text)'::pg_catalog.regprocedure, '$4'),
		('@extschema@.idem_lookup(text, text, text)'::pg_catalog.regprocedure, '$3'),
		('@extschema@.idem_call(text, text, jsonb, regprocedure, text, interval)'::pg_catalog.regprocedure, '$5')
	LOOP
		PERFORM pg_catalog.create_distributed_function(f, arg,
			colocate_with => keys::pg_catalog.text, force_delegation => true);
	END LOOP;
END
$body$;

COMMENT ON FUNCTION @extschema@.idem_distribute(regclass) IS
	'Citus set-up: distributes idem_keys by scope co-located with the given table and delegates the functions that take a scope to the node of its shard';

-- security ------------------------------------------------------------------

-- Nothing is granted to PUBLIC.  CREATE FUNCTION grants EXECUTE to PUBLIC by
-- default; take that back for every function (and procedure: ON ROUTINE)
-- this script created.  Grant recipes for application and monitoring roles
-- are in doc/security.md.
DO $$
DECLARE
	f pg_catalog.regprocedure;
BEGIN
	FOR f IN
		SELECT p.oid::pg_catalog.regprocedure
		FROM pg_catalog.pg_proc p
		JOIN pg_catalog.pg_depend d
		  ON d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
		 AND d.objid OPERATOR(pg_catalog.=) p.oid
		 AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
		 AND d.deptype OPERATOR(pg_catalog.=) 'e'::pg_catalog."char"
		JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
		WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'::pg_catalog.name
	LOOP
		EXECUTE pg_catalog.format('REVOKE ALL ON ROUTINE %s FROM PUBLIC', f);
	END LOOP;
END
$$;
