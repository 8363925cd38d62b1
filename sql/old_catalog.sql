-- This library against the catalog of the previous release (0.1.0), before
-- ALTER EXTENSION UPDATE: it serves that catalog as it is, every function
-- of 0.1.0 works on it (a package upgrade is no outage), and after the
-- update the records keep their meaning.  Only a catalog older than the
-- previous release gets a clean 55000 whose hint is to update it, never a
-- crash.
\pset null '(null)'
SELECT current_database() AS regress_db \gset
CREATE DATABASE regress_idem_old_catalog;
\c regress_idem_old_catalog
CREATE EXTENSION idempotency VERSION '0.1.0';
-- records as 0.1.0 wrote them: completed, and processing
INSERT INTO idem_keys (scope, operation, key, request_hash, status, response_status,
					   response, created_at, expires_at)
VALUES ('', 'old', 'done', idem_hash('{"a": 1}'), 'completed', 201, '{"id": 1}',
		now(), now() + interval '1 day'),
	   ('', 'old', 'open', NULL, 'processing', NULL, NULL,
		now(), now() + interval '2 days'),
	   ('', 'old', 'open2', NULL, 'processing', NULL, NULL,
		now(), now() + interval '2 days');
CREATE FUNCTION rules_echo(request jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT request';

-- Every function of 0.1.0 on its catalog, which has no column ttl: the ttl
-- of a record is then expires_at - created_at, as 0.1.0 counted it
SELECT outcome, http_status, response FROM idem_reserve('old', 'done', '{"a": 1}');
SELECT outcome FROM idem_reserve('old', 'done', '{"a": 2}');
SELECT outcome FROM idem_reserve('old', 'open');
BEGIN;
SELECT outcome FROM idem_reserve('old', 'new', '{"b": 2}', ttl => '3 hours');
-- (held, not written yet: the record as it will be, without a ttl column)
SELECT key, status FROM idem_lookup('old', 'new');
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
UPDATE idem_keys SET status = 'stuck' WHERE key = 'open';
SELECT key, flagged FROM idem_stuck;
SELECT idem_sweep() AS swept, idem_flag_stuck() AS flagged, idem_reconcile() AS reconciled;
CALL idem_maintain();
SELECT outcome, response FROM idem_reserve('old', 'open');
SELECT idem_canonical('{"b": 1, "a": 2}'), length(idem_hash('{}')) AS hash_len;
SELECT key, status FROM idem_keys ORDER BY scope, key;

-- idem_reserve forms its row by position: a row type changed under it
-- (0.1.0 returns the type idem_reservation) is refused, called in FROM or
-- in a select list, never read past its columns
BEGIN;
ALTER TYPE idem_reservation ADD ATTRIBUTE extra integer;
SAVEPOINT s;
SELECT outcome FROM idem_reserve('old', 'done', '{"a": 1}');
ROLLBACK TO s;
SELECT idem_reserve('old', 'done', '{"a": 1}');
ROLLBACK;
SELECT outcome FROM idem_reserve('old', 'done', '{"a": 1}');

-- A catalog older than the previous release (none was released before
-- 0.1.0: this one pretends to be older) is refused with the hint to update
UPDATE pg_extension SET extversion = '0.0.9' WHERE extname = 'idempotency';
\c regress_idem_old_catalog
SELECT outcome FROM idem_reserve('old', 'done', '{"a": 1}');
SELECT idem_sweep();
UPDATE pg_extension SET extversion = '0.1.0' WHERE extname = 'idempotency';
\c regress_idem_old_catalog
SELECT count(*) AS records FROM idem_keys;

ALTER EXTENSION idempotency UPDATE;
-- a completed key still replays, a processing one is still in progress and
-- kept the ttl it was reserved with, which its completion counts from (the
-- update writes no row: its ttl stays NULL, and the library counts
-- expires_at - created_at)
SELECT outcome, response FROM idem_reserve('old', 'done', '{"a": 1}');
SELECT outcome FROM idem_reserve('old', 'open2');
SELECT key, status, ttl FROM idem_keys ORDER BY key;
SELECT idem_complete('old', 'open2', '{"id": 2}');
SELECT expires_at - now() BETWEEN interval '47 hours' AND interval '48 hours' AS ttl_from_completion
FROM idem_lookup('old', 'open2');
-- the step of the README's "Upgrading" that the update leaves out
CREATE INDEX CONCURRENTLY idem_keys_processing_idx ON idem_keys (created_at)
	WHERE status = 'processing';

\c :regress_db
DROP DATABASE regress_idem_old_catalog;
