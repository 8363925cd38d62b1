-- Schema for bench/suites/10_core.sh: the same payment table for every
-- variant, the seed's hand-written idempotency table for the baselines.
CREATE EXTENSION IF NOT EXISTS idempotency;

CREATE TABLE bench_payments (
	id			bigserial PRIMARY KEY,
	order_id	text NOT NULL,
	amount		int NOT NULL,
	created_at	timestamptz NOT NULL DEFAULT now()
);

-- The seed's table (its idempotency_records, with a text account id)
CREATE TABLE bench_idempotency_records (
	account_id		text NOT NULL,
	operation		text NOT NULL,
	idempotency_key	text NOT NULL,
	request_hash	text NOT NULL,
	status			text NOT NULL,
	resource_id		text,
	response_body	jsonb,
	created_at		timestamptz NOT NULL DEFAULT now(),
	expires_at		timestamptz NOT NULL,
	PRIMARY KEY (account_id, operation, idempotency_key)
);

-- (g) the floor: the smallest write any idempotency design must add, one
-- key row in a unique index beside the payment row, with no check at all
CREATE TABLE bench_floor_keys (
	scope		text COLLATE "C" NOT NULL,
	operation	text COLLATE "C" NOT NULL,
	key			text COLLATE "C" NOT NULL,
	PRIMARY KEY (scope, operation, key)
);

-- x5's table: a copy of idem_keys with its CHECK constraints and indexes
CREATE TABLE bench_record_keys (LIKE idem_keys INCLUDING ALL);

-- (c) the seed's flow as one PL/pgSQL function
CREATE FUNCTION bench_pay_plpgsql(p_key text, p_order text, p_amount int)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	req jsonb := jsonb_build_object('order_id', p_order, 'amount', p_amount);
	h text := encode(sha256(convert_to(req::text, 'UTF8')), 'hex');
	rec bench_idempotency_records;
	pid bigint;
	body jsonb;
BEGIN
	INSERT INTO bench_idempotency_records
		(account_id, operation, idempotency_key, request_hash, status, expires_at)
	VALUES ('acct-1', 'create-payment', p_key, h, 'PROCESSING', now() + interval '24 hours')
	ON CONFLICT DO NOTHING;
	IF NOT FOUND THEN
		SELECT * INTO rec FROM bench_idempotency_records
		WHERE account_id = 'acct-1' AND operation = 'create-payment' AND idempotency_key = p_key;
		IF rec.request_hash <> h THEN
			RAISE EXCEPTION 'mismatch' USING ERRCODE = 'P0422';
		ELSIF rec.status = 'COMPLETED' THEN
			RETURN rec.response_body;
		ELSE
			RAISE EXCEPTION 'in progress' USING ERRCODE = 'P0409';
		END IF;
	END IF;
	INSERT INTO bench_payments (order_id, amount) VALUES (p_order, p_amount) RETURNING id INTO pid;
	body := jsonb_build_object('payment_id', pid, 'status', 'paid');
	UPDATE bench_idempotency_records
	SET status = 'COMPLETED', resource_id = pid::text, response_body = body
	WHERE account_id = 'acct-1' AND operation = 'create-payment' AND idempotency_key = p_key;
	RETURN body;
END
$$;

-- (e) the extension in one server-side call
CREATE FUNCTION bench_pay_ext(p_key text, p_order text, p_amount int)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	r record;
	pid bigint;
	body jsonb;
BEGIN
	r := idem_reserve('create-payment', p_key,
					  jsonb_build_object('order_id', p_order, 'amount', p_amount), 'acct-1');
	IF r.outcome <> 'new' THEN
		RETURN r.response;
	END IF;
	INSERT INTO bench_payments (order_id, amount) VALUES (p_order, p_amount) RETURNING id INTO pid;
	body := jsonb_build_object('payment_id', pid, 'status', 'paid');
	PERFORM idem_complete('create-payment', p_key, body, 201, pid::text, 'acct-1');
	RETURN body;
END
$$;

