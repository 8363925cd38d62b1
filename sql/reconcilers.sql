-- Reconcilers and handlers that no role can turn against the cluster: every
-- attack of issue 12 that one session can make, in at least two variants.
-- Each checks that what the attacker wanted did not happen (no SUPERUSER,
-- no row copied), and that the backend survived (the next query answers).
\pset null '(null)'

-- A stuck record of operation rc-pay in scope rc
CREATE FUNCTION rc_stuck(k text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	PERFORM public.idem_reserve('rc-pay', k, scope => 'rc');
	-- written now: a reservation held by this transaction is not in the table yet
	PERFORM public.idem_checkpoint('rc-pay', k, NULL, scope => 'rc');
	UPDATE public.idem_keys SET status = 'stuck' WHERE scope = 'rc' AND key = k;
END $$;
CREATE FUNCTION rc_status(k text) RETURNS text LANGUAGE sql AS $$
	SELECT coalesce((SELECT status FROM public.idem_keys WHERE scope = 'rc' AND key = k), 'released')
$$;
CREATE TABLE rc_calls (key text, who name, path text);
GRANT INSERT ON rc_calls TO PUBLIC;

-- A superuser's reconciler that names idem_release without a schema, as a
-- careless one would: it releases the record
CREATE FUNCTION rc_release(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
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
SELECT idem_reconcile();
SELECT rc_force_handler('pg_catalog.int4recv(internal)');
CALL idem_maintain();
SELECT rc_force_handler('public.rc_jsonb(jsonb)');
SELECT idem_reconcile();
SELECT rc_force_handler('public.rc_proc(public.idem_keys)');
SELECT idem_reconcile();
-- A row naming no function at all: PostgreSQL 15's to_regprocedure raises on
-- bad syntax, and the reconciler counts as failed; from 16 on it answers NULL,
-- and the row is skipped as naming no function (reconcilers_1.out)
SELECT rc_force_handler('-');
SELECT idem_reconcile();
SELECT rc_force_handler('no such (syntax');
SELECT idem_reconcile();
-- Many stuck records of one operation: one WARNING per pass, not one each
SELECT rc_stuck('h2'), rc_stuck('h3');
SELECT rc_force_handler('pg_catalog.int4recv(internal)');
SELECT idem_reconcile();
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
SELECT idem_reconcile();
CREATE FUNCTION rc_gone(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	PERFORM public.idem_release(r.operation, r.key, r.scope);
END $$;
GRANT EXECUTE ON FUNCTION rc_gone(idem_keys) TO regress_rc_admin;
SELECT idem_reconcile();
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
SELECT idem_reconcile();
CALL idem_maintain();
RESET search_path;
RESET ROLE;
SELECT rc_stuck('p2');
SET ROLE regress_rc_maint;
SET search_path = regress_rc_evil, public;
CALL idem_maintain();
RESET search_path;
RESET ROLE;
-- ... a superuser's own session
SELECT rc_stuck('p3');
SET search_path = regress_rc_evil, public;
SELECT idem_reconcile();
RESET search_path;
-- ... the database's setting, in a new session
ALTER DATABASE :"DBNAME" SET search_path = regress_rc_evil, public;
SELECT rc_stuck('p4'), rc_stuck('p5');
\c
SHOW search_path;
SELECT idem_reconcile();
\c
SELECT rc_stuck('p6');
\c
CALL idem_maintain();
\c
ALTER DATABASE :"DBNAME" RESET search_path;
\c
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rc_maint';
SELECT key, who, path FROM rc_calls WHERE key LIKE 'p%' ORDER BY key;
SELECT count(*) AS still_stuck FROM idem_keys WHERE scope = 'rc' AND key LIKE 'p%';
-- A reconciler that sets its own search_path keeps it
ALTER FUNCTION rc_release(idem_keys) SET search_path = public;
SELECT rc_stuck('p7');
SELECT idem_reconcile();
ALTER FUNCTION rc_release(idem_keys) RESET search_path;
SELECT key, who, path FROM rc_calls WHERE key = 'p7';
-- The caller's settings are back after the pass
SET search_path = public, regress_rc_evil;
SELECT rc_stuck('p8');
SELECT idem_reconcile();
SHOW search_path;
RESET search_path;

-- ... a temporary object of the caller, which pg_temp (searched last for
-- relations) would give the superuser's reconciler: a session with
-- temporary objects only runs reconcilers of roles it may act as
CREATE FUNCTION rc_ledger_check(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
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
SELECT idem_reconcile();
CALL idem_maintain();
RESET ROLE;
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rc_maint';
SELECT rc_status('t1') AS t1;
DELETE FROM idem_keys WHERE scope = 'rc';
\c

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
	INSERT INTO public.rc_calls VALUES (r.key, current_user, NULL);
END $$;
-- ... registered by hand to run as the role it is a member of
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('rc-pay', 'rc_member_reconcile(idem_keys)', 'regress_rc_payments')
ON CONFLICT (operation) DO UPDATE SET handler = excluded.handler, run_as = excluded.run_as;
SELECT operation, handler, run_as, registered_by FROM idem_reconcilers;
RESET ROLE;
SELECT rc_stuck('m1');
SELECT idem_reconcile();
SELECT key, who FROM rc_calls WHERE key = 'm1';
-- ... the member points it at a function it trusts the owner of but that
-- releases payments' records, then loses the membership
SET ROLE regress_rc_member;
UPDATE idem_reconcilers SET handler = 'public.rc_release(public.idem_keys)';
RESET ROLE;
REVOKE regress_rc_payments FROM regress_rc_member;
SELECT idem_reconcile();
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
	INSERT INTO public.rc_loot SELECT card FROM public.rc_secrets;
END $$;
RESET ROLE;
SELECT idem_reconcile();
CALL idem_maintain();
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
SELECT idem_reconcile();
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
SELECT idem_reconcile();
\set VERBOSITY default
-- the registrar dropped since
SET session_replication_role = replica;
UPDATE idem_reconcilers SET run_as = 'regress_rc_payments', registered_by = 4000000000;
RESET session_replication_role;
SELECT idem_reconcile();
-- NOT NULL dropped by the table's owner, and NULLs written
ALTER TABLE idem_reconcilers ALTER COLUMN handler DROP NOT NULL,
	ALTER COLUMN run_as DROP NOT NULL, ALTER COLUMN registered_by DROP NOT NULL;
UPDATE idem_reconcilers SET handler = NULL;
SELECT operation, handler, registered_by = current_user::regrole AS stamped FROM idem_reconcilers;
SELECT idem_reconcile();
SET session_replication_role = replica;
UPDATE idem_reconcilers SET handler = 'public.rc_release(public.idem_keys)', run_as = NULL,
	registered_by = NULL;
RESET session_replication_role;
SELECT idem_reconcile();
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
	PERFORM idem_complete(r.operation, r.key, '{"by": "reconciler"}', 200, NULL, r.scope);
END $$;
SELECT idem_set_reconciler('rc-pay', 'rc_complete_literal(idem_keys)');
SELECT rc_stuck('s1');
-- ... CREATE granted to a role that may not become the superuser
GRANT CREATE ON SCHEMA public TO regress_rc_maint;
SELECT idem_reconcile();
-- ... which plants an overload that a text literal matches better
SET ROLE regress_rc_maint;
CREATE FUNCTION public.idem_complete(operation text, key text, response text,
	response_status integer, resource_id text, scope text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	ALTER ROLE regress_rc_maint SUPERUSER;
END $$;
SELECT idem_reconcile();
CALL idem_maintain();
RESET ROLE;
SELECT idem_reconcile();
-- ... and keeps it after CREATE is revoked
REVOKE CREATE ON SCHEMA public FROM regress_rc_maint;
SELECT idem_reconcile();
SELECT rolsuper FROM pg_roles WHERE rolname = 'regress_rc_maint';
SELECT rc_status('s1') AS s1;
DROP FUNCTION public.idem_complete(text, text, text, integer, text, text);
-- ... CREATE granted to PUBLIC (a cluster upgraded from PostgreSQL 14)
GRANT CREATE ON SCHEMA public TO PUBLIC;
SELECT idem_reconcile();
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
-- ... the schema's owner
ALTER SCHEMA public OWNER TO regress_rc_maint;
SELECT idem_reconcile();
ALTER SCHEMA public OWNER TO pg_database_owner;
-- ... none: it runs, and the extension's idem_complete is the one called
SELECT idem_reconcile();
SELECT status, response FROM idem_keys WHERE scope = 'rc' AND key = 's1';
-- A role's CREATE does not matter to reconcilers that run as that role
GRANT CREATE ON SCHEMA public TO regress_rc_admin;
SET ROLE regress_rc_admin;
SELECT idem_set_reconciler('rc-pay', 'rc_release(idem_keys)');
RESET ROLE;
SELECT rc_stuck('s2');
SELECT idem_reconcile();
SELECT rc_status('s2') AS s2;
REVOKE CREATE ON SCHEMA public FROM regress_rc_admin;

-- Clean up
SELECT idem_set_reconciler('rc-pay', NULL);
DELETE FROM idem_keys WHERE scope = 'rc';
DROP OWNED BY regress_rc_admin, regress_rc_maint, regress_rc_payments, regress_rc_member;
DROP ROLE regress_rc_admin, regress_rc_maint, regress_rc_payments, regress_rc_member;
DROP FUNCTION rc_stuck(text), rc_status(text), rc_release(idem_keys), rc_jsonb(jsonb),
	rc_complete_literal(idem_keys),
	rc_gone(idem_keys), rc_ledger_check(idem_keys), rc_call_as_owner(regprocedure),
	rc_try_call(regprocedure), rc_force_handler(text);
DROP PROCEDURE rc_proc(idem_keys);
DROP TABLE rc_calls, rc_secrets;
