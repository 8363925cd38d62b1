\set k random(1, 9000000000000000)
SELECT outcome, http_status, response
FROM idem_reserve('create-payment', 'k-:k', '{"amount": 100}', 'acct-1');
