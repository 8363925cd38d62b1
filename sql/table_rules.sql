-- idem_keys is an ordinary table to PostgreSQL: CHECK constraints and
-- triggers its owner adds hold for every write the extension makes (reserve,
-- renew, complete, checkpoint, release, flag, sweep), and a changed column
-- layout is a clean ERROR 55000 from every function, never a crash.
\pset null '(null)'
SET idempotency.processing_timeout = '5min';
DELETE FROM idem_keys;
CREATE FUNCTION rules_echo(request jsonb) RETURNS jsonb LANGUAGE sql AS 'SELECT request';
-- try() runs a statement and shows its SQLSTATE and message
CREATE FUNCTION pg_temp.try(q text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE q;
	RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;

-- A CHECK constraint the owner adds: 23514, and nothing is written
ALTER TABLE idem_keys ADD CONSTRAINT rules_short_keys CHECK (length(key) <= 8);
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'much-too-long')$q$);
SELECT count(*) AS written FROM idem_keys WHERE operation = 'rules';
-- ... the same as a plain INSERT of that row
SELECT pg_temp.try($q$INSERT INTO idem_keys (scope, operation, key, status, expires_at)
VALUES ('', 'rules', 'much-too-long', 'processing', now() + interval '1 day')$q$);
ALTER TABLE idem_keys DROP CONSTRAINT rules_short_keys;
-- ... on completion, checkpoint and renewal too; the record stays as it was
ALTER TABLE idem_keys ADD CONSTRAINT rules_no_teapot
	CHECK (response_status IS DISTINCT FROM 418 AND recovery_point IS DISTINCT FROM 'teapot');
SELECT outcome FROM idem_reserve('rules', 'k1');
SELECT pg_temp.try($q$SELECT idem_complete('rules', 'k1', '{}', 418)$q$);
SELECT pg_temp.try($q$SELECT idem_checkpoint('rules', 'k1', 'teapot')$q$);
SELECT status, response_status, recovery_point FROM idem_lookup('rules', 'k1');
ALTER TABLE idem_keys DROP CONSTRAINT rules_no_teapot;
SELECT idem_complete('rules', 'k1', '{}', 201);
-- (expired in a transaction that deletes it, so that the server's worker,
-- if it runs, never sweeps it first)
BEGIN;
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE operation = 'rules';
ALTER TABLE idem_keys ADD CONSTRAINT rules_no_renewal CHECK (ttl IS DISTINCT FROM '7 days');
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'k1', ttl => '7 days')$q$);
SELECT status, response_status, ttl FROM idem_keys WHERE operation = 'rules';
ALTER TABLE idem_keys DROP CONSTRAINT rules_no_renewal;
DELETE FROM idem_keys WHERE operation = 'rules';
COMMIT;
-- ... and on the maintenance writes: a record the CHECK keeps from being
-- flagged stays processing, with a WARNING naming its key and the CHECK
-- that an UPDATE statement would fail; the flag goes on with the others
-- (the CHECK first: the worker, if it runs, cannot flag it either)
ALTER TABLE idem_keys ADD CONSTRAINT rules_never_stuck CHECK (status <> 'stuck' OR operation <> 'rules');
SELECT outcome FROM idem_reserve('rules', 'k2');
UPDATE idem_keys SET updated_at = now() - interval '1 hour' WHERE operation = 'rules' AND key = 'k2';
SELECT pg_temp.try($q$SELECT idem_flag_stuck()$q$);
SELECT key, status FROM idem_keys WHERE operation = 'rules' ORDER BY key;
ALTER TABLE idem_keys DROP CONSTRAINT rules_never_stuck;
SELECT idem_release('rules', 'k2');
DELETE FROM idem_keys WHERE operation = 'rules';

