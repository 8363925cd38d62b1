-- The key lifecycle: every outcome of idem_reserve, complete, release,
-- checkpoint, lookup, scope isolation, expiry and replay of a final failure.
\pset null '(null)'
SET idempotency.processing_timeout = '5min';

-- A fresh key is new; the caller owns it in this transaction
BEGIN;
SELECT outcome, http_status, response_status, response, resource_id,
       recovery_point, date_trunc('minute', expires_at - statement_timestamp()) AS ttl
FROM idem_reserve('create-payment', 'k1', '{"amount": 100, "currency": "BRL"}');
-- Reserving again in the same transaction: in_progress, not a second owner
SELECT outcome, http_status FROM idem_reserve('create-payment', 'k1', '{"amount": 100, "currency": "BRL"}');
SELECT idem_complete('create-payment', 'k1', '{"id": "pay_1", "status": "paid"}', 201, 'pay_1');
COMMIT;

-- Retry with the same request: replay of the stored response, nothing else
SELECT outcome, http_status, response_status, response, resource_id, recovery_point
FROM idem_reserve('create-payment', 'k1', '{"amount": 100, "currency": "BRL"}');
-- Key order and whitespace do not change the fingerprint
SELECT outcome FROM idem_reserve('create-payment', 'k1', '{"currency":"BRL",   "amount":100}');
-- Same key, another amount: mismatch, and the stored response is not shown
SELECT outcome, http_status, response_status, response, resource_id
FROM idem_reserve('create-payment', 'k1', '{"amount": 250, "currency": "BRL"}');
-- A request body where none was given before is a different fingerprint too
SELECT outcome, http_status FROM idem_reserve('create-payment', 'k1');
SELECT scope, operation, key, status, response_status, response, resource_id,
       length(request_hash) AS hash_len, ttl
FROM idem_lookup('create-payment', 'k1');

-- No request at all: NULL fingerprint, IS NOT DISTINCT FROM NULL
SELECT outcome FROM idem_reserve('ping', 'n1');
SELECT idem_complete('ping', 'n1');
SELECT outcome, http_status, response FROM idem_reserve('ping', 'n1');
SELECT outcome, http_status FROM idem_reserve('ping', 'n1', '{}');

-- A final business failure (declined card) is completed and replayed like a success
SELECT outcome FROM idem_reserve('create-payment', 'declined', '{"amount": 1}');
SELECT idem_complete('create-payment', 'declined', '{"error": "card_declined"}', 402);
SELECT outcome, http_status, response_status, response
FROM idem_reserve('create-payment', 'declined', '{"amount": 1}');

-- Scopes never see each other's records
SELECT outcome FROM idem_reserve('create-payment', 'k1', '{"amount": 999}', scope => 'account-2');
SELECT scope, status FROM idem_lookup('create-payment', 'k1', 'account-2');
SELECT outcome FROM idem_reserve('create-payment', 'k1', '{"amount": 100, "currency": "BRL"}', scope => 'account-3');
SELECT count(*) FROM idem_keys WHERE key = 'k1';
-- Operations are separate namespaces too
SELECT outcome FROM idem_reserve('refund', 'k1', '{"amount": 100, "currency": "BRL"}');

-- A committed processing record: in_progress while young, stuck when old
SELECT outcome, http_status FROM idem_reserve('create-payment', 'k1', '{"amount": 999}', scope => 'account-2');
UPDATE idem_keys SET updated_at = now() - interval '6 minutes'
WHERE scope = 'account-2' AND key = 'k1';
SELECT outcome, http_status, recovery_point FROM idem_reserve('create-payment', 'k1', '{"amount": 999}', scope => 'account-2');
-- The timeout is a user setting
SET idempotency.processing_timeout = '10min';
SELECT outcome FROM idem_reserve('create-payment', 'k1', '{"amount": 999}', scope => 'account-2');
RESET idempotency.processing_timeout;
-- A checkpoint is a heartbeat and records the recovery point
SELECT idem_checkpoint('create-payment', 'k1', 'gateway-charged:ch_42', 'account-2');
SELECT outcome, http_status, recovery_point FROM idem_reserve('create-payment', 'k1', '{"amount": 999}', scope => 'account-2');
-- A record flagged stuck stays stuck until a checkpoint, completion or release
UPDATE idem_keys SET status = 'stuck' WHERE scope = 'account-2' AND key = 'k1';
SELECT outcome, http_status, recovery_point FROM idem_reserve('create-payment', 'k1', '{"amount": 999}', scope => 'account-2');
SELECT idem_checkpoint('create-payment', 'k1', 'gateway-charged:ch_42;verified', 'account-2');
SELECT status, recovery_point FROM idem_lookup('create-payment', 'k1', 'account-2');
UPDATE idem_keys SET status = 'stuck' WHERE scope = 'account-2' AND key = 'k1';
-- Completing a stuck record (reconciliation found the charge)
SELECT idem_complete('create-payment', 'k1', '{"id": "ch_42"}', 201, 'ch_42', 'account-2');
SELECT outcome, http_status, response, resource_id, recovery_point
FROM idem_reserve('create-payment', 'k1', '{"amount": 999}', scope => 'account-2');

