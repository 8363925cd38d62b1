-- This library against the catalog of an earlier release, before ALTER
-- EXTENSION UPDATE: every function that touches idem_keys raises a clean
-- 55000 whose hint is to update the catalog, never a crash; after the
-- update the records keep their meaning.
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
		now(), now() + interval '2 days');
SELECT outcome FROM idem_reserve('old', 'done', '{"a": 1}');
CREATE FUNCTION rules_echo(request jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT request';
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE q;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;
SELECT c AS call, pg_temp.try('SELECT ' || c) AS result FROM unnest(ARRAY[
	'idem_reserve(''old'', ''done'', ''{"a": 1}'')',
	'idem_complete(''old'', ''open'', ''{}'')',
	'idem_checkpoint(''old'', ''open'', ''x'')',
	'idem_release(''old'', ''open'')',
	'idem_lookup(''old'', ''done'')',
	'idem_consume(''old'', ''m1'')',
	'idem_call(''old'', ''c1'', ''{}'', ''rules_echo(jsonb)'')',
	'idem_sweep()',
	'idem_flag_stuck()',
	'idem_reconcile()']) c;
SELECT count(*) AS records FROM idem_keys;

ALTER EXTENSION idempotency UPDATE;
-- a completed key still replays, a processing one is still in progress and
-- kept the ttl it was reserved with, which its completion counts from (the
-- update writes no row: its ttl stays NULL, and the library counts
-- expires_at - created_at)
SELECT outcome, response FROM idem_reserve('old', 'done', '{"a": 1}');
SELECT outcome FROM idem_reserve('old', 'open');
SELECT key, status, ttl FROM idem_keys ORDER BY key;
SELECT idem_complete('old', 'open', '{"id": 2}');
SELECT expires_at - now() BETWEEN interval '47 hours' AND interval '48 hours' AS ttl_from_completion
FROM idem_lookup('old', 'open');

\c :regress_db
DROP DATABASE regress_idem_old_catalog;
