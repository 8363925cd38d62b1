-- Reconcilers and handlers that no role can turn against the cluster: every
-- attack of issue 12 that one session can make, in at least two variants.
-- Each checks that what the attacker wanted did not happen (no SUPERUSER,
-- no row copied), and that the backend survived (the next query answers).
\pset null '(null)'
-- The server's worker may be running and call the reconcilers registered
-- here between two statements: those that settle a record return at once
-- outside this session (rc.session, set again after each \c), and
-- idem_reconcile and idem_maintain run here with the stuck records locked
-- (rc_locked; idem_maintain in a transaction block, which it does not
-- commit), so that every record is settled by this session's calls and
-- every count printed is this session's.
--
-- As a superuser of its own, not the bootstrap superuser, whose name
-- (postgres, or any other) the output would show; again after each \c.
-- Most reconcilers here run as it, to show that the rule holds even for a
-- superuser, which the operator must allow (8. shows the default)
CREATE ROLE regress_rc_super SUPERUSER;
SET SESSION AUTHORIZATION regress_rc_super;
SET rc.session = 'on';
SET idempotency.enable_superuser_reconcilers = on;

-- A stuck record of operation rc-pay in scope rc
CREATE FUNCTION rc_stuck(k text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	PERFORM public.idem_reserve('rc-pay', k, scope => 'rc');
	-- written now: a reservation held by this transaction is not in the table yet
	PERFORM public.idem_checkpoint('rc-pay', k, NULL, scope => 'rc');
	UPDATE public.idem_keys SET status = 'stuck' WHERE scope = 'rc' AND key = k;
END $$;
-- The stuck records locked by the calling transaction, so that the worker
-- (which skips a record another transaction locks) leaves them to this
-- session's idem_reconcile: SELECT idem_reconcile() FROM rc_locked()
CREATE FUNCTION rc_locked() RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog AS $$
BEGIN
	PERFORM FROM public.idem_keys WHERE scope = 'rc' FOR UPDATE;
END $$;
GRANT EXECUTE ON FUNCTION rc_locked() TO PUBLIC;
CREATE FUNCTION rc_status(k text) RETURNS text LANGUAGE sql AS $$
	SELECT coalesce((SELECT status FROM public.idem_keys WHERE scope = 'rc' AND key = k), 'released')
$$;
CREATE TABLE rc_calls (key text, who name, path text);
GRANT INSERT ON rc_calls TO PUBLIC;

-- A superuser's reconciler that names idem_release without a schema, as a
-- careless one would: it releases the record
CREATE FUNCTION rc_release(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF pg_catalog.current_setting('rc.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	INSERT INTO public.rc_calls VALUES (r.key, current_user, current_setting('search_path'));
	PERFORM idem_release(r.operation, r.key, r.scope);
END $$;

-- doc/security.md's roles: idem_admin registers reconcilers, idem_maint runs the
-- maintenance (and owns a schema of its own)
CREATE ROLE regress_rc_admin;
GRANT EXECUTE ON FUNCTION idem_set_reconciler(text, regprocedure) TO regress_rc_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_reconcilers TO regress_rc_admin;
GRANT EXECUTE ON FUNCTION idem_release(text, text, text) TO regress_rc_admin;
GRANT SELECT, UPDATE, DELETE ON idem_keys TO regress_rc_admin;
CREATE ROLE regress_rc_maint;
GRANT SELECT, UPDATE, DELETE ON idem_keys TO regress_rc_maint;
GRANT SELECT ON idem_reconcilers TO regress_rc_maint;
GRANT EXECUTE ON FUNCTION idem_sweep(integer), idem_flag_stuck(), idem_reconcile() TO regress_rc_maint;
GRANT EXECUTE ON PROCEDURE idem_maintain() TO regress_rc_maint;
CREATE SCHEMA regress_rc_evil AUTHORIZATION regress_rc_maint;

--
-- 1. A handler rewritten to a function of another signature
--
CREATE FUNCTION rc_jsonb(request jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT request $$;
CREATE PROCEDURE rc_proc(r idem_keys) LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION rc_gone(r idem_keys) RETURNS void LANGUAGE sql AS $$ SELECT $$;
GRANT EXECUTE ON FUNCTION rc_release(idem_keys), rc_jsonb(jsonb), rc_gone(idem_keys) TO regress_rc_admin;
GRANT EXECUTE ON PROCEDURE rc_proc(idem_keys) TO regress_rc_admin;
SET ROLE regress_rc_admin;
SELECT idem_set_reconciler('rc-pay', 'rc_release(idem_keys)');
SELECT operation, handler, run_as, registered_by FROM idem_reconcilers;

-- ... through the table: every write is checked, whoever makes it
UPDATE idem_reconcilers SET handler = 'pg_catalog.array_typanalyze(internal)';
UPDATE idem_reconcilers SET handler = 'pg_catalog.int4recv(internal)';
UPDATE idem_reconcilers SET handler = 'public.rc_jsonb(jsonb)';
UPDATE idem_reconcilers SET handler = 'public.rc_proc(public.idem_keys)';
UPDATE idem_reconcilers SET handler = 'public.rc_nothing(public.idem_keys)';
UPDATE idem_reconcilers SET handler = '-';
UPDATE idem_reconcilers SET handler = '1242';
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('rc-other', 'int4recv(internal)', 'regress_rc_admin');
-- ... through the API
SELECT idem_set_reconciler('rc-pay', 'array_typanalyze(internal)');
SELECT idem_set_reconciler('rc-pay', 'int4recv(internal)');
SELECT idem_set_reconciler('rc-pay', 'rc_jsonb(jsonb)');
SELECT idem_set_reconciler('rc-pay', 'rc_proc(idem_keys)');
SELECT idem_set_reconciler('rc-pay', '-');
SELECT idem_set_reconciler('rc-pay', 0::regprocedure);
SELECT idem_set_reconciler('rc-pay', 4000000000::oid::regprocedure);
-- A row may name whatever it likes as its registrar: the writer is recorded
UPDATE idem_reconcilers SET registered_by = (SELECT oid FROM pg_roles WHERE rolname = session_user)::regrole;
SELECT operation, handler, run_as, registered_by FROM idem_reconcilers;
RESET ROLE;

-- Rows that got past the trigger (a superuser with session_replication_role
-- = replica, a logical replica, a data-only restore with triggers off) are
-- checked at the call: skipped with a WARNING, never called
CREATE FUNCTION rc_force_handler(h text) RETURNS void LANGUAGE sql
SET session_replication_role = replica AS $$
	UPDATE public.idem_reconcilers SET handler = h
$$;
SELECT rc_stuck('h1');
SELECT rc_force_handler('pg_catalog.array_typanalyze(internal)');
SELECT idem_reconcile() FROM rc_locked();
SELECT rc_force_handler('pg_catalog.int4recv(internal)');
BEGIN;
SELECT FROM rc_locked();
CALL idem_maintain();
COMMIT;
SELECT rc_force_handler('public.rc_jsonb(jsonb)');
SELECT idem_reconcile() FROM rc_locked();
SELECT rc_force_handler('public.rc_proc(public.idem_keys)');
SELECT idem_reconcile() FROM rc_locked();
-- A row naming no function at all: PostgreSQL 15's to_regprocedure raises on
-- bad syntax, and the reconciler counts as failed; from 16 on it answers NULL,
-- and the row is skipped as naming no function (reconcilers_1.out)
SELECT rc_force_handler('-');
SELECT idem_reconcile() FROM rc_locked();
SELECT rc_force_handler('no such (syntax');
SELECT idem_reconcile() FROM rc_locked();
-- Many stuck records of one operation: one WARNING per pass, not one each
SELECT rc_stuck('h2'), rc_stuck('h3');
SELECT rc_force_handler('pg_catalog.int4recv(internal)');
SELECT idem_reconcile() FROM rc_locked();
SELECT count(*) AS calls FROM rc_calls;
SELECT rc_status('h1') AS h1, rc_status('h2') AS h2, rc_status('h3') AS h3;

-- DROP FUNCTION of a registered handler: allowed; the registration stays
-- and is skipped with a WARNING until a function of that signature exists
-- again (or another is registered, or it is removed)
SET ROLE regress_rc_admin;
SELECT idem_set_reconciler('rc-pay', 'rc_gone(idem_keys)');
RESET ROLE;
DROP FUNCTION rc_gone(idem_keys);
SELECT handler FROM idem_reconcilers;
SELECT idem_reconcile() FROM rc_locked();
CREATE FUNCTION rc_gone(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF pg_catalog.current_setting('rc.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	PERFORM public.idem_release(r.operation, r.key, r.scope);
END $$;
GRANT EXECUTE ON FUNCTION rc_gone(idem_keys) TO regress_rc_admin;
SELECT idem_reconcile() FROM rc_locked();
SELECT rc_status('h1') AS h1, rc_status('h2') AS h2, rc_status('h3') AS h3;
SELECT 1 AS alive;

--
-- 2. search_path planted to run the attacker's function inside a
--    superuser's reconciler: session, database, for idem_reconcile() and
--    CALL idem_maintain() (the role and the worker: test/t/026_worker_security.pl)
--
SELECT idem_set_reconciler('rc-pay', 'rc_release(idem_keys)');
SET ROLE regress_rc_maint;
CREATE FUNCTION regress_rc_evil.idem_release(operation text, key text, scope text DEFAULT '')
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE regress_rc_maint SUPERUSER;
	RETURN true;
END $$;
RESET ROLE;

-- ... the session's setting
SELECT rc_stuck('p1');
SET ROLE regress_rc_maint;
SET search_path = regress_rc_evil, public;
SELECT idem_reconcile() FROM rc_locked();
BEGIN;
SELECT FROM rc_locked();
CALL idem_maintain();
COMMIT;
RESET search_path;
RESET ROLE;
SELECT rc_stuck('p2');
SET ROLE regress_rc_maint;
SET search_path = regress_rc_evil, public;
BEGIN;
SELECT FROM rc_locked();
CALL idem_maintain();
COMMIT;
RESET search_path;
RESET ROLE;
-- ... a superuser's own session
SELECT rc_stuck('p3');
SET search_path = regress_rc_evil, public;
SELECT idem_reconcile() FROM rc_locked();
RESET search_path;
-- ... the database's setting, in a new session
ALTER DATABASE :"DBNAME" SET search_path = regress_rc_evil, public;
SELECT rc_stuck('p4'), rc_stuck('p5');
\c
SET SESSION AUTHORIZATION regress_rc_super;
SET rc.session = 'on';
SET idempotency.enable_superuser_reconcilers = on;
SHOW search_path;
SELECT idem_reconcile() FROM rc_locked();
\c
SET SESSION AUTHORIZATION regress_rc_super;
SET rc.session = 'on';
SET idempotency.enable_superuser_reconcilers = on;
SELECT rc_stuck('p6');
\c
SET SESSION AUTHORIZATION regress_rc_super;
SET rc.session = 'on';
SET idempotency.enable_superuser_reconcilers = on;
BEGIN;
SELECT FROM rc_locked();
CALL idem_maintain();
COMMIT;
\c
SET SESSION AUTHORIZATION regress_rc_super;
SET rc.session = 'on';
SET idempotency.enable_superuser_reconcilers = on;
ALTER DATABASE :"DBNAME" RESET search_path;
\c
SET SESSION AUTHORIZATION regress_rc_super;
SET rc.session = 'on';
SET idempotency.enable_superuser_reconcilers = on;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rc_maint';
SELECT key, who, path FROM rc_calls WHERE key LIKE 'p%' ORDER BY key;
SELECT count(*) AS still_stuck FROM idem_keys WHERE scope = 'rc' AND key LIKE 'p%';
-- A reconciler that sets its own search_path keeps it
ALTER FUNCTION rc_release(idem_keys) SET search_path = public;
SELECT rc_stuck('p7');
SELECT idem_reconcile() FROM rc_locked();
ALTER FUNCTION rc_release(idem_keys) RESET search_path;
SELECT key, who, path FROM rc_calls WHERE key = 'p7';
-- The caller's settings are back after the pass
SET search_path = public, regress_rc_evil;
SELECT rc_stuck('p8');
SELECT idem_reconcile() FROM rc_locked();
SHOW search_path;
RESET search_path;

-- ... a temporary object of the caller, which pg_temp (searched last for
-- relations) would give the superuser's reconciler: a session with
-- temporary objects only runs reconcilers of roles it may act as
CREATE FUNCTION rc_ledger_check(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF pg_catalog.current_setting('rc.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	PERFORM * FROM rc_ledger;		-- meant: a table on the registrar's path
	PERFORM public.idem_release(r.operation, r.key, r.scope);
END $$;
SELECT idem_set_reconciler('rc-pay', 'rc_ledger_check(idem_keys)');
SET ROLE regress_rc_maint;
CREATE FUNCTION regress_rc_evil.escalate() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE regress_rc_maint SUPERUSER;
	RETURN true;
END $$;
CREATE TEMP VIEW rc_ledger AS SELECT regress_rc_evil.escalate();
RESET ROLE;
SELECT rc_stuck('t1');
SET ROLE regress_rc_maint;
SELECT idem_reconcile() FROM rc_locked();
BEGIN;
SELECT FROM rc_locked();
CALL idem_maintain();
COMMIT;
RESET ROLE;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rc_maint';
SELECT rc_status('t1') AS t1;
DELETE FROM idem_keys WHERE scope = 'rc';
\c
SET SESSION AUTHORIZATION regress_rc_super;
SET rc.session = 'on';
SET idempotency.enable_superuser_reconcilers = on;

--
-- 3. Rights revoked after registration: the registrar, and the owner of
--    the function, must still be able to act as the run-as role
--
CREATE ROLE regress_rc_payments;
CREATE TABLE rc_secrets (card text);
INSERT INTO rc_secrets VALUES ('4111-1111-1111-1111');
REVOKE ALL ON rc_secrets FROM PUBLIC;
GRANT SELECT ON rc_secrets TO regress_rc_payments;
GRANT EXECUTE ON FUNCTION idem_release(text, text, text) TO regress_rc_payments;
GRANT SELECT, UPDATE, DELETE ON idem_keys TO regress_rc_payments;
GRANT EXECUTE ON FUNCTION idem_set_reconciler(text, regprocedure) TO regress_rc_payments;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_reconcilers TO regress_rc_payments;
CREATE ROLE regress_rc_member;
GRANT regress_rc_payments TO regress_rc_member;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_reconcilers TO regress_rc_member;
GRANT EXECUTE ON FUNCTION idem_set_reconciler(text, regprocedure) TO regress_rc_member;
GRANT CREATE ON SCHEMA public TO regress_rc_member;
SET ROLE regress_rc_member;
CREATE TABLE rc_loot (card text);
GRANT INSERT ON rc_loot TO PUBLIC;
CREATE FUNCTION rc_member_reconcile(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF pg_catalog.current_setting('rc.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	INSERT INTO public.rc_calls VALUES (r.key, current_user, NULL);
END $$;
-- ... registered by hand to run as the role it is a member of
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('rc-pay', 'rc_member_reconcile(idem_keys)', 'regress_rc_payments')
ON CONFLICT (operation) DO UPDATE SET handler = excluded.handler, run_as = excluded.run_as;
SELECT operation, handler, run_as, registered_by FROM idem_reconcilers;
RESET ROLE;
SELECT rc_stuck('m1');
SELECT idem_reconcile() FROM rc_locked();
SELECT key, who FROM rc_calls WHERE key = 'm1';
-- ... the member points it at a function it trusts the owner of but that
-- releases payments' records, then loses the membership
SET ROLE regress_rc_member;
UPDATE idem_reconcilers SET handler = 'public.rc_release(public.idem_keys)';
RESET ROLE;
REVOKE regress_rc_payments FROM regress_rc_member;
SELECT idem_reconcile() FROM rc_locked();
SELECT rc_status('m1') AS m1;
-- ... or, a member again, at its own function, whose body it replaces
-- after losing the membership, to copy the secrets
GRANT regress_rc_payments TO regress_rc_member;
SET ROLE regress_rc_member;
UPDATE idem_reconcilers SET handler = 'public.rc_member_reconcile(public.idem_keys)';
RESET ROLE;
REVOKE regress_rc_payments FROM regress_rc_member;
SET ROLE regress_rc_member;
CREATE OR REPLACE FUNCTION rc_member_reconcile(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF pg_catalog.current_setting('rc.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	INSERT INTO public.rc_loot SELECT card FROM public.rc_secrets;
END $$;
RESET ROLE;
SELECT idem_reconcile() FROM rc_locked();
BEGIN;
SELECT FROM rc_locked();
CALL idem_maintain();
COMMIT;
SELECT count(*) AS cards_copied FROM rc_loot;
-- ... registered through the API after SET ROLE: the registrar is the
-- run-as role itself, but the function's owner loses the right to be it
GRANT regress_rc_payments TO regress_rc_member;
SET ROLE regress_rc_member;
SET ROLE regress_rc_payments;
SELECT idem_set_reconciler('rc-pay', 'rc_member_reconcile(idem_keys)');
RESET ROLE;
SELECT operation, handler, run_as, registered_by FROM idem_reconcilers;
REVOKE regress_rc_payments FROM regress_rc_member;
SELECT idem_reconcile() FROM rc_locked();
SELECT count(*) AS cards_copied FROM rc_loot;
SELECT rc_status('m1') AS m1;

--
-- 4. Table rows no constraint guards any more: nothing crashes
--
-- the run-as role dropped since
CREATE ROLE regress_rc_gone;
GRANT EXECUTE ON FUNCTION rc_release(idem_keys) TO regress_rc_gone;
SET session_replication_role = replica;
UPDATE idem_reconcilers SET handler = 'public.rc_release(public.idem_keys)',
	run_as = 'regress_rc_gone', registered_by = 'regress_rc_gone';
RESET session_replication_role;
REVOKE ALL ON FUNCTION rc_release(idem_keys) FROM regress_rc_gone;
DROP ROLE regress_rc_gone;
SELECT run_as::oid = registered_by::oid AS same_dangling_role FROM idem_reconcilers;
\set VERBOSITY terse
SELECT idem_reconcile() FROM rc_locked();
\set VERBOSITY default
-- the registrar dropped since
SET session_replication_role = replica;
UPDATE idem_reconcilers SET run_as = 'regress_rc_payments', registered_by = 4000000000;
RESET session_replication_role;
SELECT idem_reconcile() FROM rc_locked();
-- NOT NULL dropped by the table's owner, and NULLs written
ALTER TABLE idem_reconcilers ALTER COLUMN handler DROP NOT NULL,
	ALTER COLUMN run_as DROP NOT NULL, ALTER COLUMN registered_by DROP NOT NULL;
UPDATE idem_reconcilers SET handler = NULL;
SELECT operation, handler, registered_by = current_user::regrole AS stamped FROM idem_reconcilers;
SELECT idem_reconcile() FROM rc_locked();
SET session_replication_role = replica;
UPDATE idem_reconcilers SET handler = 'public.rc_release(public.idem_keys)', run_as = NULL,
	registered_by = NULL;
RESET session_replication_role;
SELECT idem_reconcile() FROM rc_locked();
DELETE FROM idem_reconcilers;
ALTER TABLE idem_reconcilers ALTER COLUMN handler SET NOT NULL,
	ALTER COLUMN run_as SET NOT NULL, ALTER COLUMN registered_by SET NOT NULL;
-- a column retyped by the table's owner
ALTER TABLE idem_reconcilers ALTER COLUMN registered_by TYPE oid;
SELECT idem_set_reconciler('rc-pay', 'rc_release(idem_keys)');
ALTER TABLE idem_reconcilers ALTER COLUMN registered_by TYPE regrole;
SELECT 1 AS alive;
SELECT rc_status('m1') AS m1;

--
-- 5. idem_call with handlers that must never be called, as a superuser and
--    through a SECURITY DEFINER wrapper owned by one: a clean ERROR before
--    anything is reserved
--
SELECT idem_call('rc-call', 'c1', '{}', '-'::regprocedure);
SELECT idem_call('rc-call', 'c1', '{}', 0::regprocedure);
SELECT idem_call('rc-call', 'c1', '{}', 4000000000::oid::regprocedure);
SELECT idem_call('rc-call', 'c1', '{}', 'int4recv(internal)');
SELECT idem_call('rc-call', 'c1', '{}', 'array_typanalyze(internal)');
SELECT idem_call('rc-call', 'c1', '{}', 'rc_proc(idem_keys)');
SELECT idem_call('rc-call', 'c1', '{}', 'jsonb_typeof(jsonb)');
CREATE FUNCTION rc_try_call(h regprocedure) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	PERFORM public.idem_call('rc-call', 'c1', '{}', h);
	RETURN 'called';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE;
END $$;
CREATE FUNCTION rc_dropped(request jsonb) RETURNS jsonb LANGUAGE sql AS $$ SELECT request $$;
SELECT 'rc_dropped(jsonb)'::regprocedure::oid AS dropped_oid \gset
SELECT rc_try_call(:dropped_oid::oid::regprocedure) AS before_drop;
DELETE FROM idem_keys WHERE operation = 'rc-call';
DROP FUNCTION rc_dropped(jsonb);
SELECT rc_try_call(:dropped_oid::oid::regprocedure) AS after_drop;
-- one statement, a good handler then OID 0: the cache of the first does not
-- excuse the second
SELECT idem_call('rc-call', 'c' || i, '{}', h)
FROM (VALUES (1, 'rc_jsonb(jsonb)'::regprocedure), (2, '-'::regprocedure)) v(i, h);
CREATE FUNCTION rc_call_as_owner(h regprocedure) RETURNS jsonb
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
	SELECT public.idem_call('rc-call', 'c9', '{}', h)
$$;
GRANT EXECUTE ON FUNCTION rc_call_as_owner(regprocedure) TO regress_rc_maint;
SET ROLE regress_rc_maint;
SELECT rc_call_as_owner('-');
SELECT rc_call_as_owner('int4recv(internal)');
RESET ROLE;
SELECT count(*) AS reserved FROM idem_keys WHERE operation = 'rc-call';
SELECT 1 AS alive;

--
-- 6. The extension's schema is on the pinned search_path: a role that may
--    not act as the run-as role and may create there (granted CREATE, as
--    PUBLIC, or as its owner) could plant a better match for a call in the
--    reconciler; the reconciler is skipped with a WARNING that names the
--    schema and the role, and so it is while a function or operator such a
--    role planted is still there
--
DROP FUNCTION rc_member_reconcile(idem_keys);
REVOKE CREATE ON SCHEMA public FROM regress_rc_member;
SELECT count(*) AS foreign_objects FROM pg_proc
WHERE pronamespace = 'public'::regnamespace
	AND NOT (SELECT rolsuper FROM pg_roles WHERE oid = proowner);
-- A superuser's reconciler that calls idem_complete without a schema and
-- with a string literal as the response
CREATE FUNCTION rc_complete_literal(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF pg_catalog.current_setting('rc.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	PERFORM idem_complete(r.operation, r.key, '{"by": "reconciler"}', 200, NULL, r.scope);
END $$;
SELECT idem_set_reconciler('rc-pay', 'rc_complete_literal(idem_keys)');
SELECT rc_stuck('s1');
-- ... CREATE granted to a role that may not become the superuser
GRANT CREATE ON SCHEMA public TO regress_rc_maint;
SELECT idem_reconcile() FROM rc_locked();
-- ... which plants an overload that a text literal matches better
SET ROLE regress_rc_maint;
CREATE FUNCTION public.idem_complete(operation text, key text, response text,
	response_status integer, resource_id text, scope text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE regress_rc_maint SUPERUSER;
END $$;
SELECT idem_reconcile() FROM rc_locked();
BEGIN;
SELECT FROM rc_locked();
CALL idem_maintain();
COMMIT;
RESET ROLE;
SELECT idem_reconcile() FROM rc_locked();
-- ... and keeps it after CREATE is revoked
REVOKE CREATE ON SCHEMA public FROM regress_rc_maint;
SELECT idem_reconcile() FROM rc_locked();
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rc_maint';
SELECT rc_status('s1') AS s1;
DROP FUNCTION public.idem_complete(text, text, text, integer, text, text);
-- ... CREATE granted to PUBLIC (a cluster upgraded from PostgreSQL 14)
GRANT CREATE ON SCHEMA public TO PUBLIC;
SELECT idem_reconcile() FROM rc_locked();
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
-- ... the schema's owner
ALTER SCHEMA public OWNER TO regress_rc_maint;
SELECT idem_reconcile() FROM rc_locked();
ALTER SCHEMA public OWNER TO pg_database_owner;
-- ... none: it runs, and the extension's idem_complete is the one called
SELECT idem_reconcile() FROM rc_locked();
SELECT status, response FROM idem_keys WHERE scope = 'rc' AND key = 's1';
-- A role's CREATE does not matter to reconcilers that run as that role
GRANT CREATE ON SCHEMA public TO regress_rc_admin;
SET ROLE regress_rc_admin;
SELECT idem_set_reconciler('rc-pay', 'rc_release(idem_keys)');
RESET ROLE;
SELECT rc_stuck('s2');
SELECT idem_reconcile() FROM rc_locked();
SELECT rc_status('s2') AS s2;
REVOKE CREATE ON SCHEMA public FROM regress_rc_admin;

--
-- 7. Code that another role controls inside the reconciler's writes, or on
--    the function's own search_path (issue 29): a superuser's reconciler
--    runs only while every role that controls code its call runs can act
--    as the superuser; otherwise it is skipped with a WARNING naming the
--    role and what it controls, and nothing of that role's runs
--
CREATE ROLE regress_rc_keys;
CREATE TABLE rc_attached (kind text, who name, super boolean);
GRANT INSERT ON rc_attached TO PUBLIC;
-- ... in a schema of its own, which no reconciler's path names
CREATE SCHEMA regress_rc_keys_code AUTHORIZATION regress_rc_keys;
GRANT USAGE ON SCHEMA regress_rc_keys_code TO PUBLIC;
-- What every kind of attached code calls: notes who runs it, and tries to
-- make its owner SUPERUSER
SET ROLE regress_rc_keys;
CREATE FUNCTION regress_rc_keys_code.escalate(kind text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.rc_attached
		SELECT kind, current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
	BEGIN
		ALTER ROLE regress_rc_keys SUPERUSER;
	EXCEPTION WHEN insufficient_privilege THEN
		NULL;
	END;
	RETURN true;
END $$;
-- ... as index expressions and generated columns need it
CREATE FUNCTION regress_rc_keys_code.escalate_immutable(kind text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
	RETURN regress_rc_keys_code.escalate(kind);
END $$;
CREATE FUNCTION regress_rc_keys_code.escalate_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	PERFORM regress_rc_keys_code.escalate(TG_NAME);
	RETURN NEW;
END $$;
RESET ROLE;
-- A superuser's reconciler that completes the record
CREATE FUNCTION rc_complete(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF pg_catalog.current_setting('rc.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	PERFORM public.idem_complete(r.operation, r.key, '{"by": "reconciler"}', 200, NULL, r.scope);
END $$;
SELECT idem_set_reconciler('rc-pay', 'rc_complete(idem_keys)');
-- A role that owns idem_keys (the README supports a non-superuser owner)
-- attaches each kind of code PostgreSQL lets a table's owner attach; the
-- superuser's reconciler is skipped before any of it runs
SELECT rc_stuck('a1');
ALTER TABLE idem_keys OWNER TO regress_rc_keys;
SET ROLE regress_rc_keys;
CREATE TRIGGER rc_row_trigger BEFORE UPDATE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION regress_rc_keys_code.escalate_trigger();
RESET ROLE;
SELECT idem_reconcile() FROM rc_locked();
SET ROLE regress_rc_keys;
DROP TRIGGER rc_row_trigger ON idem_keys;
CREATE TRIGGER rc_statement_trigger AFTER UPDATE OR DELETE ON idem_keys
	FOR EACH STATEMENT EXECUTE FUNCTION regress_rc_keys_code.escalate_trigger();
RESET ROLE;
SELECT idem_reconcile() FROM rc_locked();
SET ROLE regress_rc_keys;
DROP TRIGGER rc_statement_trigger ON idem_keys;
CREATE CONSTRAINT TRIGGER rc_deferred_trigger AFTER UPDATE ON idem_keys
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION regress_rc_keys_code.escalate_trigger();
RESET ROLE;
SELECT idem_reconcile() FROM rc_locked();
SET ROLE regress_rc_keys;
DROP TRIGGER rc_deferred_trigger ON idem_keys;
CREATE RULE rc_rule AS ON UPDATE TO idem_keys DO ALSO SELECT regress_rc_keys_code.escalate('rule');
RESET ROLE;
SELECT idem_reconcile() FROM rc_locked();
SET ROLE regress_rc_keys;
DROP RULE rc_rule ON idem_keys;
ALTER TABLE idem_keys ADD CONSTRAINT rc_check CHECK (regress_rc_keys_code.escalate('check'));
RESET ROLE;
DELETE FROM rc_attached;
SELECT idem_reconcile() FROM rc_locked();
SET ROLE regress_rc_keys;
ALTER TABLE idem_keys DROP CONSTRAINT rc_check;
ALTER TABLE idem_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY rc_policy ON idem_keys USING (regress_rc_keys_code.escalate('policy'));
RESET ROLE;
SELECT idem_reconcile() FROM rc_locked();
GRANT CREATE ON SCHEMA public TO regress_rc_keys;
SET ROLE regress_rc_keys;
DROP POLICY rc_policy ON idem_keys;
ALTER TABLE idem_keys DISABLE ROW LEVEL SECURITY;
CREATE INDEX rc_expression_idx ON idem_keys (regress_rc_keys_code.escalate_immutable(key));
RESET ROLE;
REVOKE CREATE ON SCHEMA public FROM regress_rc_keys;
DELETE FROM rc_attached;
SELECT idem_reconcile() FROM rc_locked();
SET ROLE regress_rc_keys;
DROP INDEX rc_expression_idx;
RESET ROLE;
GRANT CREATE ON SCHEMA public TO regress_rc_keys;
SET ROLE regress_rc_keys;
CREATE INDEX rc_partial_idx ON idem_keys (key) WHERE regress_rc_keys_code.escalate_immutable(status);
RESET ROLE;
REVOKE CREATE ON SCHEMA public FROM regress_rc_keys;
DELETE FROM rc_attached;
SELECT idem_reconcile() FROM rc_locked();
SET ROLE regress_rc_keys;
DROP INDEX rc_partial_idx;
-- (a column added by the owner, generated or with a default, makes every
-- function raise: the extension writes whole records)
ALTER TABLE idem_keys ALTER COLUMN resource_id
	SET DEFAULT CASE WHEN regress_rc_keys_code.escalate('default') THEN NULL END;
RESET ROLE;
SELECT idem_reconcile() FROM rc_locked();
SET ROLE regress_rc_keys;
ALTER TABLE idem_keys ALTER COLUMN resource_id DROP DEFAULT;
RESET ROLE;
ALTER TABLE idem_keys OWNER TO CURRENT_USER;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rc_keys';
SELECT kind, who, super FROM rc_attached WHERE super;
SELECT rc_status('a1') AS a1;

-- With a superuser owner, the roles that may attach code count too: a role
-- granted TRIGGER, and the owner of a function that attached code calls
GRANT TRIGGER ON idem_keys TO regress_rc_keys;
SELECT idem_reconcile() FROM rc_locked();
REVOKE TRIGGER ON idem_keys FROM regress_rc_keys;
CREATE TRIGGER rc_foreign_function BEFORE UPDATE ON idem_keys
	FOR EACH ROW EXECUTE FUNCTION regress_rc_keys_code.escalate_trigger();
SELECT idem_reconcile() FROM rc_locked();
DROP TRIGGER rc_foreign_function ON idem_keys;
ALTER TABLE idem_keys ADD CONSTRAINT rc_check CHECK (regress_rc_keys_code.escalate('check')) NOT VALID;
SELECT idem_reconcile() FROM rc_locked();
ALTER TABLE idem_keys DROP CONSTRAINT rc_check;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rc_keys';
SELECT kind, who, super FROM rc_attached WHERE super;
SELECT rc_status('a1') AS a1;
-- ... and once nobody else controls any of it, the reconciler runs
SELECT idem_reconcile() FROM rc_locked();
SELECT rc_status('a1') AS a1;

-- The reconciler's own SET search_path is on its effective path too: an
-- overload planted in a schema it names, by a role that owns that schema
CREATE SCHEMA regress_rc_planted AUTHORIZATION regress_rc_keys;
CREATE FUNCTION rc_complete_own_path(r idem_keys) RETURNS void LANGUAGE plpgsql
SET search_path = regress_rc_planted, public, pg_catalog AS $$
BEGIN
	IF pg_catalog.current_setting('rc.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	PERFORM public.idem_complete(r.operation, r.key,
		jsonb_build_object('payment_id', 42::bigint, 'status', 'paid'::text), 200, NULL, r.scope);
END $$;
SET ROLE regress_rc_keys;
CREATE FUNCTION regress_rc_planted.jsonb_build_object(text, bigint, text, text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
	PERFORM regress_rc_keys_code.escalate('planted');
	RETURN pg_catalog.jsonb_build_object($1, $2, $3, $4);
END $$;
RESET ROLE;
SELECT idem_set_reconciler('rc-pay', 'rc_complete_own_path(idem_keys)');
SELECT rc_stuck('a2');
SELECT idem_reconcile() FROM rc_locked();
-- ... or one that the role only may create in, or planted before
ALTER SCHEMA regress_rc_planted OWNER TO CURRENT_USER;
GRANT CREATE ON SCHEMA regress_rc_planted TO regress_rc_keys;
SELECT idem_reconcile() FROM rc_locked();
REVOKE CREATE ON SCHEMA regress_rc_planted FROM regress_rc_keys;
SELECT idem_reconcile() FROM rc_locked();
DROP FUNCTION regress_rc_planted.jsonb_build_object(text, bigint, text, text);
-- ... or a schema of the path that does not exist yet, which a role with
-- CREATE on the database could create ("$user" is the run-as role's name)
ALTER FUNCTION rc_complete_own_path(idem_keys) SET search_path = "$user", public, pg_catalog;
GRANT CREATE ON DATABASE :"DBNAME" TO regress_rc_keys;
SELECT idem_reconcile() FROM rc_locked();
REVOKE CREATE ON DATABASE :"DBNAME" FROM regress_rc_keys;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rc_keys';
SELECT kind, who, super FROM rc_attached WHERE super;
SELECT rc_status('a2') AS a2;
-- ... none: it runs, with pg_catalog's jsonb_build_object
SELECT idem_reconcile() FROM rc_locked();
SELECT status, response FROM idem_keys WHERE scope = 'rc' AND key = 'a2';
DROP SCHEMA regress_rc_planted;
DROP SCHEMA regress_rc_keys_code CASCADE;
DROP TABLE rc_attached;
DROP FUNCTION rc_complete(idem_keys), rc_complete_own_path(idem_keys);

-- 8. A superuser is no run-as role unless the operator says so
-- (idempotency.enable_superuser_reconcilers, off by default): registering
-- one is refused, whoever registers and however ...
SET idempotency.enable_superuser_reconcilers = off;
SELECT idem_set_reconciler('rc-pay', 'rc_release(idem_keys)');
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('rc-pay', 'rc_release(idem_keys)', 'regress_rc_super');
-- ... by a role that may act as a superuser, too
GRANT regress_rc_super TO regress_rc_admin;
SET ROLE regress_rc_admin;
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('rc-pay', 'public.rc_release(public.idem_keys)', 'regress_rc_super');
RESET ROLE;
REVOKE regress_rc_super FROM regress_rc_admin;
-- ... only a session setting may change it
SET ROLE regress_rc_admin;
SET idempotency.enable_superuser_reconcilers = on;
RESET ROLE;
-- ... and one registered while it was on is skipped, its record left stuck
SET idempotency.enable_superuser_reconcilers = on;
SELECT idem_set_reconciler('rc-pay', 'rc_release(idem_keys)');
SELECT rc_stuck('u1');
SET idempotency.enable_superuser_reconcilers = off;
SELECT idem_reconcile() FROM rc_locked();
SELECT rc_status('u1') AS u1;
-- ... while the default role set keeps working: idem_admin registers a
-- reconciler that runs as itself, idem_maint runs it
SET ROLE regress_rc_admin;
SELECT idem_set_reconciler('rc-pay', 'rc_release(idem_keys)');
RESET ROLE;
SET ROLE regress_rc_maint;
SELECT idem_reconcile() FROM rc_locked();
RESET ROLE;
SELECT rc_status('u1') AS u1, (SELECT who FROM rc_calls WHERE key = 'u1') AS ran_as;
SET idempotency.enable_superuser_reconcilers = on;

-- Clean up
SELECT idem_set_reconciler('rc-pay', NULL);
DELETE FROM idem_keys WHERE scope = 'rc';
DROP OWNED BY regress_rc_admin, regress_rc_maint, regress_rc_payments, regress_rc_member, regress_rc_keys;
DROP ROLE regress_rc_admin, regress_rc_maint, regress_rc_payments, regress_rc_member, regress_rc_keys;
DROP FUNCTION rc_locked(), rc_stuck(text), rc_status(text), rc_release(idem_keys), rc_jsonb(jsonb),
	rc_complete_literal(idem_keys),
	rc_gone(idem_keys), rc_ledger_check(idem_keys), rc_call_as_owner(regprocedure),
	rc_try_call(regprocedure), rc_force_handler(text);
DROP PROCEDURE rc_proc(idem_keys);
DROP TABLE rc_calls, rc_secrets;
RESET SESSION AUTHORIZATION;
REASSIGN OWNED BY regress_rc_super TO CURRENT_USER;
DROP OWNED BY regress_rc_super;
DROP ROLE regress_rc_super;
