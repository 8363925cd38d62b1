# Sweeping (issue 4): the background worker deleting a backlog of expired
# records, against one plain DELETE, and its effect on the hot path.
#
#   deletion rate       SWEEP_ROWS expired completed records (plus 10000 live
#                       ones): the worker's pass (batches of
#                       idempotency.sweep_batch_size, each its own
#                       transaction) against one
#                       DELETE FROM idem_keys WHERE expires_at < now()
#                       of the same rows, both after VACUUM and CHECKPOINT.
#                       Target: worker rows/s >= 0.7 of the DELETE's.
#   longest batch       the longest batch transaction of the pass, i.e. the
#                       longest time it holds row locks.  Target: <= 200 ms.
#   hot path            pgbench reserve/complete of new keys on the same
#                       table, with the backlog in place: with the worker
#                       paused, and with the worker sweeping the backlog.
#                       TPS counted from pgbench's per-transaction log over
#                       the sweep's own time window, and over the same
#                       window of the paused run.  Target: >= 0.8.
#   stuck detection     one idem_flag_stuck() over a table of SWEEP_ROWS live
#                       records: the cost of finding overdue processing
#                       records without an index on updated_at, paid once
#                       per pass.
#
# The worker's times come from its DEBUG1 summary line ("deleted N expired
# records ... in T ms; B batches, longest L ms"), enabled for this database
# only.  SWEEP_ROWS (default 1000000), SWEEP_ROUNDS (default 3) rounds of
# the hot-path pair, SWEEP_SECONDS (default 20) per pgbench run,
# SWEEP_RATE_RUNS (default 3) runs of the deletion-rate pair.

SWEEP_DB=idem_bench_sweep
SWEEP_ROWS=${SWEEP_ROWS:-1000000}
SWEEP_ROUNDS=${SWEEP_ROUNDS:-3}
SWEEP_SECONDS=${SWEEP_SECONDS:-20}
SWEEP_RATE_RUNS=${SWEEP_RATE_RUNS:-3}
sweep_dir=$IDEM_WORK/bench-30_sweep

sweep_sql() {
	BENCH_DB=$SWEEP_DB bench_sql - <<<"$1" >/dev/null
}

sweep_value() {
	as_test_user psql -X -q -At -v ON_ERROR_STOP=1 -d "$SWEEP_DB" -c "$1"
}

# Change a server setting and reload
sweep_set() {
	as_test_user psql -X -q -d postgres -c "ALTER SYSTEM SET $1" \
		-c "SELECT pg_reload_conf()" >/dev/null
}

# The table as every measurement starts from: the expired backlog and live
# records, vacuumed and checkpointed
sweep_fill() {
	sweep_sql "TRUNCATE idem_keys;
INSERT INTO idem_keys (scope, operation, key, request_hash, status,
	response_status, response, created_at, updated_at, expires_at)
SELECT 'tenant-' || (i % 100), 'bench-pay', 'old-' || i,
	sha256(i::text::bytea), 'completed', 201, '{\"id\": \"pay\", \"status\": \"paid\"}',
	now() - interval '2 days', now() - interval '2 days',
	now() - interval '1 day' + i * interval '10 ms'
FROM generate_series(1, $SWEEP_ROWS) i;
INSERT INTO idem_keys (scope, operation, key, status, response_status, response,
	expires_at)
SELECT 'tenant-' || (i % 100), 'bench-pay', 'live-' || i, 'completed', 201,
	'{\"id\": \"pay\"}', now() + interval '1 day'
FROM generate_series(1, 10000) i;
VACUUM ANALYZE idem_keys;
CHECKPOINT;"
}

# Epoch seconds of a log line's timestamp (log_line_prefix starts with %m)
log_epoch() {
	date -d "$(cut -d' ' -f1-3 <<<"$1")" +%s.%N
}

# Wait for the worker's summary of a pass that deleted the backlog; prints
# "deleted ms batches longest_ms end_epoch"
sweep_wait_summary() {
	local from=$1 line t0=$SECONDS
	while [ $((SECONDS - t0)) -lt 600 ]; do
		line=$(tail -c +"$from" "$IDEM_WORK/server.log" |
			grep -E "idempotency worker for database $SWEEP_DB: deleted [1-9]" | tail -1 || true)
		if [ -n "$line" ]; then
			sed -E 's/.*deleted ([0-9]+) expired.* in ([0-9]+) ms; ([0-9]+) batches, longest ([0-9.]+) ms.*/\1 \2 \3 \4/' <<<"$line" |
				tr '\n' ' '
			log_epoch "$line"
			return 0
		fi
		sleep 0.2
	done
	echo "30_sweep: no summary line from the worker" >&2
	return 1
}

# Transactions per second that pgbench logged between two epoch times
txn_rate() {
	local prefix=$1 from=$2 to=$3
	cat "$prefix".* | awk -v a="$from" -v b="$to" '
		{ t = $5 + $6 / 1e6; if (t >= a && t < b) n++ }
		END { if (b > a) printf "%.1f", n / (b - a); else print 0 }'
}

