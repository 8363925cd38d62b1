# Scale (issue 18, item 4): the cost of a request as idem_keys holds
# SCALE_SIZES (default 100000 1000000 10000000) live records, for random
# keys (uuid4) and time-ordered keys (UUIDv7-like; PostgreSQL 15 has no
# uuidv7(), so the load generator makes them, and bench/core/scale_keys.sql
# the loaded ones alike).  At each size and key shape:
#   - the records are loaded with one INSERT ... SELECT generate_series
#     (completed, expiring in a day) with the primary key dropped and added
#     again after it (built by sorting: packed pages, as after a REINDEX),
#     then VACUUM ANALYZE, and the primary key read into shared buffers
#     (pg_prewarm: CREATE INDEX writes past them; a live index is hot);
#     every run starts after a CHECKPOINT, the worst moment for
#     full-page images of random primary-key pages;
#   - heap and primary-key bytes per record;
#   - idem_flag_stuck() with nothing stuck and idem_sweep() with nothing
#     expired (a pass of each; the fastest of 3);
#   - replays (bench/core/r_replay_loaded.sql) of recent keys (the last
#     10,000 loaded) and of random keys (10,000 of all), sync off;
#   - new keys ((e), bench/core/e_ext_server.sql: reserve, the payment
#     INSERT, complete) with synchronous_commit off and on, and their WAL
#     bytes per request (pg_current_wal_lsn before and after).
# SCALE_SECONDS (default 5) per run, BENCH_CLIENTS connections, prepared
# statements, the worker paused.  Each size's records are deleted before
# the next is loaded (df -h / : 10 M records take about 4 GB with their WAL).
# Targets: at the largest size, new keys >= 0.90 and replays >= 0.85 of
# their rate at the smallest, sync off, per key shape; idem_flag_stuck()
# and idem_sweep() under 5 ms (issue 25: the worker's cost follows the work).

SCALE_SIZES=${SCALE_SIZES:-100000 1000000 10000000}
SCALE_SHAPES=${SCALE_SHAPES:-uuid4 uuid7}
SCALE_SECONDS=${SCALE_SECONDS:-5}
bench_loadgen_build

SCALE_DB=idem_bench_scale
bench_core_db "$SCALE_DB"
BENCH_DB=$SCALE_DB bench_sql "$IDEM_SRC/bench/core/scale_keys.sql"
scale_sql() {
	BENCH_DB=$SCALE_DB bench_sql - <<<"$1" >/dev/null
}
scale_sql "CREATE EXTENSION pg_prewarm"
bench_system "SET idempotency.enabled = off"

declare -A SCALE
for shape in $SCALE_SHAPES; do
	for size in $SCALE_SIZES; do
		echo "95_scale: $shape, $size records" >&2
		scale_sql "TRUNCATE idem_keys, bench_payments, bench_scale_base;
INSERT INTO bench_scale_base
SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $size - 60000;
SET maintenance_work_mem = '1GB';
ALTER TABLE idem_keys DROP CONSTRAINT idem_keys_pkey;
INSERT INTO idem_keys (scope, operation, key, request_hash, status, response_status,
	response, resource_id, expires_at, ttl)
SELECT 'acct-1', 'create-payment', 'k-' || bench_scale_key('$shape', i), h, 'completed', 201,
	jsonb_build_object('payment_id', i, 'status', 'paid'), i::text,
	now() + interval '1 day', interval '1 day'
