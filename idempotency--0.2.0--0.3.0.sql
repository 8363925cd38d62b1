-- idempotency 0.2.0 -> 0.3.0: run by ALTER EXTENSION idempotency UPDATE.
--
-- Every catalog change of release 0.3.0 goes here, and the same change goes
-- into idempotency.sql, so that a database updated from 0.2.0 and one
-- created at 0.3.0 hold the same objects (test/t/050_upgrade.pl checks
-- both).  Records and reconcilers stay as they are, with their meaning.

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.3.0'" to load this file. \quit

-- idem_lookup answers about the reservations this transaction holds, which
-- live in the backend's memory: it never runs in a parallel worker.  (A
-- catalog change only: no lock on idem_keys.)
ALTER FUNCTION @extschema@.idem_lookup(text, text, text) PARALLEL RESTRICTED;

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
REVOKE ALL ON FUNCTION @extschema@.idem_reconciler_status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.idem_reconciler_status() TO pg_read_all_stats;
