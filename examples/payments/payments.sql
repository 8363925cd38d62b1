-- Payments in one transaction.
--
-- The article's flow, with idem_keys in place of a hand-made
-- idempotency_records table:
--
--   1. reserve the key (status processing)         idem_reserve
--   2. if it exists: 422 when the request differs,  outcome mismatch
--      the saved result when completed,             outcome replay
--      409 while it is processing                   outcome in_progress
--   3. create the payment                           INSERT INTO payments
--   4. save resource_id, response, completed        idem_complete
--   5. answer
--
-- Steps 1 to 4 share the caller's transaction: the key and the payment
-- commit together or not at all, so a crash at any point leaves either
-- both or neither, and a retry either replays or runs again.
--
-- Needs: CREATE EXTENSION idempotency (in a schema on search_path).

CREATE TABLE payments (
	id			bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	account_id	uuid NOT NULL,
	order_id	text NOT NULL,
	amount		bigint NOT NULL CHECK (amount > 0),		-- in cents
	currency	text NOT NULL,
	created_at	timestamptz NOT NULL DEFAULT now()
);

-- POST /payments as a function: the HTTP status and body an API would send.
-- The key's scope is the account, so two accounts never see each other's keys.
CREATE FUNCTION create_payment(account_id uuid, idempotency_key text,
							   request jsonb,
							   OUT http_status int, OUT body jsonb)
LANGUAGE plpgsql AS $$
DECLARE
	r			record;
	payment_id	bigint;
BEGIN
	SELECT * INTO r
	FROM idem_reserve('create-payment', idempotency_key, request,
					  scope => account_id::text);

	CASE r.outcome
		WHEN 'new' THEN
			NULL;				-- ours: go on below
		WHEN 'replay' THEN
			http_status := r.response_status;	-- the first answer, as it was
			body := r.response;
			RETURN;
		WHEN 'mismatch' THEN
			http_status := 422;
			body := '{"error": "idempotency key already used with another request"}';
			RETURN;
		ELSE					-- in_progress, stuck
			http_status := 409;
			body := jsonb_build_object('error', 'request ' || r.outcome);
			RETURN;
	END CASE;

	-- A final business failure is an answer too: completed, and replayed
	IF (request->>'amount')::bigint > 1000000 THEN
		http_status := 402;
		body := '{"error": "card_declined"}';
		PERFORM idem_complete('create-payment', idempotency_key, body,
							  http_status, NULL, account_id::text);
		RETURN;
	END IF;

	INSERT INTO payments (account_id, order_id, amount, currency)
	VALUES (account_id, request->>'order_id', (request->>'amount')::bigint,
			request->>'currency')
	RETURNING id INTO payment_id;

	http_status := 201;
	body := jsonb_build_object('id', payment_id,
							   'order_id', request->'order_id',
							   'amount', request->'amount',
							   'currency', request->'currency',
							   'status', 'paid');
	PERFORM idem_complete('create-payment', idempotency_key, body,
						  http_status, payment_id::text, account_id::text);
END
$$;

-- The same with idem_call: the handler holds only the business logic; the
-- reservation, replay and completion (status 200) are idem_call's, and
-- in_progress, mismatch and stuck arrive as errors with SQLSTATEs ID003,
-- ID004 and ID005.
CREATE FUNCTION create_payment_handler(request jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	payment_id	bigint;
BEGIN
	INSERT INTO payments (account_id, order_id, amount, currency)
	VALUES ((request->>'account_id')::uuid, request->>'order_id',
			(request->>'amount')::bigint, request->>'currency')
	RETURNING id INTO payment_id;
	RETURN jsonb_build_object('id', payment_id, 'status', 'paid');
END
$$;
