\set k random(1, 9000000000000000)
\redis reserved SET idem:k-:k PROCESSING NX EX 86400
\if :reserved
INSERT INTO bench_payments (order_id, amount) VALUES ('o-:k', 100) RETURNING id AS pid \gset
\redis - SET idem:k-:k {"payment_id":":pid","status":"paid"} EX 86400
\else
\redis saved GET idem:k-:k
\endif
