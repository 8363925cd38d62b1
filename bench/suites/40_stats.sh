# Statistics overhead (issue 5): TPS with idempotency.track_stats on and off,
# same build, same cluster.  Each round runs two pgbench processes at the
# same time over the same tables, side A whose sessions count statistics and
# side B whose sessions do not, so that whatever else the machine is doing
# slows both sides alike; with the CPUs saturated, the scheduler gives both
# sides the same CPU time and the TPS ratio is the ratio of the
# per-transaction costs.  Rounds alternate which side starts first and which
# key range each side writes.  A control row runs both sides with
# track_stats off: its spread is the noise floor of the method.
# Target: on/off >= 0.98.
#
#   reserve/complete    BEGIN; idem_reserve of a new key; idem_complete; COMMIT
#                       (each commit waits for its WAL flush)
#   reserve/complete, synchronous_commit off
#                       the same without the flush wait: CPU-bound, where the
#                       counters' share of the work is largest
#   replay              idem_reserve of an existing completed key (read-only)
#
# Then the server-side time per call, measured inside one session with
# batches alternated on/off, which no client or scheduler noise reaches.
#
# STATS_ROUNDS (default 4) rounds of BENCH_SECONDS per row;
# STATS_CLIENTS (default BENCH_CLIENTS / 2) clients per side;
# STATS_PERCALL_ROUNDS (default 40) batches per setting.

STATS_DB=idem_bench_stats
STATS_ROUNDS=${STATS_ROUNDS:-4}
STATS_CLIENTS=${STATS_CLIENTS:-$(((BENCH_CLIENTS + 1) / 2))}
STATS_PERCALL_ROUNDS=${STATS_PERCALL_ROUNDS:-40}
stats_dir=$IDEM_WORK/bench-40_stats

stats_sql() {
	BENCH_DB=$STATS_DB bench_sql - <<<"$1" >/dev/null
}

stats_value() {
	as_test_user psql -X -q -At -v ON_ERROR_STOP=1 -d "$STATS_DB" -c "$1"
}

# Start one side's pgbench in the background: side, track_stats, key range
stats_start() {
	local side=$1 track=$2 range=$3 file=$4 sync=$5
	as_test_user env PGOPTIONS="-c idempotency.track_stats=$track -c synchronous_commit=$sync" \
		pgbench -n -M prepared -c "$STATS_CLIENTS" -j 1 -T "$BENCH_SECONDS" \
		--random-seed=rand -D range="$range" \
		-f "$file" "$STATS_DB" >"$stats_dir/$side.log" 2>&1 &
	STATS_PID[$side]=$!
}

# A value from a side's pgbench output
stats_parse() {
	case $2 in
		tps) sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$stats_dir/$1.log" ;;
		processed) sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$stats_dir/$1.log" ;;
	esac
}

# One round of a row: sides A and B at once.  Checks that idem_stats counted
# exactly side A's reservations when A tracks, and nothing otherwise.
stats_round() {
	local row=$1 track_a=$2 file=$3 sync=$4 round=$5 side counted want
	local range_a=$(((round - 1) / 2 % 2 + 1))
	stats_sql "SELECT idem_stats_reset();"
	[ "$file" = "$stats_dir/replay.sql" ] || stats_sql "TRUNCATE idem_keys; CHECKPOINT;"
	if [ $((round % 2)) = 1 ]; then
		stats_start A "$track_a" "$range_a" "$file" "$sync"
		stats_start B off $((3 - range_a)) "$file" "$sync"
	else
		stats_start B off $((3 - range_a)) "$file" "$sync"
		stats_start A "$track_a" "$range_a" "$file" "$sync"
	fi
	for side in A B; do
		wait "${STATS_PID[$side]}" || { cat "$stats_dir/$side.log" >&2; return 1; }
		TPS[$row $side $round]=$(stats_parse "$side" tps)
		STATS_RUNS[$row $side]+="${TPS[$row $side $round]} "
	done
	printf '  %-44s A %8.0f  B %8.0f tps\n' "$row, round $round" \
		"${TPS[$row A $round]}" "${TPS[$row B $round]}" >&2

	# Each transaction reserves once; a client cut off by the timer may have
	# reserved without its transaction being reported as processed.
	counted=$(stats_value "SELECT coalesce(sum(reserves), 0) FROM idem_stats")
	want=0
	[ "$track_a" = on ] && want=$(stats_parse A processed)
	if [ "$counted" -lt "$want" ] || [ "$counted" -gt $((want + STATS_CLIENTS)) ]; then
		echo "40_stats: idem_stats counted $counted reservations, expected $want" >&2
		return 1
	fi
}

# Mean of a list of numbers
stats_mean() {
	awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.1f", s / NF }' <<<"$1"
}

# All rounds of a row; A tracks statistics or not
stats_row() {
	local row=$1 track_a=$2 file=$3 sync=$4 round
	echo "40_stats: $row" >&2
	for round in $(seq 1 "$STATS_ROUNDS"); do
		stats_round "$row" "$track_a" "$file" "$sync" "$round"
	done
	TPS[$row A]=$(stats_mean "${STATS_RUNS[$row A]}")
	TPS[$row B]=$(stats_mean "${STATS_RUNS[$row B]}")
	STATS_ROWS+=("$row")
}

declare -A STATS_RUNS=() STATS_PID=()
STATS_ROWS=()
as_test_user dropdb --if-exists "$STATS_DB" >/dev/null 2>&1
as_test_user createdb "$STATS_DB"
stats_sql "CREATE EXTENSION idempotency;"

