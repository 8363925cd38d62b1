-- An external payment gateway, called in two phases with recovery points,
-- and a reconciler for the attempts whose outcome is unknown.
--
-- No database transaction includes the gateway: once it has charged, a
-- crash before we record the result leaves a key in "processing", and a
-- blind retry would charge twice.  So the client works in phases, each its
-- own transaction (client.sh):
--
--   phase 1   idem_reserve + idem_checkpoint('calling-gateway'), COMMIT
--   call      gateway.charge(reference => key, ...)      (outside our transactions)
--   phase 1b  idem_checkpoint('charged:<charge id>'), COMMIT
--   phase 2   INSERT INTO payments + idem_complete(201), COMMIT
--
-- A client that dies between phases leaves a processing record with its
-- last recovery point.  Retries get 409 (in_progress, then stuck once it is
-- older than idempotency.processing_timeout).  The reconciler asks the
-- gateway what happened to the stuck ones and settles each: completed with
-- the charge it finds, or released so that a retry charges.
--
-- Needs: CREATE EXTENSION idempotency (in a schema on search_path).

--
-- The gateway (simulated).  It charges every time it is asked -- it does
-- not de-duplicate -- and lets a merchant look charges up by the reference
-- the merchant sent.  The application only calls these functions, outside
-- its own transactions, as it would call an HTTP API.
--
CREATE SCHEMA gateway;

