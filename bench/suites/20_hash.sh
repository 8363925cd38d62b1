# Fingerprint cost (issue 3): idem_hash (RFC 8785 canonical form + SHA-256)
# against the built-in, non-canonical sha256(convert_to(x::text, 'UTF8')) of
# the same payment-like jsonb documents, about 1 kB and 64 kB.  Target:
# idem_hash costs at most 1.5 times the built-in.
#
# One backend times each function over the same in-memory documents (a
# PL/pgSQL loop over a jsonb[], as idem_reserve receives its request), in
# HASH_ROUNDS interleaved rounds, so that other load on the machine hits both
# sides alike; the table shows the median time per call and the median of
# the per-round ratios.
#
# Then memory: the peak resident memory a call adds on top of the backend
# (VmHWM reset through /proc/PID/clear_refs) for a ~35 MB document, next to
# merely detoasting it; and the backend's memory contexts before and after
# 200000 calls on 1 kB documents and 40 calls on the big one (no growth
# means nothing outlives a call).

HASH_DB=idem_bench_hash
HASH_ROUNDS=${HASH_ROUNDS:-7}

hash_psql() {
	as_test_user psql -X -q -At -v ON_ERROR_STOP=1 -d "$HASH_DB" "$@"
}

as_test_user psql -X -q -v ON_ERROR_STOP=1 -d postgres \
	-c "SET client_min_messages = warning" \
	-c "DROP DATABASE IF EXISTS $HASH_DB" -c "CREATE DATABASE $HASH_DB" >/dev/null

hash_psql >/dev/null <<'SQL'
CREATE EXTENSION idempotency;
SELECT setseed(0.8785);

-- A card payment request as an API would receive it, with n line items
CREATE FUNCTION bench_payment(n int, seq int) RETURNS jsonb LANGUAGE sql AS $$
SELECT jsonb_build_object(
  'amount', (random() * 100000)::int,
  'currency', 'BRL',
  'capture', true,
  'description', 'Pedido #' || (100000 + seq) || ' - Loja Exemplo',
  'installments', 1 + seq % 12,
  'statement_descriptor', 'EXEMPLO*LOJA',
  'customer', jsonb_build_object(
    'id', 'cus_' || md5(seq::text),
    'name', 'João da Silva ' || seq,
    'email', 'joao.silva' || seq || '@example.com',
    'phone', '+55 11 9' || lpad((seq::bigint * 7919 % 100000000)::text, 8, '0'),
    'document', lpad((seq::bigint * 104729 % 100000000000)::text, 11, '0'),
    'address', jsonb_build_object(
      'line1', 'Avenida Paulista, ' || (1 + seq % 2000),
      'line2', CASE WHEN seq % 3 = 0 THEN 'Conjunto ' || seq % 100 END,
      'city', 'São Paulo', 'state', 'SP',
      'postal_code', '01310-' || lpad((seq % 1000)::text, 3, '0'),
      'country', 'BR')),
  'payment_method', jsonb_build_object(
    'type', 'card',
    'card', jsonb_build_object('brand', 'visa', 'last4', lpad((seq % 10000)::text, 4, '0'),
                               'exp_month', 1 + seq % 12, 'exp_year', 2026 + seq % 8,
                               'holder_name', 'JOAO DA SILVA')),
  'items', (SELECT jsonb_agg(jsonb_build_object(
              'sku', 'SKU-' || lpad(((seq + i) * 31 % 100000)::text, 6, '0'),
              'name', 'Produto de exemplo nº ' || i,
              'quantity', 1 + i % 4,
              'unit_price', round((random() * 500)::numeric, 2),
              'discount', CASE WHEN i % 5 = 0 THEN 0.10 ELSE 0.00 END,
              'tax_rate', 0.18))
            FROM generate_series(1, n) i),
  'metadata', jsonb_build_object(
    'order_id', 'ord_' || md5((seq * 2)::text),
    'channel', 'web', 'ip', '203.0.113.' || seq % 255,
    'user_agent', 'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)',
    'created_at', '2024-05-01T12:00:00.000Z'))
$$;