-- Release: a retryable failure frees the key, and a retry runs again
SELECT outcome FROM idem_reserve('create-payment', 'r1', '{"amount": 5}');
SELECT idem_release('create-payment', 'r1');
SELECT idem_release('create-payment', 'r1');
SELECT count(*) FROM idem_lookup('create-payment', 'r1');
SELECT outcome FROM idem_reserve('create-payment', 'r1', '{"amount": 5}');
-- Release inside a rolled-back transaction keeps the record
BEGIN;
SELECT idem_release('create-payment', 'r1');
ROLLBACK;
SELECT status FROM idem_lookup('create-payment', 'r1');

-- Expiry: a completed record past expires_at is gone, even before the sweeper
SELECT outcome, date_trunc('minute', expires_at - now()) AS ttl
FROM idem_reserve('create-payment', 'e1', '{"amount": 7}', ttl => '1 hour');
SELECT idem_complete('create-payment', 'e1', '{"id": "pay_e1"}', 201, 'pay_e1');
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE key = 'e1';
SELECT count(*) FROM idem_lookup('create-payment', 'e1');
SELECT count(*) FROM idem_keys WHERE key = 'e1';
-- Expired records match no fingerprint either: the retry runs again
SELECT outcome, http_status, response, date_trunc('minute', expires_at - now()) AS ttl
FROM idem_reserve('create-payment', 'e1', '{"amount": 8}');
SELECT status, response, resource_id, recovery_point FROM idem_lookup('create-payment', 'e1');
SELECT count(*) FROM idem_keys WHERE key = 'e1';
SELECT idem_complete('create-payment', 'e1', '{"id": "pay_e1b"}', 201);
-- Finishing an expired record is finishing an unknown key
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE key = 'e1';
SELECT idem_complete('create-payment', 'e1', '{}');
SELECT idem_release('create-payment', 'e1');
-- processing records never expire: no new owner while the first may still run
SELECT outcome FROM idem_reserve('create-payment', 'p1', '{"amount": 9}', ttl => '1 hour');
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE key = 'p1';
SELECT outcome, http_status FROM idem_reserve('create-payment', 'p1', '{"amount": 9}');
SELECT count(*) FROM idem_lookup('create-payment', 'p1');
-- A real tiny ttl
SELECT outcome FROM idem_reserve('tiny', 't1', ttl => '10 milliseconds');
SELECT idem_complete('tiny', 't1');
SELECT pg_sleep(0.05);
SELECT outcome FROM idem_reserve('tiny', 't1');
-- Times are clock times of the call and a ttl counts from the completion:
-- a key reserved late in a long transaction and completed later still
-- replays right after the commit (clock_times tests messages, blocks and
-- idem_call handlers)
BEGIN;
SELECT pg_sleep(1.1);
SELECT outcome, date_trunc('second', expires_at - statement_timestamp()) AS ttl
FROM idem_reserve('tiny', 'late-commit', ttl => '1 second');
SELECT created_at - now() >= interval '1.1 seconds' AS created_at_call_time
FROM idem_lookup('tiny', 'late-commit');
SELECT pg_sleep(1.1);
SELECT idem_complete('tiny', 'late-commit');
SELECT expires_at - now() >= interval '3.2 seconds' AS ttl_from_completion
FROM idem_lookup('tiny', 'late-commit');
COMMIT;
SELECT outcome FROM idem_reserve('tiny', 'late-commit');
-- default_ttl applies when ttl is NULL
SET idempotency.default_ttl = '7d';
SELECT outcome, date_trunc('minute', expires_at - now()) AS ttl FROM idem_reserve('tiny', 't2');
RESET idempotency.default_ttl;
-- back to the server's value; the defaults (the server's own values are
-- its operator's)
SELECT name, setting = reset_val AS server_value, boot_val, unit FROM pg_settings
WHERE name IN ('idempotency.default_ttl', 'idempotency.processing_timeout')
ORDER BY name;