-- x6, (e) in the form most PL/pgSQL callers write: SELECT * INTO from the
-- function in FROM (a function scan), the form issue 38 measured
CREATE FUNCTION bench_pay_ext_select(p_key text, p_order text, p_amount int)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	r record;
	pid bigint;
	body jsonb;
BEGIN
	SELECT * INTO r FROM idem_reserve('create-payment', p_key,
		jsonb_build_object('order_id', p_order, 'amount', p_amount), 'acct-1');
	IF r.outcome <> 'new' THEN
		RETURN r.response;
	END IF;
	INSERT INTO bench_payments (order_id, amount) VALUES (p_order, p_amount) RETURNING id INTO pid;
	body := jsonb_build_object('payment_id', pid, 'status', 'paid');
	PERFORM idem_complete('create-payment', p_key, body, 201, pid::text, 'acct-1');
	RETURN body;
END
$$;

-- idem_call's handler: the same payment row as (e)
CREATE FUNCTION bench_pay_handler(request jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	pid bigint;
BEGIN
	INSERT INTO bench_payments (order_id, amount)
	VALUES (request->>'order_id', (request->>'amount')::int) RETURNING id INTO pid;
	RETURN jsonb_build_object('payment_id', pid, 'status', 'paid');
END
$$;

-- Where (e)'s time goes (sync off only): the same flow with one part left
-- out at a time, and the floor's two rows written from PL/pgSQL.  Not
-- designs anyone should use: a record never completed stays processing.
CREATE FUNCTION bench_pay_ext_parts(p_key text, p_order text, p_amount int,
									p_fingerprint boolean, p_complete boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	r record;
	pid bigint;
	body jsonb;
BEGIN
	r := idem_reserve('create-payment', p_key,
					  CASE WHEN p_fingerprint
					  THEN jsonb_build_object('order_id', p_order, 'amount', p_amount) END,
					  'acct-1');
	IF r.outcome <> 'new' THEN
		RETURN r.response;
	END IF;
	INSERT INTO bench_payments (order_id, amount) VALUES (p_order, p_amount) RETURNING id INTO pid;
	body := jsonb_build_object('payment_id', pid, 'status', 'paid');
	IF p_complete THEN
		PERFORM idem_complete('create-payment', p_key, body, 201, pid::text, 'acct-1');
	END IF;
	RETURN body;
END
$$;

CREATE FUNCTION bench_pay_floor(p_key text, p_order text, p_amount int)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	pid bigint;
BEGIN
	INSERT INTO bench_floor_keys VALUES ('acct-1', 'create-payment', p_key);
	INSERT INTO bench_payments (order_id, amount) VALUES (p_order, p_amount) RETURNING id INTO pid;
	RETURN jsonb_build_object('payment_id', pid, 'status', 'paid');
END
$$;

-- x5, the floor of the one-write design (doc/write-path.md), written as x4
-- is: what any design that looks a key up and writes its record once,
-- completed, must do beside the payment.  One primary-key probe, the
-- request's fingerprint built and hashed as (e)'s caller and
-- idem_reserve do, and one insert of the whole record into a copy of
-- idem_keys (its CHECK, primary key, expiry and processing indexes); no
-- key lock, no outcome, no statistics.
CREATE FUNCTION bench_pay_floor_record(p_key text, p_order text, p_amount int)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
	pid bigint;
	resp jsonb;
BEGIN
	PERFORM 1 FROM bench_record_keys
	WHERE scope = 'acct-1' AND operation = 'create-payment' AND key = p_key;
	INSERT INTO bench_payments (order_id, amount) VALUES (p_order, p_amount) RETURNING id INTO pid;
	resp := jsonb_build_object('payment_id', pid, 'status', 'paid');
	INSERT INTO bench_record_keys (scope, operation, key, request_hash, status, response_status,
								   response, resource_id, expires_at)
	VALUES ('acct-1', 'create-payment', p_key,
			idem_hash(jsonb_build_object('order_id', p_order, 'amount', p_amount)),
			'completed', 201, resp, pid::text, now() + interval '24 hours');
	RETURN resp;
END
$$;