-- A CHECK through a function: replacing the function changes what the next
-- write checks, as for an INSERT statement (the prepared CHECK goes with it)
CREATE FUNCTION rules_key_ok(k text) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT true';
ALTER TABLE idem_keys ADD CONSTRAINT rules_key_ok CHECK (rules_key_ok(key));
SELECT outcome FROM idem_reserve('rules', 'f1');
CREATE OR REPLACE FUNCTION rules_key_ok(k text) RETURNS boolean LANGUAGE sql IMMUTABLE
	AS $$SELECT k <> 'f2'$$;
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'f2')$q$);
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'f3')$q$);
SELECT key FROM idem_keys WHERE operation = 'rules' ORDER BY key;
ALTER TABLE idem_keys DROP CONSTRAINT rules_key_ok;
DROP FUNCTION rules_key_ok(text);
DELETE FROM idem_keys WHERE operation = 'rules';

-- CHECK constraints and partial-index predicates are evaluated as the
-- executor evaluates them for an INSERT: prepared in each write's own
-- executor state, so a SQL function in them keeps no state from one write
-- to the next.  A SQL function (not inlined: SET search_path) that raises
-- inside a CHECK, then a savepoint rolled back, then the next write:
CREATE FUNCTION rules_is_uuid(k text) RETURNS boolean LANGUAGE sql IMMUTABLE
	SET search_path = pg_catalog AS $$SELECT k::uuid IS NOT NULL$$;
ALTER TABLE idem_keys ADD CONSTRAINT rules_is_uuid CHECK (rules_is_uuid(key));
BEGIN;
SELECT outcome FROM idem_reserve('rules', '00000000-0000-0000-0000-000000000001');
SAVEPOINT s;
SELECT outcome FROM idem_reserve('rules', 'not-a-uuid');
ROLLBACK TO s;
SELECT outcome FROM idem_reserve('rules', '00000000-0000-0000-0000-000000000002');
SAVEPOINT s;
SELECT outcome FROM idem_reserve('rules', 'still-not-a-uuid');
ROLLBACK TO s;
SELECT idem_complete('rules', '00000000-0000-0000-0000-000000000002', '{}');
COMMIT;
SELECT outcome FROM idem_reserve('rules', '00000000-0000-0000-0000-000000000003');
SELECT key, status FROM idem_keys WHERE operation = 'rules' ORDER BY key;
ALTER TABLE idem_keys DROP CONSTRAINT rules_is_uuid;
DROP FUNCTION rules_is_uuid(text);
DELETE FROM idem_keys WHERE operation = 'rules';
-- ... one that divides by zero, caught by PL/pgSQL this time
CREATE FUNCTION rules_divides(k text) RETURNS boolean LANGUAGE sql IMMUTABLE
	SET search_path = pg_catalog
	AS $$SELECT 1 / (CASE WHEN k LIKE 'zero%' THEN 0 ELSE 1 END) = 1$$;
ALTER TABLE idem_keys ADD CONSTRAINT rules_divides CHECK (rules_divides(key));
BEGIN;
SELECT outcome FROM idem_reserve('rules', 'd1');
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'zero-1')$q$);
SELECT outcome FROM idem_reserve('rules', 'd2');
SAVEPOINT s;
SELECT outcome FROM idem_reserve('rules', 'zero-2');
ROLLBACK TO s;
SELECT outcome FROM idem_reserve('rules', 'd3');
SELECT idem_complete('rules', 'd3', '{}');
COMMIT;
SELECT outcome FROM idem_reserve('rules', 'd4');
SELECT key, status FROM idem_keys WHERE operation = 'rules' ORDER BY key;
ALTER TABLE idem_keys DROP CONSTRAINT rules_divides;
DELETE FROM idem_keys WHERE operation = 'rules';
-- ... the same function in the predicate of a partial index
CREATE INDEX rules_divides_idx ON idem_keys (key) WHERE rules_divides(key);
BEGIN;
SELECT outcome FROM idem_reserve('rules', 'i1');
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'zero-3')$q$),
	pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'i2')$q$),
	pg_temp.try($q$SELECT idem_complete('rules', 'i2', '{}')$q$),
	pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'zero-4')$q$);
