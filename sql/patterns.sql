-- idem_call and idem_consume: every outcome and error, handler validation,
-- privileges, and what is kept when a handler fails.  Effects are counted in
-- the database.

-- Needs the library preloaded (shared_preload_libraries): against a stock
-- server this test skips itself (expected/patterns_1.out)
SELECT pg_catalog.current_setting('shared_preload_libraries')
	!~ '(^|[\s,"])idempotency($|[\s,"])' AS skip_test \gset
\if :skip_test
\echo skipped: the server does not preload idempotency (shared_preload_libraries)
\quit
\endif
\pset null '(null)'
SET idempotency.processing_timeout = '5min';

CREATE TABLE pat_payments (
	id			serial PRIMARY KEY,
	order_id	text NOT NULL,
	amount		int NOT NULL,
	-- (the bootstrap superuser, whatever its name, as "superuser")
	created_by	name NOT NULL DEFAULT CASE WHEN current_user = session_user
		THEN 'superuser' ELSE current_user END
);
CREATE TABLE pat_switch (fail boolean NOT NULL);
INSERT INTO pat_switch VALUES (false);

-- The handler: one payment row per call; refuses non-positive amounts and
-- fails while pat_switch says so (a transient failure)
CREATE FUNCTION pat_pay(request jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	new_id int;
BEGIN
	IF (request->>'amount')::int <= 0 THEN
		RAISE EXCEPTION 'amount must be positive' USING ERRCODE = '22003';
	END IF;
	IF (SELECT fail FROM pat_switch) THEN
		RAISE EXCEPTION 'payment service unavailable' USING ERRCODE = '57P03';
	END IF;
	INSERT INTO pat_payments (order_id, amount)
	VALUES (request->>'order', (request->>'amount')::int)
	RETURNING id INTO new_id;
	RETURN jsonb_build_object('payment', new_id, 'amount', request->'amount',
							  'by', CASE WHEN current_user = session_user
								THEN 'superuser' ELSE current_user END);
END
$$;

-- Two more handlers, in SQL: one echoes, one answers NULL
CREATE FUNCTION pat_echo(request jsonb) RETURNS jsonb
LANGUAGE sql AS $$ SELECT jsonb_build_object('echo', request) $$;
CREATE FUNCTION pat_null(request jsonb) RETURNS jsonb
LANGUAGE sql AS $$ SELECT NULL::jsonb $$;
CREATE FUNCTION pat_echo_strict(request jsonb) RETURNS jsonb
LANGUAGE sql STRICT AS $$ SELECT jsonb_build_object('echo', request) $$;

--
-- idem_call: outcomes
--

-- new: the handler runs once and its result is completed with status 200
SELECT idem_call('pat-pay', 'c1', '{"order": "o1", "amount": 100}', 'pat_pay(jsonb)');
SELECT count(*) FROM pat_payments;
SELECT scope, operation, key, status, response_status, response, resource_id,
       length(request_hash) AS hash_len
FROM idem_lookup('pat-pay', 'c1');
-- replay: the stored response, the handler does not run again
SELECT idem_call('pat-pay', 'c1', '{"order": "o1", "amount": 100}', 'pat_pay(jsonb)');
SELECT idem_call('pat-pay', 'c1', '{"amount":100,"order":"o1"}', 'pat_pay(jsonb)');
SELECT count(*) FROM pat_payments;
-- replay returns what is stored, whatever handler is named now
SELECT idem_call('pat-pay', 'c1', '{"order": "o1", "amount": 100}', 'pat_echo(jsonb)');
-- a record completed by idem_complete is replayed too, whatever its status
SELECT outcome FROM idem_reserve('pat-pay', 'c-declined', '{"order": "o9", "amount": 9}');
SELECT idem_complete('pat-pay', 'c-declined', '{"error": "card_declined"}', 402);
SELECT idem_call('pat-pay', 'c-declined', '{"order": "o9", "amount": 9}', 'pat_pay(jsonb)');

-- mismatch: same key, another request (ID004)
SELECT idem_call('pat-pay', 'c1', '{"order": "o1", "amount": 250}', 'pat_pay(jsonb)');
SELECT idem_call('pat-pay', 'c1', NULL, 'pat_pay(jsonb)');

-- in_progress: a committed processing record younger than the timeout (ID003)
SELECT outcome FROM idem_reserve('pat-pay', 'c2', '{"order": "o2", "amount": 200}');
SELECT idem_call('pat-pay', 'c2', '{"order": "o2", "amount": 200}', 'pat_pay(jsonb)');
-- ... and a handler that calls idem_call for its own key again
CREATE FUNCTION pat_reenter(request jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
	RETURN idem_call('pat-pay', 'c-reenter', request, 'pat_pay(jsonb)');
END
$$;
SELECT idem_call('pat-pay', 'c-reenter', '{"order": "o3", "amount": 1}', 'pat_reenter(jsonb)');
SELECT count(*) FROM idem_lookup('pat-pay', 'c-reenter');

-- stuck: the processing record is older than the timeout (ID005)
UPDATE idem_keys SET updated_at = now() - interval '6 minutes' WHERE operation LIKE 'pat-%' AND key = 'c2';
SELECT idem_call('pat-pay', 'c2', '{"order": "o2", "amount": 200}', 'pat_pay(jsonb)');
-- ... or flagged stuck, after a recovery point
SELECT idem_checkpoint('pat-pay', 'c2', 'gateway-called');
UPDATE idem_keys SET status = 'stuck' WHERE operation LIKE 'pat-%' AND key = 'c2';
SELECT idem_call('pat-pay', 'c2', '{"order": "o2", "amount": 200}', 'pat_pay(jsonb)');
-- mismatch is checked before the state
SELECT idem_call('pat-pay', 'c2', '{"order": "o2", "amount": 1}', 'pat_pay(jsonb)');
SELECT count(*) FROM pat_payments;
-- reconciliation settles it; then idem_call replays
SELECT idem_complete('pat-pay', 'c2', '{"payment": "reconciled"}', 201);
SELECT idem_call('pat-pay', 'c2', '{"order": "o2", "amount": 200}', 'pat_pay(jsonb)');

-- A NULL request: a non-strict handler gets NULL, a strict one is not called
SELECT idem_call('pat-echo', 'n1', NULL, 'pat_echo(jsonb)');
SELECT idem_call('pat-echo', 'n2', NULL, 'pat_echo_strict(jsonb)');
SELECT key, status, response, request_hash FROM idem_keys
WHERE operation = 'pat-echo' ORDER BY key;
-- A NULL result is completed and replayed as NULL
SELECT idem_call('pat-echo', 'n3', '{"a": 1}', 'pat_null(jsonb)');
SELECT idem_call('pat-echo', 'n3', '{"a": 1}', 'pat_echo(jsonb)');
SELECT status, response_status, response FROM idem_lookup('pat-echo', 'n3');

-- Scopes and ttl
SELECT idem_call('pat-pay', 'c1', '{"order": "o1", "amount": 100}', 'pat_pay(jsonb)',
                 scope => 'account-2', ttl => '1 hour');
SELECT scope, expires_at - updated_at AS ttl FROM idem_keys WHERE operation LIKE 'pat-%' AND key = 'c1' ORDER BY scope;
SELECT count(*) FROM pat_payments;
SET idempotency.default_ttl = '2d';
SELECT idem_call('pat-echo', 't1', '{}', 'pat_echo(jsonb)');
SELECT expires_at - updated_at AS ttl FROM idem_lookup('pat-echo', 't1');
RESET idempotency.default_ttl;
-- An expired record is gone: the handler runs again
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE operation LIKE 'pat-%' AND key = 't1';
SELECT idem_call('pat-echo', 't1', '{"again": true}', 'pat_echo(jsonb)');

-- One statement, many rows: the cached handler is switched when it changes
SELECT i, idem_call('pat-bulk', 'b' || i,
                    jsonb_build_object('order', 'b' || i, 'amount', i),
                    CASE WHEN i % 3 = 0 THEN 'pat_echo(jsonb)'
                         WHEN i % 3 = 1 THEN 'pat_pay(jsonb)'
                         ELSE 'pat_null(jsonb)' END::regprocedure)
FROM generate_series(1, 7) i;
SELECT order_id, amount FROM pat_payments WHERE order_id LIKE 'b%' ORDER BY id;
SELECT count(*) FILTER (WHERE response IS NULL) AS null_responses,
       count(*) FILTER (WHERE status = 'completed') AS completed
FROM idem_keys WHERE operation = 'pat-bulk';

--
-- idem_call: a failing handler keeps nothing, and a retry runs again
--
SELECT idem_call('pat-pay', 'f1', '{"order": "o4", "amount": 0}', 'pat_pay(jsonb)');
SELECT count(*) FROM idem_lookup('pat-pay', 'f1');
UPDATE pat_switch SET fail = true;
SELECT idem_call('pat-pay', 'f2', '{"order": "o5", "amount": 5}', 'pat_pay(jsonb)');
SELECT count(*) FROM idem_lookup('pat-pay', 'f2');
SELECT count(*) FROM pat_payments WHERE order_id = 'o5';
UPDATE pat_switch SET fail = false;
SELECT idem_call('pat-pay', 'f2', '{"order": "o5", "amount": 5}', 'pat_pay(jsonb)') ->> 'amount';
SELECT count(*) FROM pat_payments WHERE order_id = 'o5';
-- The same inside one transaction, with the failure caught in a savepoint
BEGIN;
UPDATE pat_switch SET fail = true;
DO $$
BEGIN
	PERFORM idem_call('pat-pay', 'f3', '{"order": "o6", "amount": 6}', 'pat_pay(jsonb)');
EXCEPTION WHEN OTHERS THEN
	RAISE NOTICE 'caught %: %', SQLSTATE, SQLERRM;
END
$$;
SELECT count(*) FROM idem_lookup('pat-pay', 'f3');
UPDATE pat_switch SET fail = false;
SELECT idem_call('pat-pay', 'f3', '{"order": "o6", "amount": 6}', 'pat_pay(jsonb)') ->> 'amount';
COMMIT;
SELECT count(*) FROM pat_payments WHERE order_id = 'o6';
SELECT status FROM idem_lookup('pat-pay', 'f3');

--
-- idem_call: handler validation
--
CREATE FUNCTION pat_two(request jsonb, extra int DEFAULT 0) RETURNS jsonb
LANGUAGE sql AS $$ SELECT request $$;
CREATE FUNCTION pat_text(request text) RETURNS jsonb
LANGUAGE sql AS $$ SELECT to_jsonb(request) $$;
CREATE FUNCTION pat_none() RETURNS jsonb
LANGUAGE sql AS $$ SELECT '{}'::jsonb $$;
CREATE FUNCTION pat_returns_text(request jsonb) RETURNS text
LANGUAGE sql AS $$ SELECT request::text $$;
CREATE FUNCTION pat_returns_json(request jsonb) RETURNS json
LANGUAGE sql AS $$ SELECT request::json $$;
CREATE FUNCTION pat_setof(request jsonb) RETURNS SETOF jsonb
LANGUAGE sql AS $$ SELECT request $$;
CREATE PROCEDURE pat_proc(request jsonb)
LANGUAGE sql AS $$ SELECT 1 $$;
CREATE AGGREGATE pat_agg(jsonb) (SFUNC = jsonb_concat, STYPE = jsonb);
SELECT idem_call('pat-v', 'v1', '{}', 'pat_two(jsonb, int)');
SELECT idem_call('pat-v', 'v1', '{}', 'pat_text(text)');
SELECT idem_call('pat-v', 'v1', '{}', 'pat_none()');
SELECT idem_call('pat-v', 'v1', '{}', 'pat_returns_text(jsonb)');
SELECT idem_call('pat-v', 'v1', '{}', 'pat_returns_json(jsonb)');
SELECT idem_call('pat-v', 'v1', '{}', 'pat_setof(jsonb)');
SELECT idem_call('pat-v', 'v1', '{}', 'pat_proc(jsonb)');
SELECT idem_call('pat-v', 'v1', '{}', 'pat_agg(jsonb)');
SELECT idem_call('pat-v', 'v1', '{}', 'first_value(anyelement)');
SELECT idem_call('pat-v', 'v1', '{}', 4000000000::oid::regprocedure);
-- nothing was reserved by a call with a bad handler (a built-in handler:
-- handler_builtin.sql)
SELECT key, status, response FROM idem_keys WHERE operation = 'pat-v';

--
-- idem_call: bad input (22023, naming the argument)
--
SELECT idem_call(NULL, 'k', '{}', 'pat_echo(jsonb)');
SELECT idem_call('', 'k', '{}', 'pat_echo(jsonb)');
SELECT idem_call(repeat('o', 64), 'k', '{}', 'pat_echo(jsonb)');
SELECT idem_call('pat-op', NULL, '{}', 'pat_echo(jsonb)');
SELECT idem_call('pat-op', E'a\nb', '{}', 'pat_echo(jsonb)');
SELECT idem_call('pat-op', repeat('k', 256), '{}', 'pat_echo(jsonb)');
SELECT idem_call('pat-op', 'k', '{}', NULL);
SELECT idem_call('pat-op', 'k', '{}', 'pat_echo(jsonb)', scope => NULL);
SELECT idem_call('pat-op', 'k', '{}', 'pat_echo(jsonb)', scope => 'idem:consume');
SELECT idem_call('pat-op', 'k', '{}', 'pat_echo(jsonb)', ttl => '0');
SELECT idem_call('pat-op', 'k', '{}', 'pat_echo(jsonb)', ttl => '-5 minutes');
SELECT count(*) FROM idem_keys WHERE operation = 'pat-op';

--
-- idem_call: privileges.  The handler runs as the caller, who needs EXECUTE
-- on it like on any function.
--
CREATE ROLE regress_pat_app;
CREATE TABLE pat_audit (note text);
GRANT EXECUTE ON FUNCTION idem_call(text, text, jsonb, regprocedure, text, interval)
	TO regress_pat_app;
GRANT SELECT, INSERT, UPDATE ON idem_keys TO regress_pat_app;
GRANT SELECT, INSERT ON pat_payments TO regress_pat_app;
GRANT SELECT ON pat_switch TO regress_pat_app;
GRANT USAGE ON SEQUENCE pat_payments_id_seq TO regress_pat_app;
REVOKE EXECUTE ON FUNCTION pat_pay(jsonb) FROM PUBLIC;
CREATE FUNCTION pat_audited(request jsonb) RETURNS jsonb
LANGUAGE sql AS $$ INSERT INTO pat_audit VALUES ('called') RETURNING to_jsonb(note) $$;
SET ROLE regress_pat_app;
SELECT idem_call('pat-pay', 'p1', '{"order": "o7", "amount": 7}', 'pat_pay(jsonb)');
-- EXECUTE on a handler is not enough: it runs with the caller's privileges
SELECT idem_call('pat-audit', 'p2', '{}', 'pat_audited(jsonb)');
RESET ROLE;
SELECT count(*) FROM idem_keys WHERE operation LIKE 'pat-%' AND key IN ('p1', 'p2');
GRANT EXECUTE ON FUNCTION pat_pay(jsonb) TO regress_pat_app;
SET ROLE regress_pat_app;
SELECT idem_call('pat-pay', 'p1', '{"order": "o7", "amount": 7}', 'pat_pay(jsonb)') ->> 'by';
-- a REVOKE takes effect for the next call, even a replay
RESET ROLE;
REVOKE EXECUTE ON FUNCTION pat_pay(jsonb) FROM regress_pat_app;
SET ROLE regress_pat_app;
SELECT idem_call('pat-pay', 'p1', '{"order": "o7", "amount": 7}', 'pat_pay(jsonb)');
-- and without EXECUTE on idem_call itself, nothing at all
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idem_call(text, text, jsonb, regprocedure, text, interval)
	FROM regress_pat_app;
SET ROLE regress_pat_app;
SELECT idem_call('pat-pay', 'p3', '{"order": "o8", "amount": 8}', 'pat_echo(jsonb)');
RESET ROLE;
SELECT created_by, count(*) FROM pat_payments GROUP BY 1 ORDER BY 1;

--
-- idem_consume
--

-- true the first time, false once a committed transaction processed it
SELECT idem_consume('pat-orders', 'm1');
SELECT idem_consume('pat-orders', 'm1');
SELECT idem_consume('pat-orders', 'm1', wait => false);
-- The record: reserved scope, operation = consumer, key = message_id
SELECT scope, operation, key, request_hash, status, response_status, response,
       expires_at - updated_at AS ttl
FROM idem_keys WHERE scope = 'idem:consume';
-- Another consumer, and idem_reserve's keys, are separate namespaces
SELECT idem_consume('pat-billing', 'm1');
SELECT outcome FROM idem_reserve('pat-orders', 'm1');
SELECT idem_release('pat-orders', 'm1');
-- The reserved scope cannot be reached through the key functions
SELECT * FROM idem_reserve('pat-orders', 'm1', scope => 'idem:consume');
SELECT * FROM idem_reserve('pat-orders', 'm1', scope => 'idem:other');
SELECT * FROM idem_lookup('pat-orders', 'm1', 'idem:consume');
SELECT idem_release('pat-orders', 'm1', 'idem:consume');
SELECT idem_complete('pat-orders', 'm1', scope => 'idem:consume');
SELECT idem_checkpoint('pat-orders', 'm1', 'x', 'idem:consume');
SELECT outcome FROM idem_reserve('pat-orders', 'm1', scope => 'IDEM:consume');
SELECT outcome FROM idem_reserve('pat-orders', 'm1', scope => 'idem');
SELECT count(*) FROM idem_keys WHERE scope = 'idem:consume';

-- Twice in one transaction: the second call says the work is done (here)
BEGIN;
SELECT idem_consume('pat-orders', 'm2');
SELECT idem_consume('pat-orders', 'm2');
SELECT idem_consume('pat-orders', 'm2', wait => false);
COMMIT;
-- A rolled-back transaction leaves nothing: the message is new again
BEGIN;
SELECT idem_consume('pat-orders', 'm3');
ROLLBACK;
SELECT count(*) FROM idem_keys WHERE operation LIKE 'pat-%' AND key = 'm3';
SELECT idem_consume('pat-orders', 'm3');
-- ... and so does a rolled-back savepoint
BEGIN;
SAVEPOINT s;
SELECT idem_consume('pat-orders', 'm4');
ROLLBACK TO SAVEPOINT s;
SELECT idem_consume('pat-orders', 'm4');
COMMIT;
SELECT idem_consume('pat-orders', 'm4');

-- The ttl is the de-duplication window; after it the message is new again
SELECT idem_consume('pat-orders', 'm5', ttl => '1 hour');
SELECT expires_at - updated_at AS ttl FROM idem_keys WHERE operation LIKE 'pat-%' AND key = 'm5';
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE operation LIKE 'pat-%' AND key = 'm5';
SELECT idem_consume('pat-orders', 'm5');
SELECT expires_at - updated_at AS ttl FROM idem_keys WHERE operation LIKE 'pat-%' AND key = 'm5';
SET idempotency.default_ttl = '7d';
SELECT idem_consume('pat-orders', 'm6');
SELECT expires_at - updated_at AS ttl FROM idem_keys WHERE operation LIKE 'pat-%' AND key = 'm6';
RESET idempotency.default_ttl;

-- A consumer that applies an effect once per message
CREATE TABLE pat_inbox_effects (message_id text, amount int);
CREATE FUNCTION pat_handle(msg_id text, amount int) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
	IF NOT idem_consume('pat-ledger', msg_id) THEN
		RETURN false;
	END IF;
	INSERT INTO pat_inbox_effects VALUES (msg_id, amount);
	RETURN true;
END
$$;
SELECT m, pat_handle('msg-' || m, m) FROM unnest(ARRAY[1, 2, 1, 3, 2, 1]) AS m;
SELECT message_id, amount FROM pat_inbox_effects ORDER BY 1;

-- A record changed by hand is reported, not guessed at
UPDATE idem_keys SET status = 'stuck' WHERE scope = 'idem:consume' AND key = 'm6';
SELECT idem_consume('pat-orders', 'm6');
UPDATE idem_keys SET status = 'processing' WHERE scope = 'idem:consume' AND key = 'm6';
SELECT idem_consume('pat-orders', 'm6');
DELETE FROM idem_keys WHERE scope = 'idem:consume' AND key = 'm6';
SELECT idem_consume('pat-orders', 'm6');

-- Bad input (22023, naming the argument)
SELECT idem_consume(NULL, 'm');
SELECT idem_consume('', 'm');
SELECT idem_consume(repeat('c', 64), 'm');
SELECT idem_consume('pat-orders', NULL);
SELECT idem_consume('pat-orders', '');
SELECT idem_consume('pat-orders', repeat('m', 256));
SELECT idem_consume('pat-orders', E'm\t1');
SELECT idem_consume('pat-orders', 'm7', ttl => '0');
SELECT idem_consume('pat-orders', 'm7', ttl => '-1 day');
SELECT idem_consume('pat-orders', 'm7', wait => NULL);
SELECT idem_consume(repeat('c', 63), repeat('m', 255));
SELECT count(*) FROM idem_keys WHERE operation LIKE 'pat-%' AND key = 'm7';

-- Privileges: nothing is granted to PUBLIC
SET ROLE regress_pat_app;
SELECT idem_consume('pat-orders', 'm8');
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_consume(text, text, interval, boolean) TO regress_pat_app;
SET ROLE regress_pat_app;
SELECT idem_consume('pat-orders', 'm8');
SELECT idem_consume('pat-orders', 'm8');
RESET ROLE;

--
-- Statistics: idem_call counts like idem_reserve and idem_complete;
-- idem_consume counts consumed and duplicates, not reservations.  Counters
-- are not transactional: a rolled-back first delivery still counts.
--
SELECT idem_call('pat-stats-call', 's1', '{"a": 1}', 'pat_echo(jsonb)');
SELECT idem_call('pat-stats-call', 's1', '{"a": 1}', 'pat_echo(jsonb)');
SELECT idem_call('pat-stats-call', 's1', '{"a": 2}', 'pat_echo(jsonb)');
SELECT idem_consume('pat-stats-consumer', 's1');
SELECT idem_consume('pat-stats-consumer', 's1');
SELECT idem_consume('pat-stats-consumer', 's1', wait => false);
BEGIN;
SELECT idem_consume('pat-stats-consumer', 's2');
ROLLBACK;
SELECT operation, reserves, new, replays, in_progress, mismatches, stuck,
       completes, releases, consumed, duplicates, collision_rate
FROM idem_stats WHERE operation LIKE 'pat-stats-%' ORDER BY operation;

--
-- The SQLSTATEs
--
\set VERBOSITY terse
SELECT outcome FROM idem_reserve('pat-pay', 'c-in-progress', '{}');
SELECT idem_call('pat-pay', 'c-in-progress', '{}', 'pat_echo(jsonb)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('pat-pay', 'c1', '{"order": "o1", "amount": 1}', 'pat_pay(jsonb)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_checkpoint('pat-pay', 'c-in-progress', 'step-1');
UPDATE idem_keys SET status = 'stuck' WHERE operation LIKE 'pat-%' AND key = 'c-in-progress';
SELECT idem_call('pat-pay', 'c-in-progress', '{}', 'pat_echo(jsonb)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('pat-pay', 'f1', '{"order": "o4", "amount": 0}', 'pat_pay(jsonb)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('pat-op', '', '{}', 'pat_echo(jsonb)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('pat-op', 'k', '{}', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('pat-op', 'k', '{}', 'pat_echo(jsonb)', scope => 'idem:x');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('pat-op', 'k', '{}', 'pat_text(text)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('pat-op', 'k', '{}', 4000000000::oid::regprocedure);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('pat-op', 'k', '{}', 'pat_proc(jsonb)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('pat-op', 'k', '{}', 'pat_setof(jsonb)');
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_pat_app;
SELECT idem_call('pat-op', 'k', '{}', 'pat_echo(jsonb)');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT idem_consume('pat-orders', E'\x01');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_consume('pat-orders', 'm9', wait => NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_reserve('pat-op', 'k', scope => 'idem:consume');
\echo :LAST_ERROR_SQLSTATE
UPDATE idem_keys SET status = 'stuck' WHERE scope = 'idem:consume' AND key = 'm1';
SELECT idem_consume('pat-orders', 'm1');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default

-- Clean up: the role, and the records, so that later tests see none of them
DROP OWNED BY regress_pat_app;
DROP ROLE regress_pat_app;
DELETE FROM idem_keys WHERE operation LIKE 'pat-%' OR scope = 'idem:consume';
