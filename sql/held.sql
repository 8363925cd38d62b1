-- A held reservation (written once, at completion or at commit) is the
-- write the reservation would have made at once: as the role that reserved,
-- with its checks, into the table it reserved in, whatever the transaction
-- does in between (src/held.c).  Everything lives in operation 'held-*'.
\pset null '(null)'
CREATE TABLE held_effects (key text PRIMARY KEY, by_role name NOT NULL);

-- 1. A SECURITY DEFINER procedure reserves for its caller, who has no right
-- on idem_keys: one phase (reserve, effect, complete) and two (reserve and
-- effect, commit; complete later), and the record says so
CREATE ROLE regress_held_owner;
CREATE ROLE regress_held_app;
GRANT SELECT, INSERT, UPDATE ON idem_keys TO regress_held_owner;
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval),
	idem_complete(text, text, jsonb, integer, text, text) TO regress_held_owner;
GRANT INSERT ON held_effects TO regress_held_owner;
CREATE FUNCTION held_pay(k text, complete boolean) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
	o text;
BEGIN
	SELECT outcome INTO o FROM idem_reserve('held-definer', k);
	IF o = 'new' THEN
		INSERT INTO held_effects VALUES (k, session_user::name);
		IF complete THEN
			PERFORM idem_complete('held-definer', k, '{"paid": true}', 201);
		END IF;
	END IF;
	RETURN o;
END $$;
CREATE FUNCTION held_finish(k text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp
AS $$ SELECT idem_complete('held-definer', k, '{"paid": true}', 201) $$;
ALTER FUNCTION held_pay(text, boolean) OWNER TO regress_held_owner;
ALTER FUNCTION held_finish(text) OWNER TO regress_held_owner;
REVOKE EXECUTE ON FUNCTION held_pay(text, boolean), held_finish(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION held_pay(text, boolean), held_finish(text) TO regress_held_app;
SET ROLE regress_held_app;
SELECT held_pay('one-phase', true);
-- two-phase: the record is written processing at COMMIT, as the owner
BEGIN;
SELECT held_pay('two-phase', false);
COMMIT;
SELECT held_pay('two-phase', false) AS retried;
SELECT held_finish('two-phase');
SELECT held_pay('one-phase', true) AS retried, held_pay('two-phase', true) AS retried2;
RESET ROLE;
SELECT key, status, response_status FROM idem_keys WHERE operation = 'held-definer' ORDER BY key;
SELECT count(*) AS effects FROM held_effects;

-- ... and a held reservation after SET ROLE is written as the role that
-- reserved, not the one current at COMMIT
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval) TO regress_held_owner;
BEGIN;
SET LOCAL ROLE regress_held_owner;
SELECT outcome FROM idem_reserve('held-setrole', 'k1');
SET LOCAL ROLE regress_held_app;
COMMIT;
SELECT key, status FROM idem_keys WHERE operation = 'held-setrole';
-- the other way round: reserved by a role that may read but not write is
-- refused at the reservation, not at COMMIT
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval) TO regress_held_app;
GRANT SELECT ON idem_keys TO regress_held_app;
BEGIN;
SET LOCAL ROLE regress_held_app;
SELECT outcome FROM idem_reserve('held-setrole', 'k2');
ROLLBACK;

-- Inside a security-restricted operation (here CREATE MATERIALIZED VIEW),
-- a reservation is written at once
BEGIN;
CREATE MATERIALIZED VIEW held_mv AS
	SELECT outcome FROM idem_reserve('held-sro', 'k1');
SELECT key, status FROM idem_keys WHERE operation = 'held-sro';
ROLLBACK;

-- 3. DDL on idem_keys in the reserving transaction finds the held record
-- written first, as it would find an immediate write: an event trigger
-- counts the records DDL finds there.  So no effect commits without its
-- record, whatever the DDL.
CREATE FUNCTION held_ddl_sees() RETURNS event_trigger
LANGUAGE plpgsql AS $$
BEGIN
	IF to_regclass('public.idem_keys') IS NOT NULL THEN
		RAISE NOTICE '% finds % held-ddl record(s)', tg_tag,
			(SELECT count(*) FROM public.idem_keys WHERE operation = 'held-ddl');
	END IF;