-- Errors for finishing keys
SELECT idem_complete('create-payment', 'nope', '{}');
SELECT idem_checkpoint('create-payment', 'nope', 'x');
SELECT idem_complete('create-payment', 'k1', '{}');
SELECT idem_release('create-payment', 'k1');
SELECT idem_checkpoint('create-payment', 'k1', 'x');
SELECT idem_complete('create-payment', 'r1', '{}', NULL);
SELECT idem_complete('create-payment', 'r1', '{}', 99);
SELECT idem_complete('create-payment', 'r1', '{}', 600);
-- ... and the record is untouched by those errors
SELECT status, response FROM idem_lookup('create-payment', 'r1');

-- A transaction may reserve any number of keys: the key lock is held only
-- around each write, and to the end of the transaction only by the first
-- 16 (held reservations, written once), so the lock table does not fill up
BEGIN;
SELECT count(*) FILTER (WHERE outcome = 'new') AS new_keys
FROM generate_series(1, 20000) i, idem_reserve('batch', 'b-' || i);
SELECT count(*) AS locks_held FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 26980;
SELECT count(*) FILTER (WHERE outcome = 'in_progress') AS again_in_progress
FROM generate_series(1, 20000) i, idem_reserve('batch', 'b-' || i);
COMMIT;
-- ... and complete them in one transaction: pages fill, updates stop being HOT
SELECT count(idem_complete('batch', 'b-' || i, jsonb_build_object('n', i))) AS completed
FROM generate_series(1, 20000) i;
SELECT count(*) FILTER (WHERE outcome = 'replay' AND response = jsonb_build_object('n', i)) AS replays
FROM generate_series(1, 20000) i, idem_reserve('batch', 'b-' || i);
SELECT count(*) AS index_entries_match FROM idem_keys WHERE operation = 'batch' AND key LIKE 'b-%';

-- A replay shows the key's current record whatever happened to the table:
-- changed by SQL, deleted and refilled, vacuumed away or truncated.
DELETE FROM idem_keys;
VACUUM idem_keys;
SELECT outcome FROM idem_reserve('place', 'p1', '{"a": 1}');
SELECT idem_complete('place', 'p1', '{"n": 1}');
SELECT outcome, response FROM idem_reserve('place', 'p1', '{"a": 1}');
-- Changed by SQL: the new version is replayed
UPDATE idem_keys SET response = '{"n": "by hand"}' WHERE operation = 'place' AND key = 'p1';
SELECT outcome, response FROM idem_reserve('place', 'p1', '{"a": 1}');
-- Deleted, then rows of other keys fill the pages: p1 is absent, and
-- each other key replays its own record
DELETE FROM idem_keys WHERE operation = 'place';
VACUUM idem_keys;
INSERT INTO idem_keys (operation, scope, key, request_hash, status, response_status, response, expires_at)
SELECT 'place', '', 'other-' || i, idem_hash('{"a": 1}'), 'completed', 200,
       jsonb_build_object('other', i), now() + interval '1 hour'
FROM generate_series(1, 5) i;
BEGIN;
SELECT outcome FROM idem_reserve('place', 'p1', '{"a": 1}');
ROLLBACK;
SELECT 'other-' || i AS key, outcome, response
FROM generate_series(1, 5) i, LATERAL idem_reserve('place', 'other-' || i, '{"a": 1}');
-- The table truncated to nothing by VACUUM, or by TRUNCATE
DELETE FROM idem_keys WHERE operation = 'place';
VACUUM idem_keys;
SELECT pg_relation_size('idem_keys') AS heap_bytes;
SELECT outcome FROM idem_reserve('place', 'other-1', '{"a": 1}');
SELECT idem_complete('place', 'other-1', '{"n": "after vacuum"}');
SELECT outcome, response FROM idem_reserve('place', 'other-1', '{"a": 1}');
TRUNCATE idem_keys;
SELECT outcome FROM idem_reserve('place', 'other-1', '{"a": 1}');
SELECT idem_complete('place', 'other-1', '{"n": "after truncate"}');
SELECT outcome, response FROM idem_reserve('place', 'other-1', '{"a": 1}');
CREATE EXTENSION amcheck;
SELECT bt_index_check(indexrelid, true) FROM pg_index WHERE indrelid = 'idem_keys'::regclass;
DROP EXTENSION amcheck;