as_test_user mkdir -p "$stats_dir"
as_test_user tee "$stats_dir/new.sql" >/dev/null <<'SQL'
\set r random(1, 9000000000000000000)
BEGIN;
SELECT outcome FROM idem_reserve('bench-pay', :range || '-' || :r, '{"amount": 100, "currency": "BRL"}');
SELECT idem_complete('bench-pay', :range || '-' || :r, '{"id": "pay", "status": "paid"}', 201);
COMMIT;
SQL
as_test_user tee "$stats_dir/replay.sql" >/dev/null <<'SQL'
\set r random(1, 10000)
SELECT outcome FROM idem_reserve('bench-replay', 'k' || :r, '{"amount": 100, "currency": "BRL"}');
SQL

stats_row "reserve/complete" on "$stats_dir/new.sql" on
stats_row "reserve/complete, synchronous_commit off" on "$stats_dir/new.sql" off
stats_row "control: both off, synchronous_commit off" off "$stats_dir/new.sql" off
stats_sql "TRUNCATE idem_keys;
	SELECT count(idem_complete('bench-replay', 'k' || i, '{\"id\": \"pay\"}'))
	FROM generate_series(1, 10000) i, LATERAL idem_reserve('bench-replay', 'k' || i,
		'{\"amount\": 100, \"currency\": \"BRL\"}');
	VACUUM ANALYZE idem_keys;"
stats_row "replay (reserve of a completed key)" on "$stats_dir/replay.sql" on

# Server-side cost per call, in one session, without clients or scheduling
# in the way: batches alternated on/off, each batch its own transaction.
#   replay:   5000 idem_reserve calls over 1000 completed keys
#   new:      1000 idem_reserve + idem_complete pairs of new keys
echo "40_stats: per-call cost in one session" >&2
stats_sql "CREATE TABLE stats_percall (workload text, setting text, secs float8);"
stats_sql "DO \$\$
DECLARE
	t0 timestamptz;
	s text;
	n bigint;
BEGIN
	FOR round IN 1..$STATS_PERCALL_ROUNDS LOOP
		FOREACH s IN ARRAY CASE WHEN round % 2 = 0 THEN ARRAY['on', 'off']
								ELSE ARRAY['off', 'on'] END LOOP
			PERFORM pg_catalog.set_config('idempotency.track_stats', s, false);
			t0 := pg_catalog.clock_timestamp();
			SELECT count(*) INTO n FROM generate_series(1, 5000) i,
				LATERAL idem_reserve('bench-replay', 'k' || (i % 1000 + 1),
					'{\"amount\": 100, \"currency\": \"BRL\"}');
			INSERT INTO stats_percall VALUES ('replay', s,
				extract(epoch FROM pg_catalog.clock_timestamp() - t0) / n);
			COMMIT;
			t0 := pg_catalog.clock_timestamp();
			SELECT count(idem_complete('bench-percall', k)) INTO n
				FROM (SELECT round || s || '-' || i AS k
					  FROM generate_series(1, 1000) i) q,
				LATERAL idem_reserve('bench-percall', q.k);
			INSERT INTO stats_percall VALUES ('new', s,
				extract(epoch FROM pg_catalog.clock_timestamp() - t0) / n);
			COMMIT;
		END LOOP;
	END LOOP;
END
\$\$;"

# Median or minimum of a workload's batches with a setting, in µs per call
percall() {
	stats_value "SELECT round(($3 * 1e6)::numeric, 3)
		FROM stats_percall WHERE workload = '$1' AND setting = '$2'"
}

echo "## Statistics overhead (idempotency.track_stats)"
echo
echo "Each round runs two pgbench at the same time (-M prepared -c $STATS_CLIENTS -j 1" \
	"-T $BENCH_SECONDS each): side A with track_stats on, side B off; mean TPS of" \
	"$STATS_ROUNDS rounds.  The control row runs both sides off."
echo
echo "| workload | A (TPS) | B, track_stats off (TPS) | A/B | A/B per round |"
echo "|---|---|---|---|---|"
for row in "${STATS_ROWS[@]}"; do
	rounds=$(for round in $(seq 1 "$STATS_ROUNDS"); do
		ratio "$row A $round" "$row B $round"; echo; done | paste -sd' ')
	printf '| %s | %.0f | %.0f | %s | %s |\n' "$row" "${TPS[$row A]}" "${TPS[$row B]}" \
		"$(ratio "$row A" "$row B")" "$rounds"
done

echo
echo "Server-side time per call in one session, $STATS_PERCALL_ROUNDS batches per setting," \
	"alternated; each batch 5000 replays, or 1000 reserve + complete pairs of new keys." \
	"Noise only adds time, so the fastest batch is the best estimate of the cost itself."
echo
echo "| µs per call | track_stats off | track_stats on | on/off (time) |"
echo "|---|---|---|---|"
for w in replay new; do
	for stat in median min; do
		if [ "$stat" = median ]; then agg='percentile_cont(0.5) WITHIN GROUP (ORDER BY secs)'; else agg='min(secs)'; fi
		a=$(percall "$w" on "$agg")
		b=$(percall "$w" off "$agg")
		label="replay, $stat"
		[ "$w" = new ] && label="reserve + complete, $stat"
		printf '| %s | %s | %s | %s |\n' "$label" "$b" "$a" \
			"$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')"
	done
done

as_test_user dropdb "$STATS_DB"
