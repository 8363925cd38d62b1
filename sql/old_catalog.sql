-- This library against the catalog of the previous release (0.2.0), before
-- ALTER EXTENSION UPDATE: it serves that catalog as it is, every function
-- of 0.2.0 works on it (a package upgrade is no outage), and after the
-- update the records keep their meaning.  Only a catalog older than the
-- previous release (0.1.0) gets a clean 55000 whose hint is to update it,
-- never a crash.
\pset null '(null)'
SELECT current_database() AS regress_db \gset
CREATE DATABASE regress_idem_old_catalog;
\c regress_idem_old_catalog
-- its reconciler runs as the superuser running the test
SET idempotency.enable_superuser_reconcilers = on;
CREATE EXTENSION idempotency VERSION '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
-- records as 0.2.0 wrote them: completed, and processing
INSERT INTO idem_keys (scope, operation, key, request_hash, status, response_status,
					   response, created_at, expires_at, ttl)
VALUES ('', 'old', 'done', idem_hash('{"a": 1}'), 'completed', 201, '{"id": 1}',
		now(), now() + interval '1 day', interval '1 day'),
	   ('', 'old', 'open', NULL, 'processing', NULL, NULL,
		now(), now() + interval '2 days', interval '2 days'),
	   ('', 'old', 'open2', NULL, 'processing', NULL, NULL,
		now(), now() + interval '2 days', interval '2 days');
CREATE FUNCTION rules_echo(request jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT request';

-- Every function of 0.2.0 on its catalog
SELECT outcome, http_status, response FROM idem_reserve('old', 'done', '{"a": 1}');
SELECT outcome FROM idem_reserve('old', 'done', '{"a": 2}');
SELECT outcome FROM idem_reserve('old', 'open');
BEGIN;
SELECT outcome FROM idem_reserve('old', 'new', '{"b": 2}', ttl => '3 hours');
-- (held, not written yet: the record as it will be)
SELECT key, status, ttl FROM idem_lookup('old', 'new');
SELECT idem_checkpoint('old', 'new', 'step-1');
SELECT idem_complete('old', 'new', '{"id": 3}', 201, 'r-3');
SELECT status, response, recovery_point, expires_at - updated_at AS ttl
FROM idem_lookup('old', 'new');
COMMIT;
SELECT outcome, response, resource_id FROM idem_reserve('old', 'new', '{"b": 2}');
BEGIN;
SELECT outcome FROM idem_reserve('old', 'gone');
SELECT idem_release('old', 'gone');
COMMIT;
SELECT count(*) AS released FROM idem_lookup('old', 'gone');
SELECT idem_consume('old-consumer', 'm1') AS first, idem_consume('old-consumer', 'm1') AS again;
SELECT idem_call('old', 'c1', '{"x": 1}', 'rules_echo(jsonb)');
SELECT idem_call('old', 'c1', '{"x": 1}', 'rules_echo(jsonb)');
CREATE FUNCTION old_reconciler(r idem_keys) RETURNS void LANGUAGE plpgsql
SET search_path = public AS $$
BEGIN
	PERFORM idem_complete(r.operation, r.key, '{"by": "reconciler"}', 200, NULL, r.scope);
END
$$;
SELECT idem_set_reconciler('old', 'old_reconciler(idem_keys)');
SELECT operation, handler FROM idem_reconcilers;
-- in one transaction, so that a running worker never sees the record stuck
-- and reconciles it first
BEGIN;
UPDATE idem_keys SET status = 'stuck' WHERE key = 'open';
SELECT key, flagged FROM idem_stuck;
SELECT idem_sweep() AS swept, idem_flag_stuck() AS flagged, idem_reconcile() AS reconciled;
COMMIT;
CALL idem_maintain();
SELECT outcome, response FROM idem_reserve('old', 'open');
SELECT idem_canonical('{"b": 1, "a": 2}'), length(idem_hash('{}')) AS hash_len;
SELECT key, status FROM idem_keys ORDER BY scope, key;

-- 0.2.0 declared idem_lookup PARALLEL SAFE, but a parallel worker does not
-- see the reservations its leader holds: there it refuses to answer, with
-- the hint to update, rather than say a held key has no record
SELECT proparallel FROM pg_proc WHERE proname = 'idem_lookup';
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
	THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'on', false) AS parallel;
BEGIN;
SELECT outcome FROM idem_reserve('old', 'held-parallel');
SELECT key, status FROM idem_lookup('old', 'held-parallel');
ROLLBACK;
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
	THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'off', false) AS parallel;

ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT proparallel FROM pg_proc WHERE proname = 'idem_lookup';
-- a completed key still replays, a processing one is still in progress and
-- completes with the ttl it was reserved with
SELECT outcome, response FROM idem_reserve('old', 'done', '{"a": 1}');
SELECT outcome FROM idem_reserve('old', 'open2');
SELECT key, status, ttl FROM idem_keys ORDER BY key;
SELECT idem_complete('old', 'open2', '{"id": 2}');
SELECT expires_at - now() BETWEEN interval '47 hours' AND interval '48 hours' AS ttl_from_completion
FROM idem_lookup('old', 'open2');

-- A catalog older than the previous release (0.1.0, which has no column
-- ttl) is refused with the hint to update, by every function
DROP EXTENSION idempotency CASCADE;
CREATE EXTENSION idempotency VERSION '0.1.0';
SELECT outcome FROM idem_reserve('old', 'done', '{"a": 1}');
SELECT idem_sweep();
ALTER EXTENSION idempotency UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT outcome FROM idem_reserve('old', 'done', '{"a": 1}');

\c :regress_db
DROP DATABASE regress_idem_old_catalog;
