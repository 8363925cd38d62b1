# Growth (issue 15): how the cost of a call grows with the number of live
# keys in idem_keys.  The table is filled to each size in turn
# (GROWTH_SIZES, default 10000 100000 1000000 completed records of the
# shape 60_sizing uses, written directly, analyzed and checkpointed), and
# at each size one session times, server-side, batches of
#   new       1000 idem_reserve + idem_complete pairs of new keys
#   insert    the bare effect beside it: 1000 payment rows INSERTed into a
#             table with a unique text reference (one statement)
#   replay    5000 idem_reserve calls of random existing keys
#   lookup    the bare read beside it: 5000 primary-key look-ups of random
#             existing keys in idem_keys
# GROWTH_ROUNDS (default 10) batches of each per size; the fastest batch is
# the best estimate of the cost (noise only adds time), the median is shown
# beside it.  The worker is paused meanwhile.

GROWTH_DB=idem_bench_growth
GROWTH_SIZES=${GROWTH_SIZES:-10000 100000 1000000}
GROWTH_ROUNDS=${GROWTH_ROUNDS:-10}

growth_sql() {
	BENCH_DB=$GROWTH_DB bench_sql - <<<"$1" >/dev/null
}

growth_value() {
	BENCH_DB=$GROWTH_DB bench_value "$1"
}

as_test_user dropdb --if-exists "$GROWTH_DB" >/dev/null 2>&1
as_test_user createdb "$GROWTH_DB"
growth_sql "CREATE EXTENSION idempotency;
CREATE EXTENSION pageinspect;
CREATE TABLE growth_calls (size bigint, workload text, secs float8);
CREATE TABLE growth_payments (id bigserial PRIMARY KEY, ref text UNIQUE, amount int,
	created_at timestamptz DEFAULT now());"
bench_system "SET idempotency.enabled = off"

filled=0
declare -A DEPTH=()
for size in $GROWTH_SIZES; do
	echo "70_growth: $size live keys" >&2
	growth_sql "INSERT INTO idem_keys (scope, operation, key, request_hash, status,
	response_status, response, resource_id, expires_at)
SELECT 'tenant-' || (i % 1000), 'grow', md5(i::text)::uuid::text,
	idem_hash('{\"amount\": 100, \"currency\": \"EUR\"}'), 'completed', 201,
	('{\"id\": \"pay_' || i || '\", \"status\": \"succeeded\", \"amount\": 100, \"currency\": \"EUR\"}')::jsonb,
	'pay_' || i, now() + interval '1 day'
FROM generate_series($((filled + 1)), $size) i;
VACUUM ANALYZE idem_keys;
CHECKPOINT;"
	filled=$size
	DEPTH[$size]=$(growth_value "SELECT level FROM bt_metap('idem_keys_pkey')")
	growth_sql "DO \$\$
DECLARE
	t0 timestamptz;
	n bigint;
BEGIN
	FOR round IN 1..$GROWTH_ROUNDS LOOP
		t0 := pg_catalog.clock_timestamp();
		SELECT count(idem_complete('grow-new', q.k, '{\"id\": \"pay\"}', 201, NULL, q.s)) INTO n
			FROM (SELECT 'n-$size-' || round || '-' || i AS k, 'tenant-' || (i % 1000) AS s
				  FROM generate_series(1, 1000) i) q,
			LATERAL idem_reserve('grow-new', q.k, '{\"amount\": 100}', q.s);
		INSERT INTO growth_calls VALUES ($size, 'new',
			extract(epoch FROM pg_catalog.clock_timestamp() - t0) / n);
		COMMIT;
		t0 := pg_catalog.clock_timestamp();
		INSERT INTO growth_payments (ref, amount)
			SELECT 'p-$size-' || round || '-' || i, 100 FROM generate_series(1, 1000) i;
		GET DIAGNOSTICS n = ROW_COUNT;
		INSERT INTO growth_calls VALUES ($size, 'insert',
			extract(epoch FROM pg_catalog.clock_timestamp() - t0) / n);
		COMMIT;
		t0 := pg_catalog.clock_timestamp();
		SELECT count(*) INTO n
			FROM (SELECT (random() * ($size - 1))::bigint + 1 AS j
				  FROM generate_series(1, 5000)) q,
			LATERAL idem_reserve('grow', md5(q.j::text)::uuid::text,
				'{\"amount\": 100, \"currency\": \"EUR\"}', 'tenant-' || (q.j % 1000)) r
			WHERE r.outcome = 'replay';
		IF n <> 5000 THEN
			RAISE EXCEPTION 'only % of 5000 reservations replayed', n;
		END IF;
		INSERT INTO growth_calls VALUES ($size, 'replay',
			extract(epoch FROM pg_catalog.clock_timestamp() - t0) / n);
		COMMIT;
		t0 := pg_catalog.clock_timestamp();
		SELECT count(*) INTO n
			FROM (SELECT (random() * ($size - 1))::bigint + 1 AS j
				  FROM generate_series(1, 5000)) q,
			LATERAL (SELECT 1 FROM idem_keys k
					 WHERE k.scope = 'tenant-' || (q.j % 1000) AND k.operation = 'grow'
					   AND k.key = md5(q.j::text)::uuid::text) r;
		INSERT INTO growth_calls VALUES ($size, 'lookup',
			extract(epoch FROM pg_catalog.clock_timestamp() - t0) / n);
		COMMIT;
	END LOOP;
END
\$\$;"
done
bench_system "RESET idempotency.enabled"

echo "## Growth: cost per call by number of live keys"
echo
echo "Server-side time per call in one session (µs), $GROWTH_ROUNDS batches per size and workload:" \
	"1000 reserve + complete pairs of new keys beside 1000 bare INSERTs of a payment row, and" \
	"5000 replays of random existing keys beside 5000 bare primary-key look-ups of them." \
	"Fastest batch, median in parentheses; total size of idem_keys with its indexes at the end:" \
	"$(growth_value "SELECT pg_size_pretty(pg_total_relation_size('idem_keys'))")."
echo
echo "| live keys | reserve + complete, new key | bare INSERT of the effect | ratio | replay | bare primary-key look-up | ratio | idem_keys_pkey level (bt_metap) |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
growth_value "SELECT size, workload, round((min(secs) * 1e6)::numeric, 2),
	round((percentile_cont(0.5) WITHIN GROUP (ORDER BY secs) * 1e6)::numeric, 2)
FROM growth_calls GROUP BY size, workload ORDER BY size, workload" >"$IDEM_WORK/growth.txt"
for size in $GROWTH_SIZES; do
	cell() { awk -F'|' -v s="$size" -v w="$1" '$1 == s && $2 == w { printf "%s (%s)", $3, $4 }' "$IDEM_WORK/growth.txt"; }
	best() { awk -F'|' -v s="$size" -v w="$1" '$1 == s && $2 == w { print $3 }' "$IDEM_WORK/growth.txt"; }
	printf '| %s | %s | %s | %.1f | %s | %s | %.1f | %s |\n' "$size" \
		"$(cell new)" "$(cell insert)" "$(awk -v a="$(best new)" -v b="$(best insert)" 'BEGIN { print a / b }')" \
		"$(cell replay)" "$(cell lookup)" "$(awk -v a="$(best replay)" -v b="$(best lookup)" 'BEGIN { print a / b }')" \
		"${DEPTH[$size]}"
done

as_test_user dropdb "$GROWTH_DB"
