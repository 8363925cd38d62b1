\set k random(1, 9000000000000000)
SELECT outcome = 'new' AS is_new
FROM idem_reserve('create-payment', 'k-:k', jsonb_build_object('order_id', 'o-:k', 'amount', 100), 'acct-1') \gset
\if :is_new
INSERT INTO bench_payments (order_id, amount) VALUES ('o-:k', 100) RETURNING id AS pid \gset
SELECT idem_complete('create-payment', 'k-:k', jsonb_build_object('payment_id', :pid, 'status', 'paid'), 201, :pid::text, 'acct-1');
\endif