END $$;
CREATE EVENT TRIGGER held_ddl_sees ON ddl_command_start
	WHEN TAG IN ('ALTER TABLE', 'DROP TABLE', 'DROP EXTENSION', 'ALTER EXTENSION', 'CREATE INDEX')
	EXECUTE FUNCTION held_ddl_sees();
-- RENAME: the record is written into the table, which keeps it renamed
BEGIN;
SELECT outcome FROM idem_reserve('held-ddl', 'rename');
INSERT INTO held_effects VALUES ('rename', 'ddl');
ALTER TABLE idem_keys RENAME TO idem_keys_renamed;
COMMIT;
SELECT key, status FROM idem_keys_renamed WHERE operation = 'held-ddl';
ALTER TABLE idem_keys_renamed RENAME TO idem_keys;
SELECT outcome FROM idem_reserve('held-ddl', 'rename') AS retried;
-- SET SCHEMA
CREATE SCHEMA held_elsewhere;
BEGIN;
SELECT outcome FROM idem_reserve('held-ddl', 'schema');
INSERT INTO held_effects VALUES ('schema', 'ddl');
ALTER TABLE idem_keys SET SCHEMA held_elsewhere;
COMMIT;
SELECT key, status FROM held_elsewhere.idem_keys WHERE operation = 'held-ddl' ORDER BY key;
ALTER TABLE held_elsewhere.idem_keys SET SCHEMA public;
DROP SCHEMA held_elsewhere;
SELECT outcome FROM idem_reserve('held-ddl', 'schema') AS retried;
-- ALTER TABLE of other kinds: options, a column added and dropped, a
-- constraint that the record written first must meet
BEGIN;
SELECT outcome FROM idem_reserve('held-ddl', 'alter');
ALTER TABLE idem_keys SET (fillfactor = 90);
ALTER TABLE idem_keys RESET (fillfactor);
COMMIT;
SELECT key, status FROM idem_keys WHERE operation = 'held-ddl' AND key = 'alter';
BEGIN;
SELECT outcome FROM idem_reserve('held-ddl', 'column');
ALTER TABLE idem_keys ADD COLUMN held_extra int;
ALTER TABLE idem_keys DROP COLUMN held_extra;
SELECT idem_complete('held-ddl', 'column', '{"done": 1}');
COMMIT;
SELECT key, status FROM idem_keys WHERE operation = 'held-ddl' AND key = 'column';
BEGIN;
SELECT outcome FROM idem_reserve('held-ddl', 'constraint');
ALTER TABLE idem_keys ADD CONSTRAINT held_no_processing CHECK (status <> 'processing');
ROLLBACK;
-- CREATE INDEX, and CREATE TRIGGER: the trigger sees the completion as an
-- update of the record written first, and nothing runs at COMMIT
CREATE FUNCTION held_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE NOTICE 'trigger: % of %', tg_op, NEW.key;
	RETURN NEW;
END $$;
BEGIN;
SELECT outcome FROM idem_reserve('held-ddl', 'trigger');
CREATE INDEX held_index ON idem_keys (updated_at);
CREATE TRIGGER held_trigger AFTER INSERT OR UPDATE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION held_trigger();
SELECT idem_complete('held-ddl', 'trigger', '{"done": 1}');
ROLLBACK;
-- DROP TABLE and DROP EXTENSION take the record written first with them,
-- as they take any record (rolled back here)
BEGIN;
SELECT outcome FROM idem_reserve('held-ddl', 'drop');
ALTER EXTENSION idempotency DROP TABLE idem_keys;
DROP TABLE idem_keys CASCADE;
ROLLBACK;
BEGIN;
SELECT outcome FROM idem_reserve('held-ddl', 'drop-extension');
DROP EXTENSION idempotency CASCADE;
ROLLBACK;
DROP EVENT TRIGGER held_ddl_sees;
SELECT key, status FROM idem_keys WHERE operation = 'held-ddl' ORDER BY key;

-- 4. idem_lookup answers the same in a parallel query, where it never runs
-- in a worker, and reads a held record through the table's current
-- descriptor (a column dropped and added again)
SELECT proparallel FROM pg_proc WHERE proname = 'idem_lookup';
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
	THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'on', false) AS parallel;
