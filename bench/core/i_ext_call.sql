\set k random(1, 9000000000000000)
SELECT idem_call('create-payment', 'k-:k', jsonb_build_object('order_id', 'o-:k', 'amount', 100), 'bench_pay_handler(jsonb)', 'acct-1');
