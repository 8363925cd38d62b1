\set k random(1, 9000000000000000)
BEGIN;
WITH ins AS (
	INSERT INTO bench_idempotency_records
		(account_id, operation, idempotency_key, request_hash, status, expires_at)
	VALUES ('acct-1', 'create-payment', 'k-:k',
			encode(sha256(convert_to(jsonb_build_object('order_id', 'o-:k', 'amount', 100)::text, 'UTF8')), 'hex'),
			'PROCESSING', now() + interval '24 hours')
	ON CONFLICT DO NOTHING RETURNING 1)
SELECT count(*) AS inserted FROM ins \gset
\if :inserted
INSERT INTO bench_payments (order_id, amount) VALUES ('o-:k', 100) RETURNING id AS pid \gset
UPDATE bench_idempotency_records
SET status = 'COMPLETED', resource_id = :pid, response_body = jsonb_build_object('payment_id', :pid, 'status', 'paid')
WHERE account_id = 'acct-1' AND operation = 'create-payment' AND idempotency_key = 'k-:k';
\else
SELECT status, request_hash, response_body FROM bench_idempotency_records
WHERE account_id = 'acct-1' AND operation = 'create-payment' AND idempotency_key = 'k-:k';
\endif
COMMIT;
