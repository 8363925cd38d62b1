-- A queue consumer with at-least-once delivery.
--
-- The broker (here a table, "deliveries") may hand the same message to a
-- consumer more than once: a worker that dies before it acknowledges gets
-- its message redelivered, and producers retry too.  The consumer makes the
-- effect once per message by recording the message in the same transaction
-- as the effect -- the article's processed_messages table, here
-- idem_consume:
--
--   BEGIN;
--   take a delivery                           (DELETE ... SKIP LOCKED = the ack)
--   IF idem_consume('ledger', message_id)     (true only the first time)
--       apply the effect                      (not idempotent by itself)
--   COMMIT;                                   (all of it, or none of it)
--
-- Two workers holding two deliveries of one message at once: the second
-- idem_consume waits for the first transaction, then answers false if it
-- committed, true if it rolled back.
--
-- Needs: CREATE EXTENSION idempotency (in a schema on search_path).

-- The broker's deliveries; a message may be in here several times
CREATE TABLE deliveries (
	delivery_id	bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	message_id	text NOT NULL,
	payload		jsonb NOT NULL
);

-- The effect: money moved into accounts, one ledger line per movement
CREATE TABLE accounts (
	id			int PRIMARY KEY,
	balance		bigint NOT NULL DEFAULT 0
);
CREATE TABLE ledger (
	message_id	text NOT NULL,
	account_id	int NOT NULL REFERENCES accounts,
	amount		bigint NOT NULL,
	worker		int NOT NULL
);

-- What each committed delivery did: first time (true) or duplicate (false)
CREATE TABLE consumer_log (
	worker		int NOT NULL,
	message_id	text NOT NULL,
	first		boolean NOT NULL
);

-- One message: apply its effect unless it was processed before.  Runs in the
-- caller's transaction.
CREATE FUNCTION handle_message(worker int, message_id text, payload jsonb)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
	first boolean;
BEGIN
	first := idem_consume('ledger', message_id);
	IF first THEN
		UPDATE accounts SET balance = balance + (payload->>'amount')::bigint
		WHERE id = (payload->>'account')::int;
		INSERT INTO ledger
		VALUES (message_id, (payload->>'account')::int,
				(payload->>'amount')::bigint, worker);
	END IF;
	INSERT INTO consumer_log VALUES (worker, message_id, first);
	RETURN first;
END
$$;

-- A worker: take deliveries one transaction at a time until the queue is
-- empty.  With crash_rate > 0 it "crashes" before the ack now and then: the
-- transaction rolls back, and the delivery goes back to the queue for any
-- worker to take again.  max_loops bounds the loop.
CREATE PROCEDURE consume_worker(worker int, crash_rate float8 DEFAULT 0,
								max_loops int DEFAULT 100000)
LANGUAGE plpgsql AS $$
DECLARE
	d		deliveries;
	loops	int := 0;
BEGIN
	LOOP
		loops := loops + 1;
		EXIT WHEN loops > max_loops;

		DELETE FROM deliveries
		WHERE delivery_id = (SELECT delivery_id FROM deliveries
							 ORDER BY delivery_id
							 FOR UPDATE SKIP LOCKED LIMIT 1)
		RETURNING * INTO d;

		IF d.delivery_id IS NULL THEN
			-- nothing free: done if the queue is empty, else others hold the rest
			EXIT WHEN NOT EXISTS (SELECT FROM deliveries);
			COMMIT;
			PERFORM pg_sleep(0.01);
			CONTINUE;
		END IF;

		PERFORM handle_message(worker, d.message_id, d.payload);

		IF random() < crash_rate THEN
			ROLLBACK;			-- died before the ack: redelivered
		ELSE
			COMMIT;
		END IF;
		d := NULL;
	END LOOP;
	COMMIT;
END
$$;

-- The producer: n messages, each delivered twice, in random order
CREATE PROCEDURE publish_twice(n int)
LANGUAGE sql AS $$
	INSERT INTO accounts (id) SELECT a FROM generate_series(1, 10) a
	ON CONFLICT DO NOTHING;
	INSERT INTO deliveries (message_id, payload)
	SELECT 'msg-' || i,
		   jsonb_build_object('account', 1 + i % 10, 'amount', i)
	FROM generate_series(1, n) i, generate_series(1, 2) copy
	ORDER BY random();
$$;
