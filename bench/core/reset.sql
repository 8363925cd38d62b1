-- Before every run of bench/suites/10_core.sh: the same starting point for
-- every variant.  Each table holds 50,000 earlier rows (idem_keys: 10,000
-- completed keys that (f) replays plus 40,000 more), analyzed and
-- checkpointed.  Without the reset each variant would run on the rows its
-- predecessors left (random keys in a bigger index cost more CPU and more
-- full-page images); on empty tables PL/pgSQL's cached plans would settle on
-- sequential scans that the growing table then punishes.
TRUNCATE bench_payments, bench_idempotency_records, bench_floor_keys, bench_record_keys, idem_keys;
INSERT INTO bench_payments (order_id, amount)
SELECT 'pre-' || i, 100 FROM generate_series(1, 50000) i;
INSERT INTO bench_idempotency_records
	(account_id, operation, idempotency_key, request_hash, status, resource_id,
	 response_body, expires_at)
SELECT 'acct-1', 'create-payment', 'pre-' || i,
	   encode(sha256(convert_to(jsonb_build_object('order_id', 'pre-' || i, 'amount', 100)::text, 'UTF8')), 'hex'),
	   'COMPLETED', i::text, jsonb_build_object('payment_id', i, 'status', 'paid'),
	   now() + interval '24 hours'
FROM generate_series(1, 50000) i;
INSERT INTO bench_floor_keys
SELECT 'acct-1', 'create-payment', 'pre-' || i FROM generate_series(1, 50000) i;
SELECT count(*) FROM (
	SELECT idem_reserve('create-payment', 'replay-' || i,
						jsonb_build_object('order_id', 'o-' || i, 'amount', 100), 'acct-1'),
		   idem_complete('create-payment', 'replay-' || i,
						 jsonb_build_object('payment_id', i, 'status', 'paid'), 201, i::text, 'acct-1')
	FROM generate_series(1, 10000) i) s \gset
INSERT INTO idem_keys (scope, operation, key, request_hash, status, response_status,
					   response, resource_id, expires_at)
SELECT 'acct-1', 'create-payment', 'pre-' || i,
	   idem_hash(jsonb_build_object('order_id', 'pre-' || i, 'amount', 100)),
	   'completed', 201, jsonb_build_object('payment_id', i, 'status', 'paid'), i::text,
	   now() + interval '24 hours'
FROM generate_series(1, 40000) i;
INSERT INTO bench_record_keys SELECT * FROM idem_keys;
VACUUM ANALYZE;
CHECKPOINT;
