-- Statistics: idem_stats counts every outcome of idem_reserve, completions
-- and releases exactly; idem_stats_reset() starts them again; reading needs
-- pg_read_all_stats, resetting needs the owner.  Operations here start with
-- "st-" so that counts of other tests in this database do not matter.

-- Needs the library preloaded (shared_preload_libraries): against a stock
-- server this test skips itself (expected/stats_1.out)
SELECT pg_catalog.current_setting('shared_preload_libraries')
	!~ '(^|[\s,"])idempotency($|[\s,"])' AS skip_test \gset
\if :skip_test
\echo skipped: the server does not preload idempotency (shared_preload_libraries)
\quit
\endif
\pset null '(null)'

-- A key reserved before the reset, completed after it
SELECT outcome FROM idem_reserve('st-late', 'l1');
SELECT idem_stats_reset();
SELECT count(*) AS rows_after_reset FROM idem_stats;
SELECT idem_complete('st-late', 'l1');

-- Two new keys, both completed
SELECT outcome FROM idem_reserve('st-pay', 'k1', '{"amount": 1}');
SELECT idem_complete('st-pay', 'k1', '{"id": 1}', 201);
SELECT outcome FROM idem_reserve('st-pay', 'k2', '{"amount": 2}');
SELECT idem_complete('st-pay', 'k2', '{"id": 2}', 201);
-- Two replays and a mismatch
SELECT outcome FROM idem_reserve('st-pay', 'k1', '{"amount": 1}');
SELECT outcome FROM idem_reserve('st-pay', 'k2', '{"amount": 2}');
SELECT outcome FROM idem_reserve('st-pay', 'k1', '{"amount": 99}');
-- A new key, reserved again in the same transaction: in_progress
BEGIN;
SELECT outcome FROM idem_reserve('st-pay', 'k3');
SELECT outcome FROM idem_reserve('st-pay', 'k3');
COMMIT;
-- A young committed processing record: in_progress
SELECT outcome FROM idem_reserve('st-pay', 'k3');
-- Older than this session's processing_timeout: stuck
SET idempotency.processing_timeout = '1ms';
SELECT pg_sleep(0.01);
SELECT outcome FROM idem_reserve('st-pay', 'k3');
RESET idempotency.processing_timeout;
-- A release counts; releasing nothing does not
SELECT idem_release('st-pay', 'k3');
SELECT idem_release('st-pay', 'k3');
-- A call is counted when it returns, even if its transaction rolls back
BEGIN;
SELECT outcome FROM idem_reserve('st-pay', 'k4');
ROLLBACK;
-- Calls that fail are not counted
SELECT idem_complete('st-pay', 'nope');
SELECT outcome FROM idem_reserve('st-pay', '');
-- With track_stats off nothing is counted
SET idempotency.track_stats = off;
SELECT outcome FROM idem_reserve('st-pay', 'k1', '{"amount": 1}');
SELECT outcome FROM idem_reserve('st-off', 'o1');
SELECT idem_complete('st-off', 'o1');
RESET idempotency.track_stats;
-- A second operation
SELECT outcome FROM idem_reserve('st-ship', 's1');
SELECT outcome FROM idem_reserve('st-ship', 's1');
SELECT idem_complete('st-ship', 's1');
SELECT outcome FROM idem_reserve('st-ship', 's1');

-- st-pay: reserves 10 = new 4 (k1 k2 k3 k4) + replays 2 + in_progress 2 +
-- mismatches 1 + stuck 1; completes 2, releases 1; rate (2+2+1)/10.
-- st-ship: 3 reserves, 1 new, 1 in_progress, 1 replay.  st-late: a
-- completion and no reservation, so no rate.  st-off: not counted.
SELECT operation, reserves, new, replays, in_progress, mismatches, stuck,
       completes, releases, consumed, duplicates, expired, flagged_stuck,
       collision_rate
FROM idem_stats WHERE operation LIKE 'st-%' ORDER BY operation;
SELECT count(*) FILTER (WHERE stats_reset <= pg_catalog.clock_timestamp()
                          AND stats_reset > now() - interval '1 hour') AS recent
FROM idem_stats WHERE operation LIKE 'st-%';
-- The counters agree with the records left behind
SELECT operation, count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) AS records
FROM idem_keys WHERE operation LIKE 'st-%' AND operation <> 'st-off'
GROUP BY operation ORDER BY operation;

-- Reset removes the rows; the next call starts a fresh row
SELECT stats_reset AS old_reset FROM idem_stats WHERE operation = 'st-pay' \gset
SELECT idem_stats_reset();
SELECT count(*) AS rows_after_reset FROM idem_stats;
SELECT outcome FROM idem_reserve('st-pay', 'k1', '{"amount": 1}');
SELECT operation, reserves, new, replays, collision_rate, stats_reset > :'old_reset' AS newer
FROM idem_stats WHERE operation LIKE 'st-%';

-- Permissions: a role granted nothing can neither read nor reset nor turn
-- counting off; a member of pg_read_all_stats can read, not reset.
CREATE ROLE regress_stats_nobody;
CREATE ROLE regress_stats_monitor IN ROLE pg_read_all_stats;
SET ROLE regress_stats_nobody;
SELECT count(*) FROM idem_stats;
SELECT count(*) FROM idem_stats();
SELECT idem_stats_reset();
SET idempotency.track_stats = off;
RESET ROLE;
SET ROLE regress_stats_monitor;
SELECT operation, reserves FROM idem_stats WHERE operation LIKE 'st-%';
SELECT idem_stats_reset();
RESET ROLE;
DROP ROLE regress_stats_nobody;
DROP ROLE regress_stats_monitor;
