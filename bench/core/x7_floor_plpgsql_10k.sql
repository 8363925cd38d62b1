\set k random(1, 9000000000000000)
SELECT bench_pay_floor('k-:k', 'o-:k-' || repeat('x', 10000), 100);