BEGIN;
SELECT outcome FROM idem_reserve('held-lookup', 'k1');
SELECT key, status FROM idem_lookup('held-lookup', 'k1');
ROLLBACK;
SELECT set_config(CASE WHEN current_setting('server_version_num')::int >= 160000
	THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END, 'off', false) AS parallel;
BEGIN;
ALTER TABLE idem_keys DROP COLUMN resource_id;
ALTER TABLE idem_keys ADD COLUMN resource_id text;
SELECT outcome FROM idem_reserve('held-lookup', 'k2');
SELECT key, status, resource_id, ttl FROM idem_lookup('held-lookup', 'k2');
ROLLBACK;

-- 5. An index of the owner's with the name of the install script's is not
-- taken for it: its predicate refuses the reservation itself, not the COMMIT
-- after the effect; so does a CHECK constraint under the install script's
-- name
BEGIN;
DROP INDEX idem_keys_processing_idx;
CREATE INDEX idem_keys_processing_idx ON idem_keys (created_at)
	WHERE status = 'processing' AND (key <> 'abc' OR 1 / (length(key) - 3) > 0);
SELECT outcome FROM idem_reserve('held-rules', 'abc');
ROLLBACK;
BEGIN;
ALTER TABLE idem_keys DROP CONSTRAINT idem_keys_status_check;
ALTER TABLE idem_keys ADD CONSTRAINT idem_keys_status_check
	CHECK (status IN ('processing', 'completed', 'stuck')
		AND (key <> 'abc' OR 1 / (length(key) - 3) > 0)) NOT VALID;
SELECT outcome FROM idem_reserve('held-rules', 'abc');
ROLLBACK;
-- the install script's own definitions under other names are held
BEGIN;
ALTER INDEX idem_keys_processing_idx RENAME TO held_renamed_idx;
ALTER TABLE idem_keys RENAME CONSTRAINT idem_keys_status_check TO held_renamed_check;
SELECT outcome FROM idem_reserve('held-rules', 'renamed');
SELECT count(*) AS written FROM idem_keys WHERE operation = 'held-rules';
ROLLBACK;

-- 6. idem_consume is never born expired: its expiry counts from COMMIT, so
-- a redelivery right after a transaction that outlasted the ttl is still a
-- duplicate
BEGIN;
SELECT idem_consume('held-consumer', 'm1', ttl => '1 second') AS first;
SELECT idem_consume('held-consumer', 'm1', ttl => '1 second') AS again_in_it;
SELECT pg_sleep(1.5);
COMMIT;
SELECT idem_consume('held-consumer', 'm1', ttl => '1 second') AS redelivered;
SELECT expires_at - updated_at AS ttl, updated_at - created_at >= interval '1.5 seconds' AS written_at_commit
FROM idem_keys WHERE scope = 'idem:consume' AND operation = 'held-consumer';
DELETE FROM idem_keys WHERE operation = 'held-consumer';
-- ... and so is one written before COMMIT, which COMMIT writes again with
-- its expiry counted from then: a redelivery renewing its message's expired
-- record not yet swept, more than 16 in a transaction (the 16th held one is
-- held-many's m15; m16 and m17 are written at once), held ones written
-- before the transaction's DDL, and inside a
-- security-restricted operation (CREATE MATERIALIZED VIEW)
SELECT idem_consume('held-renewed', 'm1', ttl => '1 hour');
UPDATE idem_keys SET expires_at = clock_timestamp() - interval '1 minute'
WHERE scope = 'idem:consume' AND operation = 'held-renewed';
BEGIN;
SELECT idem_consume('held-renewed', 'm1', ttl => '1 hour') AS renewed;
SELECT idem_consume('held-before-ddl', 'm1', ttl => '1 hour') AS consumed;
SELECT count(*) FILTER (WHERE idem_consume('held-many', 'm' || i, ttl => '1 hour')) AS consumed
FROM generate_series(1, 17) AS i;
CREATE TEMPORARY TABLE held_ddl_after_consume ();
CREATE MATERIALIZED VIEW held_consume_mv AS
	SELECT idem_consume('held-restricted', 'm1', ttl => '1 hour') AS consumed;
SELECT pg_sleep(1.5);
COMMIT;
SELECT operation, count(*) AS records,
	count(*) FILTER (WHERE expires_at - updated_at = interval '1 hour'
					 AND updated_at - created_at >= interval '1.5 seconds') AS counted_from_commit
FROM idem_keys WHERE scope = 'idem:consume' AND operation LIKE 'held-%'
GROUP BY operation ORDER BY operation;
DROP MATERIALIZED VIEW held_consume_mv;
-- a rolled-back savepoint takes the 17th with it
BEGIN;
SELECT count(*) FILTER (WHERE idem_consume('held-savepoint', 'm' || i)) AS consumed
FROM generate_series(1, 16) AS i;
SAVEPOINT s;
SELECT idem_consume('held-savepoint', 'm17') AS consumed;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) AS records FROM idem_keys WHERE operation = 'held-savepoint';
-- On a table with a trigger of its owner's, which the commit never runs,
-- the expiry stays counted from the call, and a record that would be
-- expired at COMMIT fails the COMMIT
CREATE TRIGGER held_trigger AFTER INSERT ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION held_trigger();
BEGIN;
SELECT idem_consume('held-owner-rules', 'm1', ttl => '0.2 seconds') AS consumed;
SELECT pg_sleep(0.3);
COMMIT;
BEGIN;
SELECT idem_consume('held-owner-rules', 'm2', ttl => '1 hour') AS consumed;
COMMIT;
DROP TRIGGER held_trigger ON idem_keys;
SELECT key, expires_at - created_at AS ttl FROM idem_keys WHERE operation = 'held-owner-rules';

