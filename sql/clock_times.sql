-- Times are clock times of the call, never the start of the statement, of
-- the client's message or of the transaction: a reservation is created when
-- idem_reserve runs, and a completion sets expires_at to the time
-- idem_complete runs + ttl.  So a retry right after the commit replays
-- however long the message, block or handler ran before completing.  Each
-- case below runs 2.5 s before its completion with a ttl of 2 s: counted
-- from the start of the message, its record would be expired at commit.
\pset null '(null)'
CREATE TABLE clock_effects (k text NOT NULL);

-- One message of several statements, as psql -c "BEGIN; ...; COMMIT" and
-- batch drivers send them (\; puts them into one query string)
BEGIN \; SELECT outcome FROM idem_reserve('clock', 'message', ttl => '2 seconds') \; SELECT pg_sleep(2.5) \; SELECT idem_complete('clock', 'message', '{"n": 1}') \; SELECT updated_at - statement_timestamp() >= interval '2.5 seconds' AS completed_when_called, expires_at - updated_at AS ttl FROM idem_lookup('clock', 'message') \; COMMIT;
SELECT outcome, response FROM idem_reserve('clock', 'message', ttl => '2 seconds');

-- A reservation late in a message is created when it runs
SELECT pg_sleep(0.5) \; SELECT outcome FROM idem_reserve('clock', 'late-reserve') \; SELECT created_at - statement_timestamp() >= interval '0.5 seconds' AS created_when_called, updated_at = created_at AS heartbeat_at_creation FROM idem_lookup('clock', 'late-reserve');

-- A PL/pgSQL block (a procedure's body alike)
DO $$
BEGIN
	PERFORM idem_reserve('clock', 'block', ttl => '2 seconds');
	PERFORM pg_sleep(2.5);
	PERFORM idem_complete('clock', 'block', '{"n": 2}');
END
$$;
SELECT outcome, response FROM idem_reserve('clock', 'block', ttl => '2 seconds');

-- An idem_call handler: the completion after it counts from its end
CREATE FUNCTION clock_slow_handler(request jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO clock_effects VALUES (request ->> 'k');
	PERFORM pg_sleep(2.5);
	RETURN jsonb_build_object('charged', request ->> 'k');
END
$$;
SELECT idem_call('clock', 'handler', '{"k": "h1"}', 'clock_slow_handler(jsonb)', ttl => '2 seconds');
SELECT idem_call('clock', 'handler', '{"k": "h1"}', 'clock_slow_handler(jsonb)', ttl => '2 seconds');
SELECT count(*) AS effects FROM clock_effects;

DROP FUNCTION clock_slow_handler(jsonb);
DROP TABLE clock_effects;
DELETE FROM idem_keys WHERE operation = 'clock';
