# Helpers for bench/suites/*.sh, sourced by bench/run.sh after the cluster is up.
#
#   bench_sql FILE|-            run SQL as the test user (set-up of a suite)
#   bench_value SQL             run one query as the test user, print its rows
#                               unaligned (fields separated by |)
#   bench_system 'SET x = y'    ALTER SYSTEM ... and reload the configuration
#   bench_tps NAME SCRIPT [pgbench args...]
#                               run pgbench with a script file from the suite's
#                               directory and print its TPS to stderr; every
#                               run of NAME is kept in TPS_RUNS[NAME], and
#                               TPS[NAME] is the median of them (suites run
#                               BENCH_ROUNDS interleaved rounds)
#   tps_spread NAME             the runs of NAME, lowest to highest
#   ratio A B                   TPS[A] / TPS[B] with two decimals
#   bench_row LABEL NAME BASE   print a table row: label, TPS[NAME], ratio to BASE

BENCH_SECONDS=${BENCH_SECONDS:-15}
BENCH_CLIENTS=${BENCH_CLIENTS:-4}
BENCH_JOBS=${BENCH_JOBS:-2}
BENCH_ROUNDS=${BENCH_ROUNDS:-3}
declare -A TPS TPS_RUNS

bench_sql() {
	as_test_user psql -X -q -v ON_ERROR_STOP=1 -d "${BENCH_DB:-postgres}" -f "${1:--}"
}

bench_value() {
	as_test_user psql -X -q -At -v ON_ERROR_STOP=1 -d "${BENCH_DB:-postgres}" -c "$1"
}

bench_system() {
	as_test_user psql -X -q -d postgres -c "ALTER SYSTEM $1" \
		-c "SELECT pg_reload_conf()" >/dev/null
}

bench_tps() {
	local name=$1 script=$2
	shift 2
	local out
	out=$(as_test_user pgbench -n -c "$BENCH_CLIENTS" -j "$BENCH_JOBS" -T "$BENCH_SECONDS" \
		-f "$script" "$@" "${BENCH_DB:-postgres}" 2>&1) || { echo "$out" >&2; return 1; }
	local tps
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' <<<"$out")
	TPS_RUNS[$name]="${TPS_RUNS[$name]:+${TPS_RUNS[$name]} }$tps"
	TPS[$name]=$(tr ' ' '\n' <<<"${TPS_RUNS[$name]}" | sort -g |
		awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
	printf '  %-40s %10.0f tps\n' "$name" "$tps" >&2
}

tps_spread() {
	tr ' ' '\n' <<<"${TPS_RUNS[$1]}" | sort -g | awk '{ printf "%s%.0f", (NR > 1 ? " " : ""), $1 }'
}

ratio() {
	awk -v a="${TPS[$1]}" -v b="${TPS[$2]}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
}

bench_row() {
	printf '| %s | %.0f | %s |\n' "$1" "${TPS[$2]}" "$(ratio "$2" "$3")"
}