-- The write at COMMIT checks no privilege beyond the consumer's INSERT: a
-- role that may read and insert into idem_keys and not update it commits 17
-- messages (m16 and m17 written at once and again at COMMIT), after SET
-- ROLE and through a SECURITY DEFINER function it owns, called by a role
-- with no right on idem_keys
CREATE ROLE regress_held_consumer;
GRANT SELECT, INSERT ON idem_keys TO regress_held_consumer;
GRANT EXECUTE ON FUNCTION idem_consume(text, text, interval, boolean) TO regress_held_consumer;
CREATE FUNCTION held_consume_many(op text) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp
AS $$ SELECT count(*) FILTER (WHERE idem_consume(op, 'm' || i, ttl => '1 hour')) FROM generate_series(1, 17) AS i $$;
ALTER FUNCTION held_consume_many(text) OWNER TO regress_held_consumer;
REVOKE EXECUTE ON FUNCTION held_consume_many(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION held_consume_many(text) TO regress_held_app;
BEGIN;
SET LOCAL ROLE regress_held_consumer;
SELECT held_consume_many('held-insert-only') AS consumed;
SELECT pg_sleep(0.3);
COMMIT;
BEGIN;
SET LOCAL ROLE regress_held_app;
SELECT held_consume_many('held-insert-only-definer') AS consumed;
SELECT pg_sleep(0.3);
COMMIT;
SELECT operation, count(*) AS records,
	count(*) FILTER (WHERE expires_at - updated_at = interval '1 hour'
					 AND updated_at - created_at >= interval '0.3 seconds') AS counted_from_commit
FROM idem_keys WHERE scope = 'idem:consume' AND operation LIKE 'held-insert-only%'
GROUP BY operation ORDER BY operation;
DROP FUNCTION held_consume_many(text);
REVOKE ALL ON idem_keys FROM regress_held_consumer;
REVOKE ALL ON FUNCTION idem_consume(text, text, interval, boolean) FROM regress_held_consumer;
DROP ROLE regress_held_consumer;

DELETE FROM idem_keys WHERE operation LIKE 'held-%';
DROP TABLE held_effects;
DROP FUNCTION held_pay(text, boolean), held_finish(text), held_ddl_sees(), held_trigger();
REVOKE ALL ON idem_keys FROM regress_held_owner, regress_held_app;
REVOKE ALL ON FUNCTION idem_reserve(text, text, jsonb, text, interval),
	idem_complete(text, text, jsonb, integer, text, text) FROM regress_held_owner, regress_held_app;
DROP ROLE regress_held_owner, regress_held_app;
