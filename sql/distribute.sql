-- idem_distribute, the Citus set-up call: without Citus it refuses cleanly
-- (55000) and changes nothing; the records stay usable in idem_keys.
-- With Citus, test/scripts/citus.sh runs it on a coordinator and two workers.
\set VERBOSITY default
\set ON_ERROR_STOP 0
CREATE TABLE payments (tenant text COLLATE "C" NOT NULL, amount int);
SELECT outcome FROM idem_reserve('pay', 'k1', scope => 't1');
SELECT idem_distribute('payments');
\set VERBOSITY terse
SELECT idem_distribute('payments');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT idem_distribute(NULL);
-- nothing changed: the record is still served from idem_keys itself
SELECT outcome FROM idem_reserve('pay', 'k1', scope => 't1');
SELECT scope, key, status FROM idem_keys;
-- not granted to PUBLIC
SELECT has_function_privilege('public', 'idem_distribute(regclass)', 'EXECUTE');
DROP TABLE payments;
DELETE FROM idem_keys;
