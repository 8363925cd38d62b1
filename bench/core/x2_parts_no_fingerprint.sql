\set k random(1, 9000000000000000)
SELECT bench_pay_ext_parts('k-:k', 'o-:k', 100, false, true);
