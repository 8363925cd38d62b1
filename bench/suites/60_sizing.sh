# Sizing (issue 15): what a record costs on disk and what its lifecycle
# leaves for VACUUM, to size idem_keys and tune autovacuum for it.
#
#   bytes per record    SIZING_ROWS keys of a realistic shape, each its own
#                       transaction as an application makes it (pgbench):
#                       idem_reserve of a UUID key in scope 'tenant-N' with
#                       a ~110-byte request, idem_complete with a ~120-byte
#                       response, status 201 and a resource id.  Heap,
#                       TOAST and each index of idem_keys, divided by the
#                       records.
#   dead tuples         per key lifecycle (reserve, complete, expiry and
#                       sweep), from pg_stat_user_tables: the row versions
#                       made dead (updates + deletes, what autovacuum's
#                       thresholds count), how many updates were HOT, and
#                       n_dead_tup left when the sweep is done.
#   reuse               the size after later generations of keys, each
#                       after the previous one was swept: twice with a
#                       VACUUM between generations, once without; what
#                       autovacuum keeps from growing.
#
# The worker is paused and autovacuum is off for idem_keys while it runs,
# so that nothing but the suite deletes or vacuums.  SIZING_ROWS (default
# 50000).

SIZING_DB=idem_bench_sizing
SIZING_ROWS=${SIZING_ROWS:-50000}
sizing_dir=$IDEM_WORK/bench-60_sizing

sizing_sql() {
	BENCH_DB=$SIZING_DB bench_sql - <<<"$1" >/dev/null
}

sizing_value() {
	BENCH_DB=$SIZING_DB bench_value "$1"
}

# One generation of keys: SIZING_ROWS reserve/complete transactions
sizing_fill() {
	local per_client=$(((SIZING_ROWS + BENCH_CLIENTS - 1) / BENCH_CLIENTS))
	as_test_user pgbench -n -M prepared -c "$BENCH_CLIENTS" -j "$BENCH_JOBS" \
		-t "$per_client" -f "$sizing_dir/lifecycle.sql" "$SIZING_DB" \
		>"$sizing_dir/pgbench.log" 2>&1 || { cat "$sizing_dir/pgbench.log" >&2; return 1; }
}

# Wait until the table's statistics show a counter reaching a value: the
# backends that did the work flush them as they exit
sizing_wait_stat() {
	local column=$1 want=$2 t0=$SECONDS
	while [ $((SECONDS - t0)) -lt 60 ]; do
		[ "$(sizing_value "SELECT $column >= $want FROM pg_stat_user_tables WHERE relid = 'idem_keys'::regclass")" = t ] &&
			return 0
		sleep 0.5
	done
	echo "60_sizing: pg_stat_user_tables.$column did not reach $want" >&2
	return 1
}

# Sizes in bytes: heap, TOAST, then each index of idem_keys by name
sizing_sizes() {
	sizing_value "SELECT 'heap', pg_relation_size('idem_keys')
UNION ALL SELECT 'toast', coalesce(pg_relation_size(reltoastrelid), 0)
	FROM pg_class WHERE oid = 'idem_keys'::regclass
UNION ALL SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
	FROM pg_index i WHERE i.indrelid = 'idem_keys'::regclass"
}

# Total bytes of the table and its indexes
sizing_total() {
	sizing_value "SELECT pg_total_relation_size('idem_keys')"
}

as_test_user dropdb --if-exists "$SIZING_DB" >/dev/null 2>&1
as_test_user createdb "$SIZING_DB"
as_test_user mkdir -p "$sizing_dir"
sizing_sql "CREATE EXTENSION idempotency;
ALTER TABLE idem_keys SET (autovacuum_enabled = off);"
bench_system "SET idempotency.enabled = off"
as_test_user tee "$sizing_dir/lifecycle.sql" >/dev/null <<'SQL'
\set r random(1, 9000000000000000000)
\set t random(1, 1000)
\set amount random(100, 1000000)
BEGIN;
SELECT outcome FROM idem_reserve('create-payment', md5(:r::text)::uuid::text,
	('{"amount": ' || :amount || ', "currency": "EUR", "customer": "cus_' || :t
	 || '", "description": "Order ' || :r || '", "capture": true}')::jsonb,
	'tenant-' || :t, '1 s');
SELECT idem_complete('create-payment', md5(:r::text)::uuid::text,
	('{"id": "pay_' || :r || '", "status": "succeeded", "amount": ' || :amount
	 || ', "currency": "EUR", "created": 1767225600, "livemode": true}')::jsonb,
	201, 'pay_' || :r, 'tenant-' || :t);
COMMIT;
SQL