-- A record completed after its expires_at (a stuck one reconciled late)
-- gets its full ttl from its completion instead of vanishing at once
SELECT outcome FROM idem_reserve('late', 'l1', ttl => '1 hour');
UPDATE idem_keys SET created_at = now() - interval '3 hours',
                     expires_at = now() - interval '2 hours' WHERE key = 'l1';
SELECT idem_complete('late', 'l1', '{"ok": true}');
SELECT outcome, expires_at - now() BETWEEN interval '59 minutes' AND interval '1 hour' AS full_ttl_again
FROM idem_reserve('late', 'l1');

-- A read-only transaction (or a standby) can replay but not reserve
BEGIN READ ONLY;
SELECT outcome FROM idem_reserve('late', 'l1');
SELECT outcome FROM idem_reserve('late', 'l2');
ROLLBACK;

-- An altered idem_keys is refused rather than misread
BEGIN;
ALTER TABLE idem_keys ADD COLUMN extra int;
SELECT outcome FROM idem_reserve('late', 'l3');
ROLLBACK;
SELECT outcome FROM idem_reserve('late', 'l3');

-- Finishing a key reserved earlier in the same transaction finds the row
-- the last write left, through savepoints and changes by hand.
-- Checkpoints move the row, and completion finds it where the last one left it
BEGIN;
SELECT outcome FROM idem_reserve('same-xact', 't1');
SELECT idem_checkpoint('same-xact', 't1', 'step-1');
SELECT idem_checkpoint('same-xact', 't1', 'step-2');
SELECT idem_complete('same-xact', 't1', '{"n": 1}');
SAVEPOINT c;
SELECT idem_checkpoint('same-xact', 't1', 'step-3');
ROLLBACK TO SAVEPOINT c;
COMMIT;
SELECT status, recovery_point, response FROM idem_lookup('same-xact', 't1');
-- A reservation rolled back to a savepoint is gone
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idem_reserve('same-xact', 't2');
ROLLBACK TO SAVEPOINT s;
SAVEPOINT e;
SELECT idem_complete('same-xact', 't2', '{"n": 2}');
ROLLBACK TO SAVEPOINT e;
SELECT outcome FROM idem_reserve('same-xact', 't2');
SELECT idem_complete('same-xact', 't2', '{"n": 2}');
COMMIT;
-- Two keys reserved, the first completed: each keeps its own result
BEGIN;
SELECT outcome FROM idem_reserve('same-xact', 't3');
SELECT outcome FROM idem_reserve('same-xact', 't4');
SELECT idem_complete('same-xact', 't3', '{"n": 3}');
SELECT idem_complete('same-xact', 't4', '{"n": 4}');
COMMIT;
-- Released, then completed: not reserved any more
BEGIN;
SELECT outcome FROM idem_reserve('same-xact', 't5');
SELECT idem_release('same-xact', 't5');
SELECT idem_complete('same-xact', 't5', '{"n": 5}');
ROLLBACK;
-- Changed by SQL in between: completion updates the row's new version (the
-- checkpoint writes the held reservation, which SQL would not see before)
BEGIN;
SELECT outcome FROM idem_reserve('same-xact', 't6');
SELECT idem_checkpoint('same-xact', 't6', 'step-1');
UPDATE idem_keys SET recovery_point = 'by hand' WHERE operation = 'same-xact' AND key = 't6';
SELECT idem_complete('same-xact', 't6', '{"n": 6}');
COMMIT;
-- Emptied by TRUNCATE in between: not reserved any more (once written; a
-- held reservation is not in the table, see write_once)
BEGIN;
SELECT outcome FROM idem_reserve('same-xact-truncated', 't7');
SELECT idem_checkpoint('same-xact-truncated', 't7', 'step-1');
TRUNCATE idem_keys;
SELECT idem_complete('same-xact-truncated', 't7', '{"n": 7}');
ROLLBACK;
SELECT key, status, recovery_point, response FROM idem_keys
WHERE operation = 'same-xact' ORDER BY key;
CREATE EXTENSION amcheck;
SELECT bt_index_check(indexrelid, true) FROM pg_index WHERE indrelid = 'idem_keys'::regclass;
DROP EXTENSION amcheck;

-- leave nothing behind for the next test
DELETE FROM idem_keys;