FROM idem_hash('{\"amount\": 100}') h, generate_series(1, $size) i;
ALTER TABLE idem_keys ADD CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, operation, key);
VACUUM ANALYZE idem_keys;
SELECT pg_prewarm('idem_keys_pkey');"
		s=$shape/$size
		IFS='|' read -r SCALE[$s/heap] SCALE[$s/index] < <(BENCH_DB=$SCALE_DB bench_value \
			"SELECT round(pg_relation_size('idem_keys')::numeric / $size),
					round(pg_indexes_size('idem_keys')::numeric / $size)")
		read -r SCALE[$s/stuck] SCALE[$s/sweep] < <(BENCH_DB=$SCALE_DB bench_value "DO \$\$
DECLARE
	t0 timestamptz;
	stuck float8 := 'infinity';
	sweep float8 := 'infinity';
BEGIN
	FOR i IN 1..3 LOOP
		t0 := clock_timestamp();
		PERFORM idem_flag_stuck();
		stuck := least(stuck, extract(epoch FROM clock_timestamp() - t0) * 1000);
		t0 := clock_timestamp();
		PERFORM idem_sweep();
		sweep := least(sweep, extract(epoch FROM clock_timestamp() - t0) * 1000);
	END LOOP;
	RAISE NOTICE '% %', round(stuck::numeric, 2), round(sweep::numeric, 2);
END
\$\$" 2>&1 | sed -n 's/^NOTICE: *//p')
		for kind in recent random; do
			if [ "$kind" = recent ]; then
				list="SELECT bench_scale_key('$shape', i) FROM generate_series(greatest($size - 9999, 1), $size) i"
			else
				list="SELECT bench_scale_key('$shape', 1 + (random() * ($size - 1))::bigint) FROM generate_series(1, 10000)"
			fi
			scale_sql "CHECKPOINT"
			bench_load "scale/$s/replay_$kind" "$IDEM_SRC/bench/core/r_replay_loaded.sql" \
				"$SCALE_DB options='-c synchronous_commit=off'" -c "$BENCH_CLIENTS" -T "$SCALE_SECONDS" \
				--key-var k --key-shape list --key-list "$list" --wal
		done
		for sync in off on; do
			scale_sql "CHECKPOINT"
			bench_load "scale/$s/new_$sync" "$IDEM_SRC/bench/core/e_ext_server.sql" \
				"$SCALE_DB options='-c synchronous_commit=$sync'" -c "$BENCH_CLIENTS" -T "$SCALE_SECONDS" \
				--key-var k --key-shape "$shape" --wal
		done
		scale_sql "TRUNCATE idem_keys, bench_payments; CHECKPOINT"
	done
done
as_test_user dropdb "$SCALE_DB"
bench_system "RESET idempotency.enabled"

scale_first=${SCALE_SIZES%% *}
scale_last=${SCALE_SIZES##* }
scale_ratio() {
	awk -v a="$(load_get "scale/$1/$scale_last/$2" rps)" -v b="$(load_get "scale/$1/$scale_first/$2" rps)" \
		'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
}

echo "## Scale: live records in idem_keys (95_scale)"
echo
echo "bench/loadgen.c, $BENCH_CLIENTS connections, prepared statements, ${SCALE_SECONDS} s per run, one run each,"
echo "each after a CHECKPOINT, the primary key read into shared buffers after the load; the worker paused."
echo "New keys: (e), the payment with its reserve and complete."
echo "Replays: idem_reserve of loaded keys, the last 10,000 loaded (recent) or 10,000 of all (random)."
echo
echo "| keys | live records | new keys/s, sync off | WAL bytes per new key | new keys/s, sync on | replays/s, recent keys | replays/s, random keys | heap bytes per record | index bytes per record | idem_flag_stuck() ms, nothing stuck | idem_sweep() ms, nothing expired |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for shape in $SCALE_SHAPES; do
	for size in $SCALE_SIZES; do
		s=$shape/$size
		printf '| %s | %s | %.0f | %s | %.0f | %.0f | %.0f | %s | %s | %s | %s |\n' \
			"$([ "$shape" = uuid4 ] && echo "random (uuid4)" || echo "time-ordered (UUIDv7-like)")" "$size" \
			"$(load_get "scale/$s/new_off" rps)" "$(load_get "scale/$s/new_off" wal_bytes)" \
			"$(load_get "scale/$s/new_on" rps)" "$(load_get "scale/$s/replay_recent" rps)" \
			"$(load_get "scale/$s/replay_random" rps)" "${SCALE[$s/heap]}" "${SCALE[$s/index]}" \
			"${SCALE[$s/stuck]}" "${SCALE[$s/sweep]}"
	done
done
echo
echo "Targets (issue 18, item 4; issue 25 for idem_sweep()): at $scale_last records against $scale_first, sync off; idem_flag_stuck() with nothing stuck, idem_sweep() with nothing expired."
echo
echo "| target | wanted | measured | |"
echo "|---|---:|---:|---|"
for shape in $SCALE_SHAPES; do
	name=$([ "$shape" = uuid4 ] && echo "random keys" || echo "time-ordered keys")
	target_row "$name: new keys at $scale_last / at $scale_first" "$(scale_ratio "$shape" new_off)" ">=" 0.90
	target_row "$name: replays of recent keys at $scale_last / at $scale_first" "$(scale_ratio "$shape" replay_recent)" ">=" 0.85
	target_row "$name: replays of random keys at $scale_last / at $scale_first" "$(scale_ratio "$shape" replay_random)" ">=" 0.85
	echo "| $name: new keys at $scale_last / at $scale_first, sync on (no target) | | $(scale_ratio "$shape" new_on) | |"
	for size in $SCALE_SIZES; do
		target_row "$name: idem_flag_stuck() ms at $size records" "${SCALE[$shape/$size/stuck]}" "<" 5
		target_row "$name: idem_sweep() ms at $size records" "${SCALE[$shape/$size/sweep]}" "<" 5
	done
done