COMMIT;
SELECT outcome FROM idem_reserve('rules', 'i3');
SELECT key, status FROM idem_keys WHERE operation = 'rules' ORDER BY key;
DROP INDEX rules_divides_idx;
DROP FUNCTION rules_divides(text);
DELETE FROM idem_keys WHERE operation = 'rules';
-- A CHECK function that itself reserves another key: each write has its
-- own executor state, the inner one's as much as the outer one's
CREATE FUNCTION rules_reserve_too(op text, k text) RETURNS boolean LANGUAGE sql
	SET search_path = pg_catalog
	AS $$SELECT op <> 'rules' OR
		(SELECT outcome FROM public.idem_reserve('rules-inner', k)) IS NOT NULL$$;
ALTER TABLE idem_keys ADD CONSTRAINT rules_reserve_too CHECK (rules_reserve_too(operation, key));
SELECT outcome FROM idem_reserve('rules', 'r1');
SELECT idem_complete('rules', 'r1', '{}');
SELECT outcome FROM idem_reserve('rules', 'r2');
SELECT operation, key, status FROM idem_keys WHERE operation LIKE 'rules%' ORDER BY operation, key;
ALTER TABLE idem_keys DROP CONSTRAINT rules_reserve_too;
DROP FUNCTION rules_reserve_too(text, text);
DELETE FROM idem_keys WHERE operation LIKE 'rules%';
-- An ERROR while a CHECK is being planned (its function folded to a
-- constant raises) leaves nothing behind: the next write plans it again
CREATE FUNCTION rules_limit() RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
	IF current_setting('rules.fail', true) = 'on' THEN
		RAISE EXCEPTION 'rules_limit failed';
	END IF;
	RETURN 64;
END
$$;
ALTER TABLE idem_keys ADD CONSTRAINT rules_limit CHECK (length(key) <= rules_limit());
SET rules.fail = 'on';
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'l1')$q$);
RESET rules.fail;
SELECT outcome FROM idem_reserve('rules', 'l2');
SELECT key FROM idem_keys WHERE operation = 'rules' ORDER BY key;
ALTER TABLE idem_keys DROP CONSTRAINT rules_limit;
DROP FUNCTION rules_limit();
DELETE FROM idem_keys WHERE operation = 'rules';

-- Partial indexes the owner adds hold exactly the records their predicates
-- take, from every write, as the indexes come and go (each predicate goes
-- with its own index): counted through each index alone
CREATE INDEX rules_partial_a ON idem_keys (key) WHERE operation = 'rules-a';
CREATE INDEX rules_partial_b ON idem_keys (key) WHERE operation = 'rules-b';
SELECT outcome FROM idem_reserve('rules-a', 'p1');
SELECT outcome FROM idem_reserve('rules-b', 'p1');
DROP INDEX rules_partial_a;
CREATE INDEX rules_partial_c ON idem_keys (key) WHERE operation = 'rules-c';
SELECT outcome FROM idem_reserve('rules-b', 'p2');
SELECT outcome FROM idem_reserve('rules-c', 'p2');
SELECT idem_complete('rules-c', 'p2', '{}');
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT key FROM idem_keys WHERE operation = 'rules-b';
SELECT string_agg(key, ' ' ORDER BY key) AS through_b FROM idem_keys WHERE operation = 'rules-b';
EXPLAIN (COSTS OFF) SELECT key FROM idem_keys WHERE operation = 'rules-c';
SELECT string_agg(key, ' ' ORDER BY key) AS through_c FROM idem_keys WHERE operation = 'rules-c';
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX rules_partial_b, rules_partial_c;
DELETE FROM idem_keys WHERE operation LIKE 'rules-_';

-- Row triggers the owner adds fire for every write, as for the statements
CREATE TABLE rules_log (n serial, event text, key text, status text);
CREATE FUNCTION rules_log_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'DELETE' THEN
		INSERT INTO rules_log (event, key, status) VALUES (TG_WHEN || ' ' || TG_OP, OLD.key, OLD.status);
		RETURN OLD;
	END IF;
	INSERT INTO rules_log (event, key, status) VALUES (TG_WHEN || ' ' || TG_OP, NEW.key, NEW.status);
	RETURN NEW;
