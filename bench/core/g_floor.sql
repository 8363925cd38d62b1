\set k random(1, 9000000000000000)
WITH key AS (INSERT INTO bench_floor_keys VALUES ('acct-1', 'create-payment', 'k-:k'))
INSERT INTO bench_payments (order_id, amount) VALUES ('o-:k', 100);
