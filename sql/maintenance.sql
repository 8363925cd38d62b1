-- Maintenance from SQL: idem_sweep, idem_flag_stuck, idem_set_reconciler,
-- idem_reconcile, idem_maintain and the idem_stuck view.  Everything below
-- lives in scopes 'mt' and 'nb'.
--
-- The server's worker may be running, and every count printed here is
-- this session's alone:
--	- a record made expired here is made so in the same transaction as the
--	  sweep that counts it, which the worker cannot see before that
--	  transaction commits;
--	- the worker reads this database's processing_timeout, set to one day
--	  below, and so never flags the records made 10 or 20 minutes old here
--	  (this session's is 5 minutes); older ones are made so in the same
--	  transaction as the flagging that counts them;
--	- the reconcilers below decide only in this session (mt.session): a
--	  call from the worker leaves the record stuck; and idem_reconcile
--	  runs here with the records locked first (the worker skips a record
--	  another transaction locks, and so would idem_reconcile).

-- Needs the library preloaded (shared_preload_libraries): against a stock
-- server this test skips itself (expected/maintenance_1.out)
SELECT pg_catalog.current_setting('shared_preload_libraries')
	!~ '(^|[\s,"])idempotency($|[\s,"])' AS skip_test \gset
\if :skip_test
\echo skipped: the server does not preload idempotency (shared_preload_libraries)
\quit
\endif
\pset null '(null)'
SET client_min_messages = warning;
SELECT pg_catalog.current_database() AS db \gset
ALTER DATABASE :"db" SET idempotency.processing_timeout = '1d';
-- (a visit of the worker that began before that reads the old one: wait
-- for it to end)
DO $$
BEGIN
	WHILE EXISTS (SELECT FROM pg_catalog.pg_stat_activity
				  WHERE backend_type = 'idempotency worker'
				  AND datname = pg_catalog.current_database()) LOOP
		PERFORM pg_catalog.pg_sleep(0.01);
	END LOOP;
END $$;
SET idempotency.processing_timeout = '5min';
SET mt.session = 'test';
-- The reconcilers registered here run as the superuser running the test,
-- which the operator must allow (sql/reconcilers.sql shows the default)
SET idempotency.enable_superuser_reconcilers = on;

-- Settle what earlier tests left behind, so that the counts below are ours
SELECT idem_sweep() >= 0 AS swept, idem_flag_stuck() >= 0 AS flagged;

-- The settings the SQL functions share with the worker, and their
-- defaults (this server's own values are its operator's)
SELECT name, boot_val, unit, context FROM pg_settings
WHERE name IN ('idempotency.sweep_interval', 'idempotency.sweep_batch_size',
			   'idempotency.max_workers')
ORDER BY name;
-- They are server settings: a session cannot change them
SET idempotency.sweep_batch_size = 5;

-- Fixtures: completed records, some expired; processing and stuck records
-- whose expires_at has passed too (they never expire)
SELECT count(*) FROM (
  SELECT idem_reserve(op, k, scope => 'mt', ttl => '1 hour'),
         idem_complete(op, k, '{"ok": true}', scope => 'mt')
  FROM (VALUES ('mt-pay', 'c1'), ('mt-pay', 'c2'), ('mt-ship', 'c3'),
               ('mt-pay', 'live')) v(op, k)) s;
SELECT outcome FROM idem_reserve('mt-pay', 'proc-old', scope => 'mt', ttl => '1 hour');
SELECT outcome FROM idem_reserve('mt-pay', 'stuck-old', scope => 'mt', ttl => '1 hour');
BEGIN;
UPDATE idem_keys SET expires_at = now() - interval '1 minute'
WHERE scope = 'mt' AND key <> 'live';
UPDATE idem_keys SET status = 'stuck' WHERE scope = 'mt' AND key = 'stuck-old';

-- idem_sweep deletes the expired completed records, and only those
SELECT idem_sweep();
SELECT operation, key, status FROM idem_keys WHERE scope = 'mt' ORDER BY key;
SELECT idem_sweep();
COMMIT;

-- Any batch size deletes them all, batch after batch
SELECT count(*) FROM (
  SELECT idem_reserve('mt-pay', 'b' || i, scope => 'mt', ttl => '1 hour'),
         idem_complete('mt-pay', 'b' || i, scope => 'mt')
  FROM generate_series(1, 5) i) s;
BEGIN;
UPDATE idem_keys SET expires_at = now() - interval '1 minute' WHERE scope = 'mt' AND key LIKE 'b%';
SELECT idem_sweep(2);
COMMIT;
SELECT count(*) FROM idem_keys WHERE scope = 'mt' AND key LIKE 'b%';
-- Inside a transaction that rolls back, nothing is deleted
SELECT count(*) FROM (
  SELECT idem_reserve('mt-pay', 'rb', scope => 'mt', ttl => '1 hour'),
         idem_complete('mt-pay', 'rb', scope => 'mt')) s;
BEGIN;
UPDATE idem_keys SET expires_at = now() - interval '1 minute' WHERE scope = 'mt' AND key = 'rb';
SAVEPOINT s;
SELECT idem_sweep(1);
ROLLBACK TO s;
SELECT count(*) FROM idem_keys WHERE scope = 'mt' AND key = 'rb';
SELECT idem_sweep(NULL);
COMMIT;

-- Bad batch sizes
SELECT idem_sweep(0);
SELECT idem_sweep(-1);
-- Not in a read-only transaction
BEGIN READ ONLY;
SELECT idem_sweep();
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_flag_stuck();
ROLLBACK;

-- Objects on search_path cannot redirect the sweep
CREATE SCHEMA mt_evil;
CREATE TABLE mt_evil.idem_keys (LIKE idem_keys);
INSERT INTO mt_evil.idem_keys SELECT * FROM idem_keys WHERE scope = 'mt';
UPDATE mt_evil.idem_keys SET status = 'completed', expires_at = now() - interval '1 day';
SELECT count(*) FROM (
  SELECT idem_reserve('mt-pay', 'sp', scope => 'mt', ttl => '1 hour'),
         idem_complete('mt-pay', 'sp', scope => 'mt')) s;
BEGIN;
UPDATE idem_keys SET expires_at = now() - interval '1 minute' WHERE scope = 'mt' AND key = 'sp';
SET search_path = mt_evil, public;
SELECT public.idem_sweep();
RESET search_path;
COMMIT;
SELECT count(*) FROM mt_evil.idem_keys;
DROP SCHEMA mt_evil CASCADE;

-- idem_stuck shows records whose outcome is unknown: flagged, or processing
-- longer than processing_timeout (not yet flagged)
SELECT outcome FROM idem_reserve('mt-pay', 'young', scope => 'mt');
UPDATE idem_keys SET updated_at = now() - interval '10 minutes'
WHERE scope = 'mt' AND key = 'proc-old';
SELECT operation, key, flagged, idle_for >= interval '10 minutes' AS old, reconciler
FROM idem_stuck WHERE scope = 'mt' ORDER BY key;
-- The timeout is the session's: with one hour, proc-old is not overdue
SET idempotency.processing_timeout = '1h';
SELECT key FROM idem_stuck WHERE scope = 'mt' ORDER BY key;
SELECT idem_flag_stuck();
-- With five minutes it is: idem_flag_stuck flags it, and only it
SET idempotency.processing_timeout = '5min';
SELECT idem_flag_stuck();
SELECT key, status FROM idem_keys WHERE scope = 'mt' ORDER BY key;
SELECT idem_flag_stuck();
SELECT key, flagged FROM idem_stuck WHERE scope = 'mt' ORDER BY key;
-- updated_at keeps the last heartbeat; idem_reserve answers stuck
SELECT updated_at < now() - interval '9 minutes' AS heartbeat_kept
FROM idem_keys WHERE scope = 'mt' AND key = 'proc-old';
SELECT outcome, http_status FROM idem_reserve('mt-pay', 'proc-old', scope => 'mt');
-- A checkpoint is a heartbeat: the record goes back to processing
SELECT idem_checkpoint('mt-pay', 'proc-old', 'step-2', 'mt');
SELECT key, status, recovery_point FROM idem_keys WHERE scope = 'mt' AND key = 'proc-old';
-- Flagging in a transaction that rolls back changes nothing
UPDATE idem_keys SET updated_at = now() - interval '10 minutes'
WHERE scope = 'mt' AND key = 'proc-old';
BEGIN;
SELECT idem_flag_stuck();
ROLLBACK;
SELECT status FROM idem_keys WHERE scope = 'mt' AND key = 'proc-old';
SELECT idem_flag_stuck();
SELECT idem_release('mt-pay', k, 'mt') FROM (VALUES ('proc-old'), ('stuck-old')) v(k);

-- Stuck detection reads the processing records through
-- idem_keys_processing_idx, never the whole table
SELECT outcome FROM idem_reserve('mt-pay', 'ix-old', scope => 'mt');
UPDATE idem_keys SET updated_at = now() - interval '10 minutes'
WHERE scope = 'mt' AND key = 'ix-old';
-- (the counts of this backend not yet reported: none is while a
-- transaction block is open)
BEGIN;
SELECT pg_stat_get_xact_numscans('idem_keys'::regclass) AS seq_before,
       pg_stat_get_xact_numscans('idem_keys_processing_idx'::regclass) AS index_before
\gset
SELECT idem_flag_stuck();
SELECT pg_stat_get_xact_numscans('idem_keys'::regclass) - :seq_before AS seq_scans,
       pg_stat_get_xact_numscans('idem_keys_processing_idx'::regclass) - :index_before
         AS index_scans;
ROLLBACK;
-- It is found by its definition, whatever its name
BEGIN;
ALTER INDEX idem_keys_processing_idx RENAME TO mt_renamed_idx;
SELECT idem_flag_stuck();
ROLLBACK;
-- Without it (an index with another predicate does not serve), stuck
-- detection reads the whole table, as it did before the index existed
BEGIN;
DROP INDEX idem_keys_processing_idx;
CREATE INDEX mt_stuck_idx ON idem_keys (created_at) WHERE status = 'stuck';
SELECT pg_stat_get_xact_numscans('idem_keys'::regclass) AS seq_before,
       pg_stat_get_xact_numscans('mt_stuck_idx'::regclass) AS index_before
\gset
SELECT idem_flag_stuck();
SELECT pg_stat_get_xact_numscans('idem_keys'::regclass) - :seq_before AS seq_scans,
       pg_stat_get_xact_numscans('mt_stuck_idx'::regclass) - :index_before AS index_scans;
ROLLBACK;
SELECT idem_flag_stuck();
SELECT idem_release('mt-pay', 'ix-old', 'mt');

-- Reconcilers: a function of the stuck record that settles it
CREATE TABLE mt_calls (key text, caller name);
CREATE FUNCTION mt_reconcile(r idem_keys) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	-- a call from the server's worker decides nothing
	IF pg_catalog.current_setting('mt.session', true) IS DISTINCT FROM 'test' THEN
		RETURN;
	END IF;
	INSERT INTO public.mt_calls VALUES (r.key, current_user);
	IF r.key LIKE 'paid%' THEN
		-- the gateway says the charge went through: complete with its result
		PERFORM public.idem_complete(r.operation, r.key, '{"reconciled": true}', 201, 'ch_1', r.scope);
	ELSIF r.key LIKE 'void%' THEN
		-- nothing happened: release, so that a retry runs again
		PERFORM public.idem_release(r.operation, r.key, r.scope);
	ELSIF r.key LIKE 'boom%' THEN
		RAISE EXCEPTION 'gateway unreachable for %', r.key;
	END IF;
	-- anything else: undecided, stays stuck and is tried again next pass
END
$$;

-- Registering validates the handler
SELECT idem_set_reconciler(NULL, 'mt_reconcile(idem_keys)');
SELECT idem_set_reconciler('', 'mt_reconcile(idem_keys)');
CREATE FUNCTION mt_text(t text) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SELECT idem_set_reconciler('mt-pay', 'mt_text(text)');
CREATE FUNCTION mt_two(r idem_keys, x int) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SELECT idem_set_reconciler('mt-pay', 'mt_two(idem_keys, int)');
CREATE FUNCTION mt_set(r idem_keys) RETURNS SETOF int LANGUAGE sql AS $$ SELECT 1 $$;
SELECT idem_set_reconciler('mt-pay', 'mt_set(idem_keys)');
CREATE PROCEDURE mt_proc(r idem_keys) LANGUAGE sql AS $$ SELECT $$;
SELECT idem_set_reconciler('mt-pay', 'mt_proc(idem_keys)');
SELECT idem_set_reconciler('mt-pay', 'mt_missing(idem_keys)');
SELECT count(*) FROM idem_reconcilers;
-- Removing a reconciler that is not registered is a no-op
SELECT idem_set_reconciler('mt-pay', NULL);

SELECT idem_set_reconciler('mt-pay', 'mt_reconcile(idem_keys)');
SELECT operation, handler, run_as = current_user::regrole AS runs_as_me FROM idem_reconcilers;
-- Registering again replaces
SELECT idem_set_reconciler('mt-pay', 'mt_two(idem_keys, int)');
SELECT idem_set_reconciler('mt-pay', 'mt_set(idem_keys)');
SELECT idem_set_reconciler('mt-pay', 'mt_reconcile(idem_keys)');
SELECT operation, handler FROM idem_reconcilers;

-- Four stuck records of mt-pay and one of an operation without reconciler
SELECT count(*) FROM (
  SELECT idem_reserve(op, k, scope => 'mt')
  FROM (VALUES ('mt-pay', 'paid-1'), ('mt-pay', 'void-1'), ('mt-pay', 'boom-1'),
               ('mt-pay', 'wait-1'), ('mt-ship', 'paid-2')) v(op, k)) s;
UPDATE idem_keys SET updated_at = now() - interval '10 minutes'
WHERE scope = 'mt' AND key IN ('paid-1', 'void-1', 'boom-1', 'wait-1', 'paid-2');
SELECT idem_flag_stuck();
SELECT key, flagged, reconciler FROM idem_stuck WHERE scope = 'mt' ORDER BY key;

-- idem_reconcile calls it once per stuck record of mt-pay; the one that
-- raises is reported as a WARNING naming the key, and the others go on
BEGIN;
SELECT FROM idem_keys WHERE scope = 'mt' FOR UPDATE \g /dev/null
SELECT idem_reconcile();
COMMIT;
SELECT key, caller = current_user AS as_registrant FROM mt_calls ORDER BY key;
SELECT key, status, response_status, response, resource_id
FROM idem_keys WHERE scope = 'mt' AND key IN ('paid-1', 'void-1', 'boom-1', 'wait-1', 'paid-2')
ORDER BY key;
-- The settled records replay or run again
SELECT outcome, http_status, response FROM idem_reserve('mt-pay', 'paid-1', scope => 'mt');
SELECT outcome FROM idem_reserve('mt-pay', 'void-1', scope => 'mt');
SELECT idem_release('mt-pay', 'void-1', 'mt');
TRUNCATE mt_calls;

-- A reconciler runs as the role that registered it, with that role's rights
SELECT outcome FROM idem_reserve('mt-pay', 'paid-4', scope => 'mt');
UPDATE idem_keys SET updated_at = now() - interval '20 minutes'
WHERE scope = 'mt' AND key = 'paid-4';
SELECT idem_flag_stuck();
CREATE ROLE regress_idem_reconciler;
GRANT USAGE ON SCHEMA public TO regress_idem_reconciler;
GRANT EXECUTE ON FUNCTION idem_set_reconciler(text, regprocedure), mt_reconcile(idem_keys)
	TO regress_idem_reconciler;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_reconcilers TO regress_idem_reconciler;
GRANT INSERT ON mt_calls TO regress_idem_reconciler;
SET ROLE regress_idem_reconciler;
SELECT idem_set_reconciler('mt-pay', 'mt_reconcile(idem_keys)');
RESET ROLE;
SELECT operation, run_as FROM idem_reconcilers;
-- Write access to idem_reconcilers does not lend another role's rights:
-- a row may only name a role its writer can become
\set VERBOSITY terse
SET ROLE regress_idem_reconciler;
-- (the message names the bootstrap superuser, whatever its name: the SQLSTATE only)
\set VERBOSITY sqlstate
UPDATE idem_reconcilers SET run_as = (SELECT oid FROM pg_roles WHERE rolname = session_user)::regrole;
\set VERBOSITY terse
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('mt-other', 'public.mt_reconcile(public.idem_keys)', current_user::regrole);
DELETE FROM idem_reconcilers WHERE operation = 'mt-other';
RESET ROLE;
\set VERBOSITY default
-- That role may not execute idem_complete: paid-4 fails as that role, while
-- the undecided wait-1 is called (and boom-1 raises, as before)
BEGIN;
SELECT FROM idem_keys WHERE scope = 'mt' FOR UPDATE \g /dev/null
SELECT idem_reconcile();
COMMIT;
SELECT key, caller FROM mt_calls ORDER BY key;
SELECT key, status FROM idem_keys WHERE scope = 'mt' AND key IN ('paid-4', 'boom-1', 'wait-1')
ORDER BY key;
-- Registering needs EXECUTE on the handler
REVOKE EXECUTE ON FUNCTION mt_reconcile(idem_keys) FROM regress_idem_reconciler;
REVOKE EXECUTE ON FUNCTION mt_reconcile(idem_keys) FROM PUBLIC;
SET ROLE regress_idem_reconciler;
SELECT idem_set_reconciler('mt-pay', 'mt_reconcile(idem_keys)');
RESET ROLE;
-- ... and so does each call: the registration made earlier now fails
BEGIN;
SELECT FROM idem_keys WHERE scope = 'mt' FOR UPDATE \g /dev/null
SELECT idem_reconcile();
COMMIT;
TRUNCATE mt_calls;
-- Registered again by the superuser, paid-4 completes
SELECT idem_set_reconciler('mt-pay', 'mt_reconcile(idem_keys)');
BEGIN;
SELECT FROM idem_keys WHERE scope = 'mt' FOR UPDATE \g /dev/null
SELECT idem_reconcile();
COMMIT;
SELECT key, status FROM idem_keys WHERE scope = 'mt' AND key IN ('paid-4', 'boom-1', 'wait-1')
ORDER BY key;
SELECT idem_release('mt-pay', k, 'mt') FROM (VALUES ('boom-1'), ('wait-1')) v(k);
TRUNCATE mt_calls;

-- A dropped handler is reported, not fatal
CREATE FUNCTION mt_gone(r idem_keys) RETURNS void LANGUAGE sql AS $$ SELECT $$;
SELECT idem_set_reconciler('mt-ship', 'mt_gone(idem_keys)');
DROP FUNCTION mt_gone(idem_keys);
BEGIN;
SELECT FROM idem_keys WHERE scope = 'mt' FOR UPDATE \g /dev/null
SELECT idem_reconcile();
COMMIT;
SELECT idem_set_reconciler('mt-ship', NULL);
SELECT operation FROM idem_reconcilers;

-- CALL idem_maintain(): sweep, flag and reconcile in one pass, committing
-- as it goes (the worker's pass)
SELECT count(*) FROM (
  SELECT idem_reserve('mt-pay', k, scope => 'mt', ttl => '1 hour')
  FROM (VALUES ('m-expired'), ('paid-3'), ('void-3')) v(k)) s;
SELECT idem_complete('mt-pay', 'm-expired', scope => 'mt');
UPDATE idem_keys SET expires_at = now() - interval '1 minute'
WHERE scope = 'mt' AND key = 'm-expired';
UPDATE idem_keys SET updated_at = now() - interval '10 minutes'
WHERE scope = 'mt' AND key IN ('paid-3', 'void-3');
-- Inside a transaction block it cannot commit: all or nothing
BEGIN;
CALL idem_maintain();
ROLLBACK;
SELECT key, status FROM idem_keys WHERE scope = 'mt' AND key IN ('m-expired', 'paid-3', 'void-3')
ORDER BY key;
CALL idem_maintain();
SELECT key, status FROM idem_keys WHERE scope = 'mt' AND key IN ('m-expired', 'paid-3', 'void-3')
ORDER BY key;
SELECT key FROM mt_calls ORDER BY key;

-- One record whose write fails never stops the rest: a BEFORE trigger of
-- the owner that refuses it, or a CHECK ... NOT VALID that an old row
-- fails, is a WARNING naming its key, and the other records are flagged
-- and swept (scope 'nb', so that the counts of 'mt' above stay as they are)
SELECT count(*) FROM (
  SELECT idem_reserve('nb-pay', k, scope => 'nb', ttl => '1 hour')
  FROM (VALUES ('a'), ('bad'), ('c')) v(k)) s;
UPDATE idem_keys SET updated_at = now() - interval '10 minutes' WHERE scope = 'nb';
CREATE FUNCTION nb_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF OLD.key = 'bad' AND (TG_OP = 'DELETE' OR NEW.status = 'stuck') THEN
		RAISE EXCEPTION 'record % is under audit', OLD.key;
	END IF;
	RETURN COALESCE(NEW, OLD);
END $$;
CREATE TRIGGER nb_refuse BEFORE UPDATE OR DELETE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION nb_refuse();
SELECT idem_flag_stuck();
SELECT key, status FROM idem_keys WHERE scope = 'nb' ORDER BY key;
SELECT idem_complete('nb-pay', k, scope => 'nb') FROM (VALUES ('a'), ('bad'), ('c')) v(k);
BEGIN;
UPDATE idem_keys SET expires_at = now() - interval '1 minute' WHERE scope = 'nb';
SELECT idem_sweep();
COMMIT;
SELECT key, status FROM idem_keys WHERE scope = 'nb' ORDER BY key;
-- The worker's pass from SQL goes on too: 'bad' stays, 'd' is flagged
SELECT outcome FROM idem_reserve('nb-pay', 'd', scope => 'nb');
UPDATE idem_keys SET updated_at = now() - interval '10 minutes' WHERE scope = 'nb' AND key = 'd';
-- (in a transaction block, which it does not commit, with the records
-- locked first: the worker skips them meanwhile)
BEGIN;
SELECT count(*) AS locked FROM (SELECT FROM idem_keys WHERE scope = 'nb' FOR UPDATE) s;
CALL idem_maintain();
COMMIT;
SELECT key, status FROM idem_keys WHERE scope = 'nb' ORDER BY key;
BEGIN;
DROP TRIGGER nb_refuse ON idem_keys;
DROP FUNCTION nb_refuse();
SELECT idem_sweep() >= 1 AS swept;
COMMIT;
SELECT idem_release('nb-pay', 'd', 'nb');
-- A CHECK added NOT VALID, which an old record fails: that record is
-- left processing, the other one is flagged
SELECT count(*) FROM (
  SELECT idem_reserve('nb-pay', k, scope => 'nb')
  FROM (VALUES ('old'), ('e')) v(k)) s;
UPDATE idem_keys SET updated_at = now() - interval '10 minutes' WHERE scope = 'nb';
ALTER TABLE idem_keys ADD CONSTRAINT nb_no_old CHECK (key <> 'old' OR scope <> 'nb') NOT VALID;
SELECT idem_flag_stuck();
SELECT key, status FROM idem_keys WHERE scope = 'nb' ORDER BY key;
ALTER TABLE idem_keys DROP CONSTRAINT nb_no_old;
DELETE FROM idem_keys WHERE scope = 'nb';

-- A heartbeat of -infinity is older than any timeout: stuck, as any
-- processing record past idempotency.processing_timeout, for idem_reserve,
-- idem_stuck and idem_flag_stuck alike
SELECT outcome FROM idem_reserve('nb-pay', 'inf', scope => 'nb');
BEGIN;
UPDATE idem_keys SET updated_at = '-infinity' WHERE scope = 'nb' AND key = 'inf';
SELECT key, flagged FROM idem_stuck WHERE scope = 'nb';
SELECT idem_flag_stuck();
SELECT key, status FROM idem_keys WHERE scope = 'nb';
COMMIT;
SELECT outcome FROM idem_reserve('nb-pay', 'inf', scope => 'nb');
DELETE FROM idem_keys WHERE scope = 'nb';

-- Each reconciler call has a time limit, idempotency.reconciler_timeout:
-- one that runs longer is cancelled with a WARNING naming the key, and the
-- record stays stuck.  Only a superuser sets it (per database with ALTER
-- DATABASE ... SET, which the worker reads)
CREATE FUNCTION nb_slow(r idem_keys) RETURNS void LANGUAGE sql
	AS $$SELECT pg_catalog.pg_sleep(30)
		WHERE pg_catalog.current_setting('mt.session', true) = 'test'$$;
SELECT idem_set_reconciler('nb-slow', 'nb_slow(idem_keys)');
SELECT outcome FROM idem_reserve('nb-slow', 's1', scope => 'nb');
UPDATE idem_keys SET status = 'stuck' WHERE scope = 'nb';
SELECT boot_val, unit, context FROM pg_settings WHERE name = 'idempotency.reconciler_timeout';
SET idempotency.reconciler_timeout = '200ms';
SELECT clock_timestamp() AS before_reconcile \gset
SELECT idem_reconcile();
SELECT clock_timestamp() - :'before_reconcile' < interval '10 seconds' AS quick;
SELECT key, status FROM idem_keys WHERE scope = 'nb';
RESET idempotency.reconciler_timeout;
SET ROLE regress_idem_reconciler;
SET idempotency.reconciler_timeout = '1h';
RESET ROLE;
SELECT idem_set_reconciler('nb-slow', NULL);
DROP FUNCTION nb_slow(idem_keys);
DELETE FROM idem_keys WHERE scope = 'nb';
-- ... and no reconciler can disarm it: a maintenance function called from
-- inside a reconciler is refused (caught here, as a careless reconciler
-- would), and the call is still cancelled at its limit
CREATE FUNCTION nb_nested(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	-- (a call nested in another returns at once, should one be made)
	IF pg_catalog.current_setting('mt.session', true) IS DISTINCT FROM 'test'
		OR pg_catalog.current_setting('nb.nested', true) = 'on' THEN
		RETURN;
	END IF;
	PERFORM pg_catalog.set_config('nb.nested', 'on', true);
	BEGIN
		IF r.key = 'n1' THEN
			PERFORM public.idem_reconcile();
		ELSE
			CALL public.idem_maintain();
		END IF;
	EXCEPTION WHEN object_not_in_prerequisite_state THEN
		RAISE WARNING 'refused: %', SQLERRM;
	END;
	PERFORM pg_catalog.pg_sleep(5);
END $$;
SELECT idem_set_reconciler('nb-nested', 'nb_nested(idem_keys)');
SELECT count(*) FROM (
  SELECT idem_reserve('nb-nested', k, scope => 'nb') FROM (VALUES ('n1'), ('n2')) v(k)) s;
UPDATE idem_keys SET status = 'stuck' WHERE scope = 'nb';
SET idempotency.reconciler_timeout = '200ms';
SELECT clock_timestamp() AS before_reconcile \gset
BEGIN;
SELECT FROM idem_keys WHERE scope = 'nb' FOR UPDATE \g /dev/null
SELECT idem_reconcile();
COMMIT;
SELECT clock_timestamp() - :'before_reconcile' < interval '3 seconds' AS quick;
RESET idempotency.reconciler_timeout;
SELECT key, status FROM idem_keys WHERE scope = 'nb' ORDER BY key;
SELECT idem_set_reconciler('nb-nested', NULL);
DROP FUNCTION nb_nested(idem_keys);
DELETE FROM idem_keys WHERE scope = 'nb';

-- The sweep uses only a valid index on expires_at.  A failed CREATE INDEX
-- CONCURRENTLY leaves one that is not valid and lacks entries (here: a
-- unique one that met duplicates); without the extension's own, the sweep
-- reads the table whole with a WARNING instead of trusting it
SELECT count(*) FROM (
  SELECT idem_reserve('nb-pay', k, scope => 'nb')
  FROM (VALUES ('x1'), ('x2')) v(k)) s;
SELECT idem_complete('nb-pay', k, scope => 'nb') FROM (VALUES ('x1'), ('x2')) v(k);
UPDATE idem_keys SET expires_at = '2100-01-01' WHERE scope = 'nb';
\set VERBOSITY terse
CREATE UNIQUE INDEX CONCURRENTLY nb_expires_idx ON idem_keys (expires_at);
\set VERBOSITY default
SELECT indisvalid FROM pg_index WHERE indexrelid = 'nb_expires_idx'::regclass;
BEGIN;
UPDATE idem_keys SET expires_at = '2000-01-01' WHERE scope = 'nb';
DROP INDEX idem_keys_expires_at_idx;
SELECT idem_sweep();
SELECT count(*) FROM idem_keys WHERE scope = 'nb';
COMMIT;
DROP INDEX nb_expires_idx;
CREATE INDEX idem_keys_expires_at_idx ON idem_keys (expires_at);
-- ... and stuck detection only a valid one on (created_at) WHERE status =
-- 'processing': without the extension's own, it reads the table whole
SELECT count(*) FROM (
  SELECT idem_reserve('nb-pay', k, scope => 'nb')
  FROM (VALUES ('y1'), ('y2')) v(k)) s;
UPDATE idem_keys SET created_at = '2001-01-01' WHERE scope = 'nb';
\set VERBOSITY terse
CREATE UNIQUE INDEX CONCURRENTLY nb_processing_idx ON idem_keys (created_at)
	WHERE status = 'processing';
\set VERBOSITY default
BEGIN;
UPDATE idem_keys SET updated_at = '2001-01-01' WHERE scope = 'nb';
DROP INDEX idem_keys_processing_idx;
SELECT idem_flag_stuck();
ROLLBACK;
DROP INDEX nb_processing_idx;
DELETE FROM idem_keys WHERE scope = 'nb';

-- Every deletion and every flag is counted in idem_stats, per operation
-- (the counters are not transactional: the calls rolled back above count too)
SELECT operation, expired, flagged_stuck FROM idem_stats
WHERE operation LIKE 'mt-%' ORDER BY operation;

-- Clean up
SELECT idem_set_reconciler('mt-pay', NULL);
DELETE FROM idem_keys WHERE scope = 'mt';
DROP TABLE mt_calls;
DROP FUNCTION mt_reconcile(idem_keys), mt_text(text), mt_two(idem_keys, int), mt_set(idem_keys);
DROP PROCEDURE mt_proc(idem_keys);
REVOKE ALL ON idem_reconcilers FROM regress_idem_reconciler;
REVOKE ALL ON FUNCTION idem_set_reconciler(text, regprocedure) FROM regress_idem_reconciler;
REVOKE ALL ON SCHEMA public FROM regress_idem_reconciler;
DROP ROLE regress_idem_reconciler;
ALTER DATABASE :"db" RESET idempotency.processing_timeout;
