\set k random(1, 9000000000000000)
SELECT idem_call('create-payment', 'k-:k', jsonb_build_object('order_id', 'o-:k-' || repeat('x', 10000), 'amount', 100), 'bench_pay_handler(jsonb)', 'acct-1');