CREATE TABLE bench_hash_docs (size text, doc jsonb);
INSERT INTO bench_hash_docs SELECT '1k', bench_payment(2, s) FROM generate_series(1, 100) s;
INSERT INTO bench_hash_docs SELECT '64k', bench_payment(475, s) FROM generate_series(1, 20) s;
-- about 35 MB in one document, for the memory checks
CREATE TABLE bench_hash_big AS
SELECT jsonb_build_object('batch', jsonb_agg(bench_payment(2, s))) AS doc
FROM generate_series(1, 32000) s;

-- Microseconds per call of one function over the documents of one size
CREATE FUNCTION bench_hash_time(fn text, sz text, reps int) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
  docs jsonb[];
  d jsonb;
  h bytea;
  t text;
  t0 timestamptz;
BEGIN
  SELECT array_agg(doc) INTO docs FROM bench_hash_docs WHERE size = sz;
  t0 := clock_timestamp();
  FOR i IN 1..reps LOOP
    IF fn = 'builtin' THEN
      FOREACH d IN ARRAY docs LOOP h := sha256(convert_to(d::text, 'UTF8')); END LOOP;
    ELSIF fn = 'idem_hash' THEN
      FOREACH d IN ARRAY docs LOOP h := idem_hash(d); END LOOP;
    ELSE
      FOREACH d IN ARRAY docs LOOP t := idem_canonical(d); END LOOP;
    END IF;
  END LOOP;
  RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / (reps * cardinality(docs));
END
$$;

-- Bytes of all of this backend's memory contexts
CREATE FUNCTION bench_hash_mem() RETURNS bigint LANGUAGE sql AS
$$ SELECT sum(total_bytes)::bigint FROM pg_backend_memory_contexts $$;
SQL

read -r size_1k size_64k size_big <<<"$(hash_psql -F ' ' -c "
SELECT (SELECT avg(octet_length(doc::text))::int FROM bench_hash_docs WHERE size = '1k'),
       (SELECT avg(octet_length(doc::text))::int FROM bench_hash_docs WHERE size = '64k'),
       (SELECT octet_length(doc::text) FROM bench_hash_big)")"

# Interleaved rounds: every round times every function on both sizes
hash_times=$IDEM_WORK/bench-20_hash.times
: >"$hash_times"
for round in $(seq 1 "$HASH_ROUNDS"); do
	hash_psql -F ' ' >>"$hash_times" <<SQL
SELECT $round, '1k', 'builtin', bench_hash_time('builtin', '1k', 100);
SELECT $round, '1k', 'idem_hash', bench_hash_time('idem_hash', '1k', 100);
SELECT $round, '1k', 'idem_canonical', bench_hash_time('idem_canonical', '1k', 100);
SELECT $round, '64k', 'builtin', bench_hash_time('builtin', '64k', 10);
SELECT $round, '64k', 'idem_hash', bench_hash_time('idem_hash', '64k', 10);
SELECT $round, '64k', 'idem_canonical', bench_hash_time('idem_canonical', '64k', 10);
SQL
done

