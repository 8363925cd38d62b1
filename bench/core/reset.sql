-- Before every run of bench/suites/10_core.sh: the same starting point for
-- every variant (empty tables, checkpointed), plus the completed keys that
-- (f) replays.  Without it each variant would run on the rows its
-- predecessors left, and random keys in a bigger index cost more, in CPU
-- and in full-page images after the checkpoint.
TRUNCATE bench_payments, bench_idempotency_records, bench_floor_keys, idem_keys;
SELECT count(*) FROM (
	SELECT idem_reserve('create-payment', 'replay-' || i,
						jsonb_build_object('order_id', 'o-' || i, 'amount', 100), 'acct-1'),
		   idem_complete('create-payment', 'replay-' || i,
						 jsonb_build_object('payment_id', i, 'status', 'paid'), 201, i::text, 'acct-1')
	FROM generate_series(1, 10000) i) s \gset
VACUUM ANALYZE;
CHECKPOINT;
