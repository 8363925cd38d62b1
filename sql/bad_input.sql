-- Bad input: SQLSTATE 22023 with a message naming the argument; nothing is kept.
\set VERBOSITY default
\set ON_ERROR_STOP 0
SELECT * FROM idem_reserve('op', NULL);
SELECT * FROM idem_reserve('op', '');
SELECT * FROM idem_reserve('op', repeat('k', 255)) \gset
SELECT outcome FROM idem_reserve('op', repeat('k', 256));
SELECT * FROM idem_reserve('op', E'line\nbreak');
SELECT * FROM idem_reserve('op', E'tab\there');
SELECT * FROM idem_reserve('op', 'del' || chr(127));
SELECT * FROM idem_reserve('op', 'caf' || chr(233));
SELECT * FROM idem_reserve('op', 'k' || chr(128512));
SELECT * FROM idem_reserve(NULL, 'k');
SELECT * FROM idem_reserve('', 'k');
SELECT outcome FROM idem_reserve(repeat('o', 63), 'k');
SELECT * FROM idem_reserve(repeat('o', 64), 'k');
SELECT * FROM idem_reserve('op', 'k', scope => NULL);
SELECT * FROM idem_reserve('op', 'k', scope => repeat('s', 256));
SELECT * FROM idem_reserve('op', 'k2', ttl => '0');
SELECT * FROM idem_reserve('op', 'k2', ttl => '-1 hour');
SELECT * FROM idem_reserve('op', 'k2', ttl => '1 day -25 hours');
SELECT idem_complete(NULL, 'k');
SELECT idem_complete('op', NULL);
SELECT idem_release('op', '');
SELECT idem_checkpoint('op', E'\x01', 'p');
SELECT * FROM idem_lookup('op', NULL);
-- the SQLSTATEs
\set VERBOSITY terse
SELECT * FROM idem_reserve('op', E'a\tb');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_reserve('op', 'k', ttl => '0');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_complete('op', 'never-reserved');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_complete('op', repeat('k', 255));
SELECT idem_complete('op', repeat('k', 255));
\echo :LAST_ERROR_SQLSTATE
SELECT idem_release('op', repeat('k', 255));
\echo :LAST_ERROR_SQLSTATE
SELECT idem_checkpoint('op', repeat('k', 255), 'p');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
-- only the two good reservations were kept
SELECT operation, length(key) AS key_len, status FROM idem_keys ORDER BY 1, 2;

-- leave nothing behind for the next test
DELETE FROM idem_keys;