CREATE TABLE gateway.charges (
	id			text PRIMARY KEY
				DEFAULT 'ch_' || substr(md5(random()::text || clock_timestamp()), 1, 16),
	reference	text NOT NULL,		-- the merchant's reference: our key
	order_id	text NOT NULL,		-- metadata the merchant attached
	amount		bigint NOT NULL,
	created_at	timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- POST /charges
CREATE FUNCTION gateway.charge(reference text, order_id text, amount bigint)
RETURNS text
LANGUAGE sql AS $$
	INSERT INTO gateway.charges (reference, order_id, amount)
	VALUES (reference, order_id, amount)
	RETURNING id
$$;

-- GET /charges?reference=...
CREATE FUNCTION gateway.find_charges(ref text)
RETURNS SETOF gateway.charges
LANGUAGE sql STABLE AS $$
	SELECT * FROM gateway.charges WHERE reference = ref ORDER BY created_at
$$;

--
-- The application
--
CREATE TABLE payments (
	id			bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id	text NOT NULL,
	amount		bigint NOT NULL,
	charge_id	text NOT NULL UNIQUE,
	created_at	timestamptz NOT NULL DEFAULT now()
);

-- The response of a paid charge, the same from phase 2 and the reconciler
CREATE FUNCTION payment_response(payment_id bigint, charge_id text,
								 order_id text, amount bigint)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
	SELECT jsonb_build_object('id', payment_id, 'charge', charge_id,
							  'order_id', order_id, 'amount', amount,
							  'status', 'paid')
$$;

-- Phase 1: reserve, and say what we are about to do before calling out
CREATE FUNCTION charge_begin(key text, request jsonb,
							 OUT outcome text, OUT http_status int,
							 OUT response jsonb, OUT recovery_point text)
LANGUAGE plpgsql AS $$
BEGIN
	SELECT r.outcome, r.http_status, r.response, r.recovery_point
	INTO outcome, http_status, response, recovery_point
	FROM idem_reserve('charge-card', key, request) AS r;
	IF outcome = 'new' THEN
		PERFORM idem_checkpoint('charge-card', key, 'calling-gateway');
	END IF;
END
$$;

-- Phase 1b: the gateway answered; remember its charge as a recovery point
CREATE FUNCTION charge_charged(key text, charge_id text) RETURNS void
LANGUAGE sql AS $$
	SELECT idem_checkpoint('charge-card', key, 'charged:' || charge_id)
$$;

-- Phase 2: the local effect and the completion, in one transaction
CREATE FUNCTION charge_finish(key text, request jsonb, charge_id text)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	payment_id	bigint;
	body		jsonb;
BEGIN
	INSERT INTO payments (order_id, amount, charge_id)
	VALUES (request->>'order_id', (request->>'amount')::bigint, charge_id)
	RETURNING id INTO payment_id;
	body := payment_response(payment_id, charge_id, request->>'order_id',
							 (request->>'amount')::bigint);
	PERFORM idem_complete('charge-card', key, body, 201, payment_id::text);
	RETURN body;
END
$$;

--
-- Reconciliation
--

-- Settle one record whose first attempt's outcome is unknown, by asking the
-- gateway.  Takes an idem_keys row, as the background worker's reconcilers
-- do (idem_set_reconciler), and resolves it with idem_complete or
-- idem_release.  Any error leaves the record as it was.  The search_path is
-- pinned because the worker, not a client session, may be the caller.  A
-- reconciler runs with its registrar's rights: every schema on the path
-- pinned here (the one this file is loaded into, and the extension's) must
-- be one where only roles you trust can create objects, or a function
-- planted there could be called instead of the one named below
-- (doc/security.md, "Install in a schema of its own").
CREATE FUNCTION reconcile_charge(rec idem_keys) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
	charges		gateway.charges[];
	ch			gateway.charges;
	payment_id	bigint;
BEGIN
	charges := ARRAY(SELECT c FROM gateway.find_charges(rec.key) AS c);

	-- The client got as far as recording the charge: it must be there
	IF rec.recovery_point LIKE 'charged:%'
		AND NOT substr(rec.recovery_point, 9) = ANY (SELECT (c).id FROM unnest(charges) AS c)
	THEN
		RAISE EXCEPTION 'charge % of key % is unknown to the gateway',
			substr(rec.recovery_point, 9), rec.key;
	END IF;

	IF cardinality(charges) = 0 THEN
		-- Never charged: free the key, and the client's next retry runs again
		PERFORM idem_release(rec.operation, rec.key, rec.scope);
	ELSIF cardinality(charges) = 1 THEN
		-- Charged: record the payment the client could not, and complete
		ch := charges[1];
		INSERT INTO payments (order_id, amount, charge_id)
		VALUES (ch.order_id, ch.amount, ch.id)
		ON CONFLICT (charge_id) DO NOTHING
		RETURNING id INTO payment_id;
		IF payment_id IS NULL THEN
			SELECT id INTO payment_id FROM payments WHERE charge_id = ch.id;
		END IF;
		PERFORM idem_complete(rec.operation, rec.key,
							  payment_response(payment_id, ch.id, ch.order_id, ch.amount),
							  201, payment_id::text, rec.scope);
	ELSE
		RAISE EXCEPTION 'key % has % charges at the gateway; refund by hand',
			rec.key, cardinality(charges);
	END IF;
END
$$;

-- Run the reconciler over every charge-card record that is stuck: flagged,
-- or processing for longer than idempotency.processing_timeout.  One
-- record's failure does not stop the others.  Schedule it (pg_cron), or let
-- the background worker call reconcile_charge once it is registered with
-- idem_set_reconciler('charge-card', 'reconcile_charge(idem_keys)').
CREATE FUNCTION reconcile_stuck_charges()
RETURNS TABLE (key text, recovery_point text, resolution text)
LANGUAGE plpgsql AS $$
DECLARE
	rec			idem_keys;
BEGIN
	FOR rec IN
		SELECT * FROM idem_keys k
		WHERE k.operation = 'charge-card'
		  AND (k.status = 'stuck'
			   OR (k.status = 'processing'
				   AND k.updated_at < now() - current_setting('idempotency.processing_timeout')::interval))
		ORDER BY k.created_at
	LOOP
		key := rec.key;
		recovery_point := rec.recovery_point;
		BEGIN
			PERFORM reconcile_charge(rec);
			SELECT coalesce(max(l.status) || ', payment ' || max(l.resource_id), 'released')
			INTO resolution
			FROM idem_lookup(rec.operation, rec.key, rec.scope) AS l;
		EXCEPTION WHEN OTHERS THEN
			RAISE WARNING 'could not reconcile key %: %', rec.key, SQLERRM;
			resolution := 'left stuck: ' || SQLERRM;
		END;
		RETURN NEXT;
	END LOOP;
END
$$;