END
$$;
CREATE TRIGGER rules_after AFTER INSERT OR UPDATE OR DELETE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION rules_log_row();
-- reserve, checkpoint, complete; a replay writes nothing
SELECT outcome FROM idem_reserve('rules', 't1');
SELECT idem_checkpoint('rules', 't1', 'step-1');
SELECT idem_complete('rules', 't1', '{"n": 1}');
SELECT outcome FROM idem_reserve('rules', 't1');
-- release
SELECT outcome FROM idem_reserve('rules', 't2');
SELECT idem_release('rules', 't2');
-- renewal of an expired record, then the sweep of another
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE key = 't1';
SELECT outcome FROM idem_reserve('rules', 't1');
SELECT idem_complete('rules', 't1', '{"n": 2}');
SELECT count(*) FROM (SELECT idem_reserve('rules', 't3'), idem_complete('rules', 't3')) s;
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE key = 't3';
SELECT idem_sweep();
-- the flag; and idem_consume's one write
SELECT outcome FROM idem_reserve('rules', 't4');
UPDATE idem_keys SET updated_at = now() - interval '1 hour' WHERE key = 't4';
SELECT idem_flag_stuck();
SELECT idem_consume('rules', 'm1');
SELECT count(*) FROM (SELECT idem_call('rules', 't5', '{}', 'rules_echo(jsonb)')) s;
SELECT event, key, status FROM rules_log ORDER BY n;
DROP TRIGGER rules_after ON idem_keys;
TRUNCATE rules_log;

-- A BEFORE trigger may change the row it is given, and the record keeps
-- the change; one that skips the write (returns NULL) is an error, since the
-- record would not say what happened
CREATE FUNCTION rules_tag() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.key = 'skip' THEN
		RETURN NULL;
	END IF;
	NEW.resource_id := coalesce(NEW.resource_id, 'tagged');
	RETURN NEW;
END
$$;
CREATE TRIGGER rules_before BEFORE INSERT OR UPDATE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION rules_tag();
SELECT outcome, resource_id FROM idem_reserve('rules', 'b1');
SELECT outcome FROM idem_reserve('rules', 'skip');
SELECT count(*) AS skipped_written FROM idem_keys WHERE key = 'skip';
SELECT idem_complete('rules', 'b1', '{}');
SELECT outcome, resource_id FROM idem_reserve('rules', 'b1');
DROP TRIGGER rules_before ON idem_keys;
DROP FUNCTION rules_tag();
CREATE FUNCTION rules_keep() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RETURN NULL;
END
$$;
CREATE TRIGGER rules_keep BEFORE DELETE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION rules_keep();
SELECT outcome FROM idem_reserve('rules', 'b2');
SELECT idem_release('rules', 'b2');
SELECT status FROM idem_lookup('rules', 'b2');
-- ... the sweep leaves a record kept that way and does not count it
UPDATE idem_keys SET status = 'completed', expires_at = now() - interval '1 second' WHERE key = 'b1';
SELECT idem_sweep();
SELECT count(*) AS kept FROM idem_keys WHERE key = 'b1';
DROP TRIGGER rules_keep ON idem_keys;
DROP FUNCTION rules_keep();
DELETE FROM idem_keys;
-- ... but not the key: a BEFORE ROW trigger that changes scope, operation
-- or key would move the record away from its key (whose retry would then
-- run the effect again).  It is an error naming the trigger's table, and
-- nothing is written.
CREATE FUNCTION rules_rekey() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.key = 'rk-insert' THEN
		NEW.key := 'rk-moved';
	ELSIF NEW.key = 'rk-operation' THEN
		NEW.operation := 'rules-moved';
	ELSIF NEW.status = 'completed' OR NEW.recovery_point = 'move' THEN
		NEW.key := NEW.key || '-moved';
	END IF;
	RETURN NEW;
