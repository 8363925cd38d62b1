-- Security: nothing granted to PUBLIC, doc/security.md's grant recipes work, and
-- objects planted on search_path change nothing.
\pset null '(null)'

-- No extension function or relation is usable by PUBLIC, none is SECURITY DEFINER
SELECT count(*) AS public_or_secdef_functions
FROM pg_proc p
JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
WHERE p.prosecdef OR p.proacl IS NULL
   OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0);
SELECT count(*) AS public_relations
FROM pg_class c
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
WHERE EXISTS (SELECT 1 FROM aclexplode(c.relacl) a WHERE a.grantee = 0);

-- A role that was granted nothing can do nothing
CREATE ROLE regress_idem_nobody;
SET ROLE regress_idem_nobody;
SELECT * FROM idem_reserve('op', 'k');
SELECT idem_complete('op', 'k');
SELECT idem_release('op', 'k');
SELECT idem_checkpoint('op', 'k', 'p');
SELECT * FROM idem_lookup('op', 'k');
SELECT * FROM idem_keys;
INSERT INTO idem_keys (scope, operation, key, status, expires_at) VALUES ('', 'op', 'k', 'completed', now() + interval '1 day');
DELETE FROM idem_keys;
RESET ROLE;

-- EXECUTE alone is not enough: the functions run with the caller's rights
CREATE ROLE regress_idem_exec_only;
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval) TO regress_idem_exec_only;
SET ROLE regress_idem_exec_only;
SELECT * FROM idem_reserve('op', 'k');
RESET ROLE;

-- doc/security.md's application role recipe
CREATE ROLE regress_idem_app;
GRANT USAGE ON SCHEMA public TO regress_idem_app;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys TO regress_idem_app;
GRANT EXECUTE ON FUNCTION
	idem_reserve(text, text, jsonb, text, interval),
	idem_complete(text, text, jsonb, integer, text, text),
	idem_release(text, text, text),
	idem_checkpoint(text, text, text, text),
	idem_lookup(text, text, text)
TO regress_idem_app;
SET ROLE regress_idem_app;
SELECT outcome FROM idem_reserve('op', 'app-1', '{"a": 1}');
SELECT idem_checkpoint('op', 'app-1', 'step-1');
SELECT idem_complete('op', 'app-1', '{"ok": true}');
SELECT outcome, response FROM idem_reserve('op', 'app-1', '{"a": 1}');
SELECT outcome FROM idem_reserve('op', 'app-2');
SELECT idem_release('op', 'app-2');
SELECT key, status FROM idem_lookup('op', 'app-1');
RESET ROLE;

-- doc/security.md's read-only monitoring role recipe
CREATE ROLE regress_idem_monitor;
GRANT USAGE ON SCHEMA public TO regress_idem_monitor;
GRANT SELECT ON idem_keys TO regress_idem_monitor;
GRANT EXECUTE ON FUNCTION idem_lookup(text, text, text) TO regress_idem_monitor;
SET ROLE regress_idem_monitor;
SELECT key, status FROM idem_lookup('op', 'app-1');
SELECT count(*) > 0 AS can_read FROM idem_keys;
SELECT * FROM idem_reserve('op', 'mon-1');
UPDATE idem_keys SET status = 'stuck';
RESET ROLE;

-- Objects planted on search_path change nothing: an "=" for text that is
-- always true, and a decoy idem_keys table, in a schema searched first
CREATE SCHEMA evil;
CREATE FUNCTION evil.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.always);
CREATE TABLE evil.idem_keys (LIKE public.idem_keys);
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$SELECT '2000-01-01'::timestamptz$$;
SET search_path = evil, pg_catalog, public;
SELECT 'a' = 'b' AS planted_operator_active;
SELECT outcome FROM public.idem_reserve('evil', 'e1', '{"x": 1}');
SELECT outcome FROM public.idem_reserve('evil', 'e2', '{"x": 2}');
SELECT public.idem_complete('evil', 'e1', '{"r": 1}');
SELECT public.idem_checkpoint('evil', 'e2', 'only-e2');
SELECT outcome, response FROM public.idem_reserve('evil', 'e1', '{"x": 1}');
SELECT outcome FROM public.idem_reserve('evil', 'e2', '{"x": 2}');
SELECT public.idem_release('evil', 'e2');
RESET search_path;
SELECT key, status, response, recovery_point, created_at > '2001-01-01' AS real_now
FROM idem_keys WHERE operation = 'evil' ORDER BY key;
SELECT count(*) AS decoy_rows FROM evil.idem_keys;

DROP SCHEMA evil CASCADE;

-- Renewing an expired record is an UPDATE: INSERT alone is not enough
SELECT outcome FROM idem_reserve('op', 'exp-1');
SELECT idem_complete('op', 'exp-1');
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE key = 'exp-1';
CREATE ROLE regress_idem_insert_only;
GRANT SELECT, INSERT ON idem_keys TO regress_idem_insert_only;
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval) TO regress_idem_insert_only;
SET ROLE regress_idem_insert_only;
SELECT outcome FROM idem_reserve('op', 'exp-1');
SELECT outcome FROM idem_reserve('op', 'exp-2');
RESET ROLE;
DELETE FROM idem_keys;

-- Every view over idem_keys is a security_barrier view (read with its
-- owner's rights, none is security_invoker: regress_idem_monitor reads idem_stuck
-- without access to idem_keys)
SELECT c.relname, c.reloptions
FROM pg_class c
JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idempotency'
WHERE c.relkind = 'v'
ORDER BY c.relname;

-- ... so a reader's cheap function in the WHERE clause of a query on
-- idem_stuck sees only the rows the view returns: here the stuck record,
-- never the completed or the fresh processing one
SELECT outcome FROM idem_reserve('op', 'leak-completed', scope => 'secret');
SELECT idem_complete('op', 'leak-completed', scope => 'secret');
SELECT outcome FROM idem_reserve('op', 'leak-processing', scope => 'secret');
SELECT idem_checkpoint('op', 'leak-processing', 'card 4111', scope => 'secret');
SELECT outcome FROM idem_reserve('op', 'leak-stuck');
UPDATE idem_keys SET status = 'stuck' WHERE key = 'leak-stuck';
CREATE ROLE regress_idem_stuck_reader;
GRANT USAGE ON SCHEMA public TO regress_idem_stuck_reader;
GRANT SELECT ON idem_stuck TO regress_idem_stuck_reader;
SET ROLE regress_idem_stuck_reader;
CREATE FUNCTION pg_temp.leak(scope text, operation text, key text, recovery_point text)
RETURNS boolean LANGUAGE plpgsql COST 0.0001 AS $$
BEGIN
	RAISE NOTICE 'seen: scope "%", operation "%", key "%", recovery point "%"',
		scope, operation, key, recovery_point;
	RETURN true;
END $$;
SELECT key FROM idem_stuck WHERE pg_temp.leak(scope, operation, key, recovery_point);
SELECT key FROM idem_stuck s
WHERE pg_temp.leak(s.scope, s.operation, s.key, s.recovery_point) AND s.flagged;
SELECT count(*) FROM idem_keys;
RESET ROLE;
\c
DELETE FROM idem_keys;
DROP OWNED BY regress_idem_app, regress_idem_monitor, regress_idem_exec_only, regress_idem_insert_only, regress_idem_stuck_reader;
DROP ROLE regress_idem_nobody, regress_idem_exec_only, regress_idem_app, regress_idem_monitor, regress_idem_insert_only,
	regress_idem_stuck_reader;