# Median of a list of numbers on stdin
hash_median() {
	sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# Median time per call of FN on SZ
hash_us() {
	awk -v sz="$1" -v fn="$2" '$2 == sz && $3 == fn { print $4 }' "$hash_times" | hash_median
}

# Median over rounds of FN's time / the built-in's time in the same round
hash_ratio() {
	awk -v sz="$1" -v fn="$2" '
		$2 == sz && $3 == "builtin" { b[$1] = $4 }
		$2 == sz && $3 == fn { f[$1] = $4 }
		END { for (r in f) if (b[r] > 0) print f[r] / b[r] }' "$hash_times" | hash_median
}

hash_row() {
	local label=$1 sz=$2 fn=$3 us
	us=$(hash_us "$sz" "$fn")
	printf '| %s | %s | %.1f | %.0f | %.2f |\n' "$label" "$4" "$us" \
		"$(awk -v u="$us" 'BEGIN { print 1e6 / u }')" "$(hash_ratio "$sz" "$fn")"
}

echo "## Fingerprint: idem_hash vs sha256(convert_to(x::text, 'UTF8'))"
echo
echo "One backend, in-memory jsonb documents, median of $HASH_ROUNDS interleaved rounds;"
echo "cost = time per call / the built-in's in the same round (target: idem_hash <= 1.50)."
echo
echo "| function | document | µs per call | calls/s (one backend) | cost vs built-in |"
echo "|---|---|---|---|---|"
hash_row "sha256(convert_to(x::text, 'UTF8')) (built-in, not canonical)" 1k builtin "1 kB (~$size_1k B text)"
hash_row "idem_hash(x)" 1k idem_hash "1 kB (~$size_1k B text)"
hash_row "idem_canonical(x)" 1k idem_canonical "1 kB (~$size_1k B text)"
hash_row "sha256(convert_to(x::text, 'UTF8')) (built-in, not canonical)" 64k builtin "64 kB (~$size_64k B text)"
hash_row "idem_hash(x)" 64k idem_hash "64 kB (~$size_64k B text)"
hash_row "idem_canonical(x)" 64k idem_canonical "64 kB (~$size_64k B text)"

# Peak resident memory (kB) that QUERY adds to a fresh backend that has
# already read the big document once (so shared buffers count on both sides)
hash_peak_kb() {
	local out rss hwm
	out=$(hash_psql 2>&1 <<SQL
SELECT pg_backend_pid() AS bpid \gset
\setenv BPID :bpid
SELECT jsonb_typeof(doc) FROM bench_hash_big;
\o /dev/null
SELECT $1 FROM bench_hash_big;
\o
\! echo 5 > /proc/\$BPID/clear_refs && awk '/^VmRSS/ { print "rss", \$2 }' /proc/\$BPID/status
\o /dev/null
SELECT $1 FROM bench_hash_big;
\o
\! awk '/^VmHWM/ { print "hwm", \$2 }' /proc/\$BPID/status
SQL
	) || { echo "n/a"; return; }
	rss=$(awk '$1 == "rss" { print $2 }' <<<"$out")
	hwm=$(awk '$1 == "hwm" { print $2 }' <<<"$out")
	if [ -z "$rss" ] || [ -z "$hwm" ]; then echo "n/a"; else echo $((hwm - rss)); fi
}

echo
echo "## Fingerprint memory"
echo
echo "Peak resident memory one call adds to the backend, document of $((size_big / 1048576)) MB of JSON text"
echo "(VmHWM after resetting it with /proc/PID/clear_refs; the second of two identical calls):"
echo
echo "| call | peak added (MB) |"
echo "|---|---|"
for q in "jsonb_typeof(doc)" "length(idem_hash(doc))" "octet_length(idem_canonical(doc))" \
	"length(sha256(convert_to(doc::text, 'UTF8')))"; do
	kb=$(hash_peak_kb "$q")
	if [ "$kb" = n/a ]; then mb=n/a; else mb=$(awk -v k="$kb" 'BEGIN { printf "%.1f", k / 1024 }'); fi
	printf '| `%s` | %s |\n' "$q" "$mb"
done

read -r m0 m1 m2 m3 <<<"$(hash_psql -F ' ' <<'SQL'
CREATE FUNCTION bench_hash_big_loop(n int) RETURNS void LANGUAGE plpgsql AS $$
DECLARE d jsonb; t text;
BEGIN
  SELECT doc INTO d FROM bench_hash_big;
  FOR i IN 1..n LOOP t := idem_canonical(d); t := encode(idem_hash(d), 'hex'); END LOOP;
END $$;
-- warm up caches (catalog, function lookups, PL/pgSQL compilation) first
SELECT bench_hash_time('idem_hash', '1k', 10), bench_hash_time('idem_canonical', '1k', 10),
       bench_hash_big_loop(1) \gset
SELECT bench_hash_mem() AS m0 \gset
SELECT bench_hash_time('idem_hash', '1k', 1000), bench_hash_time('idem_canonical', '1k', 1000) \gset
SELECT bench_hash_mem() AS m1 \gset
SELECT bench_hash_big_loop(10) \gset
SELECT bench_hash_mem() AS m2 \gset
SELECT bench_hash_big_loop(10) \gset
SELECT :m0, :m1, :m2, bench_hash_mem();
SQL
)"
echo
echo "Backend memory contexts after warm-up (sum of total_bytes): $m0 bytes; $m1 after 100000 idem_hash"
echo "and 100000 idem_canonical calls on 1 kB documents; $m2 after 10 more of each on the big document;"
echo "$m3 after 10 more."

as_test_user psql -X -q -d postgres -c "DROP DATABASE $HASH_DB" >/dev/null
