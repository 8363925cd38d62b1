\set i random(1, 10000)
SELECT outcome, http_status, response
FROM idem_reserve('create-payment', 'replay-:i', jsonb_build_object('order_id', 'o-:i', 'amount', 100), 'acct-1');
