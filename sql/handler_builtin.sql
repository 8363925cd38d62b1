--
-- A built-in function is a handler like any other: idem_call calls it
-- through the function manager and completes the key with its result.
--
-- PostgreSQL 18 gave jsonb_strip_nulls a second argument (strip_in_arrays,
-- with a default), and no other built-in function takes one jsonb and
-- returns jsonb: from 18 on the same function is refused as a handler, and
-- nothing is reserved (expected/handler_builtin_1.out).  It is found by name
-- so that the test's input is the same on every version.
--
SELECT p.oid::regprocedure AS handler
FROM pg_catalog.pg_proc p
WHERE p.proname = 'jsonb_strip_nulls'
  AND p.pronamespace = 'pg_catalog'::regnamespace \gset
SELECT idem_call('builtin', 'b1', '{"a": null, "b": [null, 1]}', :'handler');
SELECT key, status, response FROM idem_keys WHERE operation = 'builtin';
-- a retry answers the same way (a replay where it was completed)
SELECT idem_call('builtin', 'b1', '{"a": null, "b": [null, 1]}', :'handler');
