-- ALTER EXTENSION idempotency UPDATE from 0.1.0 keeps every reconciler with
-- its meaning: it still runs as its role, its registrar is left as 0 (the
-- update writes no row), which stands for that role, and
-- one whose function was dropped is kept, reported, and skipped until it is
-- registered again.  Run in a database of its own.
\set orig_db :DBNAME
CREATE DATABASE regress_rc_update;
-- as a superuser of its own, whose name the output shows (not the
-- bootstrap superuser's, which may be any)
CREATE ROLE regress_rc_upd_super SUPERUSER;
\c regress_rc_update
SET SESSION AUTHORIZATION regress_rc_upd_super;
-- The server's worker may visit this database and call the reconcilers
-- registered here between two statements: they settle a record only in
-- this session (upd.session), and idem_reconcile runs with the stuck
-- records locked by this session's transaction (upd_locked), which the
-- worker skips, so that each count printed is this session's
SET upd.session = 'on';
-- upd-gone runs as this superuser, which the operator must allow
SET idempotency.enable_superuser_reconcilers = on;
CREATE EXTENSION idempotency VERSION '0.1.0';
CREATE ROLE regress_rc_upd_app;
GRANT EXECUTE ON FUNCTION idem_set_reconciler(text, regprocedure),
	idem_release(text, text, text) TO regress_rc_upd_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_reconcilers, idem_keys TO regress_rc_upd_app;
CREATE TABLE upd_calls (key text, who name);
GRANT INSERT ON upd_calls TO regress_rc_upd_app;
CREATE FUNCTION upd_locked() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	PERFORM FROM public.idem_keys FOR UPDATE;
END $$;
CREATE FUNCTION upd_release(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF pg_catalog.current_setting('upd.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	INSERT INTO public.upd_calls VALUES (r.key, current_user);
	PERFORM public.idem_release(r.operation, r.key, r.scope);
END $$;
CREATE FUNCTION upd_gone(r idem_keys) RETURNS void LANGUAGE sql AS $$ SELECT $$;
-- The rows 0.1.0's idem_set_reconciler wrote (this library refuses to run
-- on the 0.1.0 catalog): the qualified signature, run as the writer
SET ROLE regress_rc_upd_app;
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('upd-app', 'public.upd_release(public.idem_keys)', current_user::regrole);
RESET ROLE;
INSERT INTO idem_reconcilers (operation, handler, run_as)
VALUES ('upd-gone', 'public.upd_gone(public.idem_keys)', current_user::regrole);
DROP FUNCTION upd_gone(idem_keys);

ALTER EXTENSION idempotency UPDATE TO '0.2.0';
SELECT extversion FROM pg_extension WHERE extname = 'idempotency';
SELECT operation, handler, run_as, registered_by FROM idem_reconcilers ORDER BY operation;
-- The CHECK that depended on who runs it is gone; the trigger checks writes
-- (NOT NULL constraints are left out: PostgreSQL 18 lists them here too)
SELECT conname FROM pg_constraint
WHERE conrelid = 'idem_reconcilers'::regclass AND contype <> 'n' ORDER BY conname;
SELECT tgname FROM pg_trigger
WHERE tgrelid = 'idem_reconcilers'::regclass AND NOT tgisinternal;
SET ROLE regress_rc_upd_app;
UPDATE idem_reconcilers SET run_as = 'regress_rc_upd_super' WHERE operation = 'upd-app';
RESET ROLE;

-- The kept registration runs as its role; the dangling one is skipped
SELECT (idem_reserve(op, 'k1')).outcome FROM (VALUES ('upd-app'), ('upd-gone')) v(op);
UPDATE idem_keys SET status = 'stuck';
SELECT idem_reconcile() FROM upd_locked();
SELECT key, who FROM upd_calls;
SELECT operation, status FROM idem_keys ORDER BY operation;
-- and registering it again brings it back
CREATE FUNCTION upd_gone(r idem_keys) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	IF pg_catalog.current_setting('upd.session', true) IS DISTINCT FROM 'on' THEN RETURN; END IF;
	PERFORM public.idem_release(r.operation, r.key, r.scope);
END $$;
SELECT idem_reconcile() FROM upd_locked();
SELECT count(*) AS left_stuck FROM idem_keys;

\c :orig_db
DROP DATABASE regress_rc_update;
DROP ROLE regress_rc_upd_app, regress_rc_upd_super;
