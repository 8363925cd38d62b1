# Helpers for bench/suites/*.sh, sourced by bench/run.sh after the cluster is up.
#
#   bench_sql FILE|-            run SQL as the test user (set-up of a suite)
#   bench_value SQL             run one query as the test user, print its rows
#                               unaligned (fields separated by |)
#   bench_core_db DB [EFFECT_MS]
#                               a fresh database DB with bench/core/setup.sql's
#                               schema; with EFFECT_MS, also reset.sql's tables and
#                               an effect that takes EFFECT_MS (effect_delay.sql)
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

BENCH_SECONDS=${BENCH_SECONDS:-6}
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

bench_core_db() {
	local db=$1 effect_ms=${2:-}
	as_test_user dropdb --if-exists "$db" 2>/dev/null
	as_test_user createdb "$db"
	BENCH_DB=$db bench_sql "$IDEM_SRC/bench/core/setup.sql"
	[ -n "$effect_ms" ] || return 0
	BENCH_DB=$db bench_sql "$IDEM_SRC/bench/core/reset.sql" >/dev/null
	BENCH_DB=$db bench_sql "$IDEM_SRC/bench/core/effect_delay.sql"
	as_test_user psql -X -q -d "$db" -c "ALTER DATABASE $db SET bench.effect_ms = $effect_ms"
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

# The load generator (bench/loadgen.c) and redis-server, for the suites that
# need one client program for every variant (80_contention, 85_storm,
# 90_faults, 95_scale):
#
#   bench_loadgen_build         build bench/loadgen.c once (-Wall -Wextra -Werror)
#   bench_redis_start, bench_redis_stop
#                               redis-server on a unix socket in the work area,
#                               with Debian's default persistence (RDB
#                               snapshots, no AOF); REDIS_SOCK, REDIS_PID
#   bench_redis_crash           kill -9 redis-server (a crash, an OOM kill)
#   bench_postmaster_pid        the server's postmaster process id
#   bench_load NAME SCRIPT DB [loadgen args...]
#                               run the load generator; its NAME=VALUE line is
#                               kept in LOAD[NAME] and printed to stderr
#   load_get NAME FIELD         one value of LOAD[NAME]
#   load_median NAME FIELD      the median of FIELD over NAME's runs
#                               (NAME/1, NAME/2, ... as the rounds name them)
#   target_row LABEL MEASURED OP WANTED
#                               a table row: a target (OP >=, <= or <), its
#                               measured value and "met" or "missed"
LOADGEN=
REDIS_SOCK=
REDIS_PID=
declare -A LOAD

bench_loadgen_build() {
	LOADGEN=$IDEM_WORK/loadgen
	[ -x "$LOADGEN" ] && return 0
	gcc -O2 -Wall -Wextra -Werror -o "$LOADGEN" "$IDEM_SRC/bench/loadgen.c" \
		-I"$("$PG_CONFIG" --includedir)" -L"$("$PG_CONFIG" --libdir)" -lpq -lhiredis -lpthread
}

bench_redis_start() {
	REDIS_SOCK=$IDEM_WORK/redis.sock
	[ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null && return 0
	as_test_user rm -f "$REDIS_SOCK" "$IDEM_WORK/redis.pid"
	as_test_user redis-server --port 0 --unixsocket "$REDIS_SOCK" --unixsocketperm 700 \
		--dir "$IDEM_WORK" --pidfile "$IDEM_WORK/redis.pid" \
		--logfile "$IDEM_WORK/redis.log" --daemonize yes
	local i
	for i in $(seq 1 100); do
		[ -S "$REDIS_SOCK" ] && [ -s "$IDEM_WORK/redis.pid" ] && break
		sleep 0.05
	done
	REDIS_PID=$(cat "$IDEM_WORK/redis.pid")
}

bench_redis_stop() {
	if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then
		kill "$REDIS_PID"
		while kill -0 "$REDIS_PID" 2>/dev/null; do sleep 0.05; done
	fi
	REDIS_PID=
}

bench_redis_crash() {
	kill -9 "$REDIS_PID"
	while kill -0 "$REDIS_PID" 2>/dev/null; do sleep 0.01; done
	REDIS_PID=
}

bench_postmaster_pid() {
	head -1 "$IDEM_WORK/data/postmaster.pid"
}

bench_load() {
	local name=$1 script=$2 db=$3
	shift 3
	local out
	out=$(as_test_user "$LOADGEN" -d "host=$PGHOST port=$PGPORT dbname=$db" -f "$script" "$@") ||
		{ echo "loadgen failed: $name" >&2; return 1; }
	LOAD[$name]=$out
	printf '  %-36s %s\n' "$name" "$out" >&2
}

load_get() {
	sed -n "s/.*\\b$2=\\([^ ]*\\).*/\\1/p" <<<"${LOAD[$1]:-}"
}

load_median() {
	local name=$1 field=$2 k
	for k in "${!LOAD[@]}"; do
		case $k in "$name"/*) load_get "$k" "$field" ;; esac
	done | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

target_row() {
	local verdict
	verdict=$(awk -v m="$2" -v t="$4" -v op="$3" 'BEGIN {
		if (m == "n/a" || m == "") print "n/a"
		else if ((op == ">=" && m + 0 >= t + 0) || (op == "<=" && m + 0 <= t + 0) || (op == "<" && m + 0 < t + 0)) print "met"
		else print "missed" }')
	echo "| $1 | $3 $4 | $2 | $verdict |"
}

# Chart data: the suites that bench/run.sh draws (80_nocontention,
# 85_storm) write what their tables print into tab-separated files too, and
# bench/charts.gp turns them into SVG.
#
#   bench_chart_row FILE FIELD...
#                               append one row to $IDEM_WORK/charts/FILE.tsv
#                               (the first row a suite writes is its header)
#   bench_charts                draw bench/charts.gp's charts from the files
#                               this run wrote into BENCH_CHARTS (default: the
#                               bench/ directory of the tree run.sh was started
#                               from; empty: no charts)
bench_chart_row() {
	local file=$IDEM_WORK/charts/$1.tsv
	shift
	mkdir -p "$IDEM_WORK/charts"
	(IFS=$'\t'; echo "$*") >>"$file"
}

bench_charts() {
	local out=${BENCH_CHARTS-$IDEM_ROOT/bench} chart
	[ -n "$out" ] || return 0
	for chart in nocontention storm; do
		[ -s "$IDEM_WORK/charts/$chart.tsv" ] || continue
		gnuplot -e "chart = '$chart'; data = '$IDEM_WORK/charts/$chart.tsv'; out = '$out/$chart.svg'" \
			"$IDEM_SRC/bench/charts.gp" &&
			echo "== chart: $out/$chart.svg" >&2 ||
			echo "== could not draw $out/$chart.svg (the report above stands)" >&2
	done
}
