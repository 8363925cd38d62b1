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
