\set i random(1, 10000)
SELECT response_status, response
FROM idem_keys WHERE scope = 'acct-1' AND operation = 'create-payment' AND key = 'replay-:i';