echo "60_sizing: first generation of $SIZING_ROWS keys" >&2
sizing_fill
records=$(sizing_value "SELECT count(*) FROM idem_keys")
sizing_wait_stat n_tup_ins "$records"
declare -A SIZE=()
while IFS='|' read -r rel bytes; do SIZE[$rel]=$bytes; done < <(sizing_sizes)
total_first=$(sizing_total)
tuple_bytes=$(sizing_value "SELECT round(avg(pg_column_size(k.*))) FROM idem_keys k")
read -r ins upd hot < <(sizing_value "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd
	FROM pg_stat_user_tables WHERE relid = 'idem_keys'::regclass" | tr '|' ' ')

# Every record has expired (ttl 1 s); the sweep deletes them
sleep 1
echo "60_sizing: sweeping them" >&2
swept=$(sizing_value "SELECT idem_sweep()")
sizing_wait_stat n_tup_del "$swept"
read -r del dead < <(sizing_value "SELECT n_tup_del, n_dead_tup
	FROM pg_stat_user_tables WHERE relid = 'idem_keys'::regclass" | tr '|' ' ')

# Later generations: sweep the previous one, VACUUM (twice: B-tree pages
# that one VACUUM deletes are reused after the next), then without VACUUM
declare -a GEN_LABEL=() GEN_HEAP=() GEN_TOTAL=()
for gen in 2 3 4; do
	sleep 1
	sizing_value "SELECT idem_sweep()" >/dev/null
	if [ "$gen" -lt 4 ]; then
		sizing_sql "VACUUM (TRUNCATE false) idem_keys;"
		GEN_LABEL+=("generation $gen, after sweep and VACUUM")
	else
		GEN_LABEL+=("generation $gen, after sweep, no VACUUM")
	fi
	echo "60_sizing: ${GEN_LABEL[-1]}" >&2
	sizing_fill
	GEN_HEAP+=("$(sizing_value "SELECT pg_relation_size('idem_keys')")")
	GEN_TOTAL+=("$(sizing_total)")
done

bench_system "RESET idempotency.enabled"

per() {
	awk -v b="$1" -v n="$2" 'BEGIN { printf "%.0f", b / n }'
}
each() {
	awk -v a="$1" -v n="$2" 'BEGIN { printf "%.2f", a / n }'
}

echo "## Sizing: idem_keys per record, and dead tuples per key"
echo
echo "$records keys, each reserved and completed in its own transaction (pgbench -M prepared" \
	"-c $BENCH_CLIENTS): a UUID key in one of 1000 scopes, a ~110-byte JSON request (stored as" \
	"its 32-byte SHA-256), a ~120-byte JSON response, status 201 and a resource id." \
	"Average row: $tuple_bytes bytes (pg_column_size, with its 24-byte header)."
echo
echo "| relation | bytes | bytes per record |"
echo "|---|---:|---:|"
printf '| heap (idem_keys) | %s | %s |\n' "${SIZE[heap]}" "$(per "${SIZE[heap]}" "$records")"
printf '| TOAST | %s | %s |\n' "${SIZE[toast]}" "$(per "${SIZE[toast]}" "$records")"
for rel in "${!SIZE[@]}"; do
	case $rel in heap | toast) continue ;; esac
	printf '| %s | %s | %s |\n' "$rel" "${SIZE[$rel]}" "$(per "${SIZE[$rel]}" "$records")"
done | sort
printf '| total (pg_total_relation_size) | %s | %s |\n' "$total_first" "$(per "$total_first" "$records")"
echo
echo "| per key lifecycle (reserve, complete, sweep) | per key |"
echo "|---|---:|"
printf '| rows inserted | %s |\n' "$(each "$ins" "$records")"
printf '| rows updated (idem_complete) | %s |\n' "$(each "$upd" "$records")"
printf '| of which HOT updates | %s |\n' "$(each "$hot" "$records")"
printf '| rows deleted (idem_sweep) | %s |\n' "$(each "$del" "$records")"
printf '| dead row versions made (updated + deleted), what autovacuum counts | %s |\n' \
	"$(each $((upd + del)) "$records")"
printf '| n_dead_tup after the sweep, before VACUUM | %s |\n' \
	"$(each "$dead" "$records")"
echo
echo "| each generation: $records new keys | heap | table + indexes | vs the first generation |"
echo "|---|---:|---:|---:|"
printf '| generation 1, empty table | %s | %s | 1.00 |\n' "${SIZE[heap]}" "$total_first"
for i in "${!GEN_LABEL[@]}"; do
	printf '| %s | %s | %s | %s |\n' "${GEN_LABEL[$i]}" "${GEN_HEAP[$i]}" "${GEN_TOTAL[$i]}" \
		"$(each "${GEN_TOTAL[$i]}" "$total_first")"
done

as_test_user dropdb "$SIZING_DB"