END
$$;
CREATE TRIGGER rules_rekey BEFORE INSERT OR UPDATE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION rules_rekey();
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'rk-insert')$q$);
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'rk-operation')$q$);
SELECT outcome FROM idem_reserve('rules', 'rk1');
SELECT pg_temp.try($q$SELECT idem_complete('rules', 'rk1', '{"n": 1}')$q$);
SELECT pg_temp.try($q$SELECT idem_checkpoint('rules', 'rk1', 'move')$q$);
SELECT operation, key, status, recovery_point FROM idem_keys ORDER BY operation, key;
-- the record stays where its key finds it
SELECT outcome FROM idem_reserve('rules', 'rk1');
SELECT idem_complete('rules', 'rk1', '{"n": 1}');
DROP TRIGGER rules_rekey ON idem_keys;
DROP FUNCTION rules_rekey();
DELETE FROM idem_keys;

-- Row-level security on idem_keys stays refused with its own error
CREATE ROLE regress_idem_rules_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO regress_idem_rules_app;
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval),
	idem_sweep(integer) TO regress_idem_rules_app;
ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
SET ROLE regress_idem_rules_app;
SELECT outcome FROM idem_reserve('rules', 'rls');
SELECT idem_sweep();
RESET ROLE;
ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY;
REVOKE ALL ON idem_keys FROM regress_idem_rules_app;
REVOKE ALL ON FUNCTION idem_reserve(text, text, jsonb, text, interval),
	idem_sweep(integer) FROM regress_idem_rules_app;
DROP ROLE regress_idem_rules_app;

-- A changed column layout: every function answers a clean 55000 that
-- names the column and the type expected, before reading anything.
CREATE FUNCTION pg_temp.every_call() RETURNS TABLE (call text, result text)
LANGUAGE sql AS $$
	SELECT c, pg_temp.try('SELECT ' || c) FROM unnest(ARRAY[
		'idem_reserve(''rules'', ''c1'', ''{"a": 1}'')',
		'idem_complete(''rules'', ''c1'', ''{}'')',
		'idem_checkpoint(''rules'', ''c1'', ''x'')',
		'idem_release(''rules'', ''c1'')',
		'idem_lookup(''rules'', ''c1'')',
		'idem_consume(''rules'', ''m2'')',
		'idem_call(''rules'', ''c2'', ''{}'', ''rules_echo(jsonb)'')',
		'idem_sweep()',
		'idem_flag_stuck()',
		'idem_reconcile()']) c
$$;
-- a completed record with a response, which a misread type would crash on
SELECT count(*) FROM (SELECT idem_reserve('rules', 'c1', '{"a": 1}'),
						  idem_complete('rules', 'c1', '{"id": 1}', 201, 'r-1')) s;
BEGIN;
ALTER TABLE idem_keys ALTER COLUMN response TYPE text USING response::text;
SELECT outcome FROM idem_reserve('rules', 'c1', '{"a": 1}');
ROLLBACK;
BEGIN;
ALTER TABLE idem_keys ALTER COLUMN response TYPE text USING response::text;
SELECT * FROM pg_temp.every_call();
ROLLBACK;
BEGIN;
ALTER TABLE idem_keys ALTER COLUMN response_status TYPE text;
SELECT * FROM pg_temp.every_call();
SELECT idem_complete('rules', 'c1', '{}', 201);
ROLLBACK;
BEGIN;
ALTER TABLE idem_keys ALTER COLUMN resource_id TYPE varchar(20);
SELECT * FROM pg_temp.every_call();
ROLLBACK;
BEGIN;
ALTER TABLE idem_keys ALTER COLUMN request_hash TYPE text USING encode(request_hash, 'hex');
SELECT * FROM pg_temp.every_call();
ROLLBACK;
BEGIN;
ALTER TABLE idem_keys DROP COLUMN response;
SELECT * FROM pg_temp.every_call();
SELECT idem_complete('rules', 'c1', '{}');
ROLLBACK;
BEGIN;
ALTER TABLE idem_keys ADD COLUMN note text;
SELECT * FROM pg_temp.every_call();
ROLLBACK;
BEGIN;
ALTER TABLE idem_keys DROP CONSTRAINT idem_keys_pkey;
SELECT * FROM pg_temp.every_call();
SELECT outcome FROM idem_reserve('rules', 'c1', '{"a": 1}');
ROLLBACK;
-- A column dropped and added back with its type: found by name, and the
-- records work again (the dropped values are gone, as with any table)
BEGIN;
ALTER TABLE idem_keys DROP COLUMN resource_id;
ALTER TABLE idem_keys ADD COLUMN resource_id text;
SELECT outcome, response, resource_id FROM idem_reserve('rules', 'c1', '{"a": 1}');
SELECT outcome FROM idem_reserve('rules', 'c3');
SELECT idem_complete('rules', 'c3', '{"id": 3}', 201, 'r-3');
SELECT key, resource_id FROM idem_lookup('rules', 'c3');
ROLLBACK;
-- The columns the extension reads without looking for a null stay NOT NULL:
-- without it, every function answers 55000 naming the column, with a hint
-- that keeps every record
BEGIN;
ALTER TABLE idem_keys ALTER COLUMN status DROP NOT NULL;
SELECT * FROM pg_temp.every_call();
SELECT outcome FROM idem_reserve('rules', 'c1', '{"a": 1}');
ROLLBACK;
BEGIN;
ALTER TABLE idem_keys ALTER COLUMN created_at DROP NOT NULL,
	ALTER COLUMN updated_at DROP NOT NULL, ALTER COLUMN expires_at DROP NOT NULL;
