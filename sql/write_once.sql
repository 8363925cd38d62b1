-- One write per request: a reservation of a new key is held (the key lock
-- kept to the end of the transaction, nothing written) and its record is
-- written once: completed by idem_complete, or processing when the
-- transaction commits or prepares, or before idem_checkpoint and
-- idem_release.  Savepoints forget what they held and undo what they wrote.
-- A table with rules of its owner (a trigger, a CHECK, an index) is written
-- at once.
\pset null '(null)'
DELETE FROM idem_keys;
-- updates of idem_keys so far in this backend, flushed or not
CREATE FUNCTION wo_updates() RETURNS bigint LANGUAGE sql AS $$
	SELECT coalesce((SELECT n_tup_upd FROM pg_stat_xact_user_tables
					 WHERE relid = 'idem_keys'::regclass), 0)
$$;

-- reserve and complete in one transaction: one insert, no update
BEGIN;
SELECT wo_updates() AS before \gset
SELECT outcome FROM idem_reserve('wo', 'k1', '{"a": 1}');
-- nothing written yet; idem_lookup shows the record as it will be
SELECT count(*) AS rows_written FROM idem_keys WHERE key = 'k1';
SELECT key, status, request_hash IS NOT NULL AS has_hash, ttl FROM idem_lookup('wo', 'k1');
-- this transaction holds it: in_progress, or mismatch for another request
SELECT outcome FROM idem_reserve('wo', 'k1', '{"a": 1}');
SELECT outcome FROM idem_reserve('wo', 'k1', '{"a": 2}');
SELECT idem_complete('wo', 'k1', '{"id": 1}', 201, 'r1');
SELECT wo_updates() - :before AS updates;
SELECT outcome, response FROM idem_reserve('wo', 'k1', '{"a": 1}');
COMMIT;
SELECT key, status, response_status, response, resource_id,
	   expires_at > updated_at AS expires_later FROM idem_keys WHERE key = 'k1';

-- a reservation committed without completion is written at commit
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'k2', '{"a": 2}', ttl => '1h');
COMMIT;
SELECT key, status, ttl, expires_at = created_at + ttl AS expires_as_reserved
FROM idem_keys WHERE key = 'k2';
SELECT outcome FROM idem_reserve('wo', 'k2', '{"a": 2}');
SELECT idem_complete('wo', 'k2', '{"id": 2}');
SELECT status FROM idem_keys WHERE key = 'k2';

-- a savepoint rolled back forgets its reservation (and its key lock)
BEGIN;
SAVEPOINT s1;
SELECT outcome FROM idem_reserve('wo', 'k3');
ROLLBACK TO s1;
SELECT count(*) AS locks_kept FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 26980 AND pid = pg_backend_pid();
SELECT outcome FROM idem_reserve('wo', 'k3');
-- ... and undoes a completion: the reservation is held again
SAVEPOINT s2;
SELECT idem_complete('wo', 'k3', '{"id": 3}');
ROLLBACK TO s2;
SELECT key, status FROM idem_lookup('wo', 'k3');
-- a savepoint released hands both to the transaction
SAVEPOINT s3;
SELECT outcome FROM idem_reserve('wo', 'k4');
RELEASE s3;
COMMIT;
SELECT key, status FROM idem_keys WHERE key IN ('k3', 'k4') ORDER BY key;

-- a completion in a savepoint that is released stays
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'k5');
SAVEPOINT s1;
SELECT idem_complete('wo', 'k5', '{"id": 5}');
RELEASE s1;
COMMIT;
SELECT key, status, response FROM idem_keys WHERE key = 'k5';

-- an error after the reservation takes it with the transaction
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'k6');
SELECT 1 / 0;
ROLLBACK;
SELECT count(*) AS k6_rows FROM idem_keys WHERE key = 'k6';
SELECT outcome FROM idem_reserve('wo', 'k6');

