\set k random(1, 9000000000000000)
INSERT INTO bench_payments (order_id, amount) VALUES ('o-:k', 100);