SELECT * FROM pg_temp.every_call();
ALTER TABLE idem_keys ALTER COLUMN created_at SET NOT NULL;
SELECT * FROM pg_temp.every_call();
ALTER TABLE idem_keys ALTER COLUMN updated_at SET NOT NULL;
SELECT * FROM pg_temp.every_call();
ROLLBACK;
-- A null there all the same (a catalog changed by hand here; a NOT NULL
-- constraint not validated on PostgreSQL 18) is an error naming the record
BEGIN;
ALTER TABLE idem_keys ALTER COLUMN status DROP NOT NULL;
UPDATE idem_keys SET status = NULL WHERE operation = 'rules' AND key = 'c1';
UPDATE pg_attribute SET attnotnull = true
WHERE attrelid = 'idem_keys'::regclass AND attname = 'status';
ALTER TABLE idem_keys SET (fillfactor = 100);
SELECT * FROM pg_temp.every_call();
SELECT outcome FROM idem_reserve('rules', 'c1', '{"a": 1}');
ROLLBACK;
BEGIN;
SELECT count(*) FROM (SELECT idem_reserve('rules', 'c4')) s;
-- (written now: a reservation held by this transaction is not in the table yet)
SELECT count(*) FROM (SELECT idem_checkpoint('rules', 'c4', NULL)) s;
ALTER TABLE idem_keys ALTER COLUMN updated_at DROP NOT NULL;
UPDATE idem_keys SET updated_at = NULL WHERE operation = 'rules' AND key = 'c4';
UPDATE pg_attribute SET attnotnull = true
WHERE attrelid = 'idem_keys'::regclass AND attname = 'updated_at';
ALTER TABLE idem_keys SET (fillfactor = 100);
SELECT pg_temp.try($q$SELECT outcome FROM idem_reserve('rules', 'c4')$q$);
SELECT pg_temp.try($q$SELECT idem_complete('rules', 'c4')$q$);
SELECT pg_temp.try($q$SELECT count(*) FROM idem_lookup('rules', 'c4')$q$);
ROLLBACK;

-- The primary key's lock is held to the end of the transaction, as the
-- executor holds the locks of the indexes it opens
BEGIN;
SELECT count(*) FROM idem_lookup('rules', 'c1');
SELECT mode FROM pg_locks
WHERE locktype = 'relation' AND relation = 'idem_keys_pkey'::regclass AND pid = pg_backend_pid();
COMMIT;
-- after the rollbacks everything works as before
SELECT * FROM pg_temp.every_call();

DROP TABLE rules_log;
DROP FUNCTION rules_log_row();
DROP FUNCTION rules_echo(jsonb);
DELETE FROM idem_keys;