as_test_user dropdb --if-exists "$SWEEP_DB" >/dev/null 2>&1
as_test_user createdb "$SWEEP_DB"
as_test_user mkdir -p "$sweep_dir"
sweep_sql "CREATE EXTENSION idempotency;
ALTER DATABASE $SWEEP_DB SET log_min_messages = debug1;"
sweep_set "idempotency.enabled = off"
sweep_set "idempotency.sweep_interval = '1s'"
as_test_user tee "$sweep_dir/new.sql" >/dev/null <<'SQL'
\set r random(1, 9000000000000000000)
\set t :r % 100
BEGIN;
SELECT outcome FROM idem_reserve('bench-pay', 'new-' || :r, '{"amount": 100, "currency": "BRL"}', 'tenant-' || :t);
SELECT idem_complete('bench-pay', 'new-' || :r, '{"id": "pay", "status": "paid"}', 201, NULL, 'tenant-' || :t);
COMMIT;
SQL

# Deletion rate: one DELETE against the worker's pass, SWEEP_RATE_RUNS times
# each, alternated; the medians are compared
declare -a DEL_MS=() W_MS=() W_LONGEST=()
for run in $(seq 1 "$SWEEP_RATE_RUNS"); do
	echo "30_sweep: one DELETE of $SWEEP_ROWS expired records, run $run" >&2
	sweep_fill
	ms=$(as_test_user psql -X -q -At -d "$SWEEP_DB" -c '\timing on' \
		-c "DELETE FROM idem_keys WHERE expires_at < now()" |
		sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p')
	DEL_MS+=("$ms")
	echo "  DELETE: $ms ms" >&2

	echo "30_sweep: the worker's pass over the same records, run $run" >&2
	sweep_fill
	from=$(($(stat -c %s "$IDEM_WORK/server.log") + 1))
	sweep_set "idempotency.enabled = on"
	read -r w_deleted w_ms w_batches w_longest w_end < <(sweep_wait_summary "$from")
	sweep_set "idempotency.enabled = off"
	W_MS+=("$w_ms")
	W_LONGEST+=("$w_longest")
	echo "  worker: $w_deleted rows in $w_ms ms ($w_batches batches, longest $w_longest ms)" >&2
done
median() {
	printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
delete_ms=$(median "${DEL_MS[@]}")
w_ms=$(median "${W_MS[@]}")
w_longest=$(printf '%s\n' "${W_LONGEST[@]}" | sort -g | tail -1)
delete_rate=$(awk -v n="$SWEEP_ROWS" -v ms="$delete_ms" 'BEGIN { printf "%.0f", n / ms * 1000 }')
worker_rate=$(awk -v n="$SWEEP_ROWS" -v ms="$w_ms" 'BEGIN { printf "%.0f", n / ms * 1000 }')
rate_ratios=$(for i in "${!DEL_MS[@]}"; do
	awk -v d="${DEL_MS[$i]}" -v w="${W_MS[$i]}" 'BEGIN { printf "%.2f\n", d / w }'; done | paste -sd' ')

# Hot path: pgbench with the worker paused, then sweeping, alternated
declare -a HP_BASE=() HP_SWEEP=() HP_LONGEST=() HP_WINDOW=()
for round in $(seq 1 "$SWEEP_ROUNDS"); do
	for side in $(if [ $((round % 2)) = 1 ]; then echo paused sweeping; else echo sweeping paused; fi); do
		sweep_fill
		prefix=$sweep_dir/$side-$round
		from=$(($(stat -c %s "$IDEM_WORK/server.log") + 1))
		start=$(date +%s.%N)
		as_test_user pgbench -n -M prepared -c "$BENCH_CLIENTS" -j "$BENCH_JOBS" \
			-T "$SWEEP_SECONDS" -l --log-prefix="$prefix" -f "$sweep_dir/new.sql" \
			"$SWEEP_DB" >"$prefix-pgbench.txt" 2>&1 &
		pgbench_pid=$!
		sleep 2
		if [ "$side" = sweeping ]; then
			sweep_set "idempotency.enabled = on"
			read -r s_deleted s_ms s_batches s_longest s_end < <(sweep_wait_summary "$from")
			sweep_set "idempotency.enabled = off"
			s_begin=$(awk -v e="$s_end" -v ms="$s_ms" 'BEGIN { printf "%.3f", e - ms / 1000 }')
			offset=$(awk -v a="$s_begin" -v b="$start" 'BEGIN { printf "%.3f", a - b }')
			length=$(awk -v ms="$s_ms" 'BEGIN { printf "%.3f", ms / 1000 }')
		fi
		wait "$pgbench_pid" || { cat "$prefix-pgbench.txt" >&2; exit 1; }
		eval "start_$side=$start"
	done
	# The same window, relative to each run's start
	rate_sweep=$(txn_rate "$sweep_dir/sweeping-$round" \
		"$(awk -v s="$start_sweeping" -v o="$offset" 'BEGIN { printf "%.3f", s + o }')" \
		"$(awk -v s="$start_sweeping" -v o="$offset" -v l="$length" 'BEGIN { printf "%.3f", s + o + l }')")
	rate_base=$(txn_rate "$sweep_dir/paused-$round" \
		"$(awk -v s="$start_paused" -v o="$offset" 'BEGIN { printf "%.3f", s + o }')" \
		"$(awk -v s="$start_paused" -v o="$offset" -v l="$length" 'BEGIN { printf "%.3f", s + o + l }')")
	HP_BASE+=("$rate_base")
	HP_SWEEP+=("$rate_sweep")
	HP_LONGEST+=("$s_longest")
	HP_WINDOW+=("$length")
	echo "  round $round: paused $rate_base tps, sweeping $rate_sweep tps over the sweep's ${length} s ($s_deleted rows, longest batch $s_longest ms)" >&2
done
hp_base=$(printf '%s\n' "${HP_BASE[@]}" | awk '{ s += $1 } END { printf "%.0f", s / NR }')
hp_sweep=$(printf '%s\n' "${HP_SWEEP[@]}" | awk '{ s += $1 } END { printf "%.0f", s / NR }')
hp_ratios=$(for i in "${!HP_BASE[@]}"; do
	awk -v a="${HP_SWEEP[$i]}" -v b="${HP_BASE[$i]}" 'BEGIN { printf "%.2f\n", a / b }'; done | paste -sd' ')
hp_longest=$(printf '%s\n' "${HP_LONGEST[@]}" | sort -g | tail -1)
hp_window=$(printf '%s\n' "${HP_WINDOW[@]}" | paste -sd' ')

# Stuck detection over live records: the sequential scan a pass pays
sweep_sql "TRUNCATE idem_keys;
INSERT INTO idem_keys (scope, operation, key, status, response_status, expires_at)
SELECT 'tenant-' || (i % 100), 'bench-pay', 'live-' || i, 'completed', 201,
	now() + interval '1 day'
FROM generate_series(1, $SWEEP_ROWS) i;
VACUUM ANALYZE idem_keys;"
flag_ms=$(as_test_user psql -X -q -At -d "$SWEEP_DB" -c 'SELECT idem_flag_stuck()' \
	-c '\timing on' -c 'SELECT idem_flag_stuck()' | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p')

sweep_set "idempotency.enabled = on"
sweep_set "idempotency.sweep_interval = '10s'"
as_test_user psql -X -q -d postgres -c "ALTER SYSTEM RESET idempotency.enabled" \
	-c "ALTER SYSTEM RESET idempotency.sweep_interval" -c "SELECT pg_reload_conf()" >/dev/null

echo "## Sweeping expired records (background worker)"
echo
echo "$SWEEP_ROWS expired completed records plus 10000 live ones in idem_keys," \
	"vacuumed and checkpointed before each measurement; idempotency.sweep_batch_size" \
	"$(sweep_value 'SHOW idempotency.sweep_batch_size')."
echo
echo "| measurement | value | target |"
echo "|---|---|---|"
printf '| one DELETE ... WHERE expires_at < now(), median of %s | %s rows/s (%.0f ms) | |\n' \
	"$SWEEP_RATE_RUNS" "$delete_rate" "$delete_ms"
printf '| worker pass, batches of its own transactions, median of %s | %s rows/s (%.0f ms, %s batches) | |\n' \
	"$SWEEP_RATE_RUNS" "$worker_rate" "$w_ms" "$w_batches"
printf '| worker / DELETE deletion rate (per run: %s) | %s | >= 0.7 |\n' "$rate_ratios" \
	"$(awk -v a="$worker_rate" -v b="$delete_rate" 'BEGIN { printf "%.2f", a / b }')"
printf '| longest batch transaction (row locks held), idle server | %s ms | <= 200 ms |\n' "$w_longest"
printf '| longest batch transaction, under pgbench load | %s ms | <= 200 ms |\n' "$hp_longest"
printf '| reserve/complete TPS, worker paused | %s | |\n' "$hp_base"
printf '| reserve/complete TPS while the worker sweeps | %s | |\n' "$hp_sweep"
printf '| sweeping / paused TPS (per round: %s) | %s | >= 0.8 |\n' "$hp_ratios" \
	"$(awk -v a="$hp_sweep" -v b="$hp_base" 'BEGIN { printf "%.2f", a / b }')"
printf '| idem_flag_stuck() over %s live records (once per pass) | %.0f ms | |\n' "$SWEEP_ROWS" "$flag_ms"
echo
echo "Hot path: pgbench -M prepared -c $BENCH_CLIENTS -j $BENCH_JOBS -T $SWEEP_SECONDS," \
	"BEGIN; idem_reserve of a new key; idem_complete; COMMIT, on the table with the" \
	"backlog; $SWEEP_ROUNDS rounds, each a paused and a sweeping run in alternating order;" \
	"TPS counted over the sweep's window (${hp_window} s) in both runs of a round."

as_test_user psql -X -q -d postgres -c "ALTER DATABASE $SWEEP_DB RESET log_min_messages" >/dev/null
as_test_user dropdb "$SWEEP_DB"