-- idem_checkpoint and idem_release of a held reservation write it first
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'k7');
SELECT idem_checkpoint('wo', 'k7', 'step-1');
SELECT key, status, recovery_point FROM idem_keys WHERE key = 'k7';
SELECT idem_complete('wo', 'k7', '{"id": 7}');
SELECT outcome FROM idem_reserve('wo', 'k8');
SELECT idem_release('wo', 'k8');
SELECT outcome FROM idem_reserve('wo', 'k8');
COMMIT;
SELECT key, status, recovery_point FROM idem_keys WHERE key IN ('k7', 'k8') ORDER BY key;

-- SQL on idem_keys in the reserving transaction does not see a held
-- reservation, which is not in the table yet; but DDL does (TRUNCATE here,
-- sql/held.sql for the others): it finds the record written first, as an
-- immediate write, so TRUNCATE empties the table of it too and there is
-- nothing left to complete
BEGIN;
SELECT outcome FROM idem_reserve('wo', 'k9');
UPDATE idem_keys SET recovery_point = 'by hand' WHERE key = 'k9';
TRUNCATE idem_keys;
SELECT idem_complete('wo', 'k9', '{"id": 9}');
ROLLBACK;

-- idem_call writes its record once
CREATE FUNCTION wo_handler(request jsonb) RETURNS jsonb LANGUAGE sql
AS $$ SELECT request || '{"done": true}' $$;
BEGIN;
SELECT wo_updates() AS before \gset
SELECT idem_call('wo-call', 'c1', '{"a": 1}', 'wo_handler(jsonb)');
SELECT wo_updates() - :before AS updates;
COMMIT;
SELECT idem_call('wo-call', 'c1', '{"a": 1}', 'wo_handler(jsonb)');

-- many keys in one transaction: the first ones are held, the others
-- written at once, so the key locks kept stay few
BEGIN;
SELECT count(*) FROM (SELECT idem_reserve('wo-bulk', 'b' || i) FROM generate_series(1, 100) i) s;
SELECT count(*) AS key_locks FROM pg_locks
WHERE locktype = 'advisory' AND objsubid = 26980 AND pid = pg_backend_pid();
SELECT count(*) AS written_at_once FROM idem_keys WHERE operation = 'wo-bulk';
SELECT count(*) FROM (SELECT idem_complete('wo-bulk', 'b' || i) FROM generate_series(1, 100) i) s;
COMMIT;
SELECT status, count(*) FROM idem_keys WHERE operation = 'wo-bulk' GROUP BY status;

-- a table with a trigger of its owner is written at once, as always: the
-- trigger sees the processing insert and then the completion
CREATE FUNCTION wo_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE NOTICE '% of % to %', TG_OP, NEW.key, NEW.status;
	RETURN NEW;
END
$$;
CREATE TRIGGER wo_seen BEFORE INSERT OR UPDATE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION wo_seen();
BEGIN;
SELECT outcome FROM idem_reserve('wo', 't1');
SELECT idem_complete('wo', 't1', '{"id": 1}');
COMMIT;
DROP TRIGGER wo_seen ON idem_keys;

-- ... and a CHECK of its owner refuses the reservation itself
ALTER TABLE idem_keys ADD CONSTRAINT wo_short_keys CHECK (length(key) < 10);
\set VERBOSITY terse
SELECT outcome FROM idem_reserve('wo', 'a-key-too-long');
\set VERBOSITY default
BEGIN;
SELECT outcome FROM idem_reserve('wo', 't2');
SELECT count(*) AS written_at_once FROM idem_keys WHERE key = 't2';
COMMIT;
ALTER TABLE idem_keys DROP CONSTRAINT wo_short_keys;

-- ... and so does an index of its owner
CREATE INDEX wo_resource_idx ON idem_keys (resource_id);
BEGIN;
SELECT outcome FROM idem_reserve('wo', 't3');
SELECT count(*) AS written_at_once FROM idem_keys WHERE key = 't3';
COMMIT;
DROP INDEX wo_resource_idx;

-- a read-only transaction cannot hold a reservation either
BEGIN READ ONLY;
SELECT outcome FROM idem_reserve('wo', 'ro1');
ROLLBACK;

DROP FUNCTION wo_handler(jsonb);
DROP FUNCTION wo_seen();
DROP FUNCTION wo_updates();
DELETE FROM idem_keys;
