# Helpers for bench/suites/*.sh, sourced by bench/run.sh after the cluster is up.
#
#   bench_sql FILE|-            run SQL as the test user (set-up of a suite)
#   bench_tps NAME SCRIPT [pgbench args...]
#                               run pgbench with a script file from the suite's
#                               directory; the TPS is kept in TPS[NAME] and
#                               printed to stderr
#   ratio A B                   TPS[A] / TPS[B] with two decimals
#   bench_row LABEL NAME BASE   print a table row: label, TPS[NAME], ratio to BASE

BENCH_SECONDS=${BENCH_SECONDS:-15}
BENCH_CLIENTS=${BENCH_CLIENTS:-4}
BENCH_JOBS=${BENCH_JOBS:-2}
declare -A TPS

bench_sql() {
	as_test_user psql -X -q -v ON_ERROR_STOP=1 -d "${BENCH_DB:-postgres}" -f "${1:--}"
}

bench_tps() {
	local name=$1 script=$2
	shift 2
	local out
	out=$(as_test_user pgbench -n -c "$BENCH_CLIENTS" -j "$BENCH_JOBS" -T "$BENCH_SECONDS" \
		-f "$script" "$@" "${BENCH_DB:-postgres}" 2>&1) || { echo "$out" >&2; return 1; }
	TPS[$name]=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' <<<"$out")
	printf '  %-40s %10.0f tps\n' "$name" "${TPS[$name]}" >&2
}

ratio() {
	awk -v a="${TPS[$1]}" -v b="${TPS[$2]}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
}

bench_row() {
	printf '| %s | %.0f | %s |\n' "$1" "${TPS[$2]}" "$(ratio "$2" "$3")"
}
