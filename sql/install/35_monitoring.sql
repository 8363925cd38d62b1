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
	OUT batches bigint,
	OUT longest_batch interval,
	OUT stopped_early boolean,
	OUT total_deleted bigint,
	OUT total_flagged bigint,
	OUT total_reconciled bigint,
	OUT total_failed bigint,
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
	s.batches,
	s.longest_batch,
	s.stopped_early,
	s.total_deleted,
	s.total_flagged,
	s.total_reconciled,
	s.total_failed,
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

-- What the maintenance has not done yet, for alerts: completed records past
-- expires_at that are not deleted yet (the sweeper's backlog), and the
-- records of idem_stuck.  Read with the view owner's rights, so a
-- monitoring role needs no access to idem_keys itself.
CREATE VIEW @extschema@.idem_backlog AS
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
