#!/usr/bin/env bash
# The client libraries' overhead: `bash bench/clients.sh`.
#
# Same set-up as the test suite (packages, -Werror build, install, throwaway
# cluster as a non-root user), with fsync on.  Each language's demo app
# (clients/<language>/demo) is started with --bench, which adds two routes
# over one handler that INSERTs one row into bench_effects and answers 201:
#   POST /bench/middleware   the package's middleware around the handler
#   POST /bench/by-hand      idem_reserve, the INSERT and idem_complete
#                            written by hand in one transaction, same pool
#   POST /bench/by-hand-tx   where the demo has it (Java): the same in the
#                            framework's own transaction (a Spring
#                            TransactionTemplate and JdbcTemplate, which
#                            the middleware's handler shares), measured
#                            beside the others as a second baseline
# wrk (Debian's package) drives both side by side in one run, in
# interleaved rounds: new keys (a unique Idempotency-Key per request, from
# bench/clients.lua) and replays (16 keys completed beforehand).  The table
# gives the median over the rounds of p50, p99 and requests/s, and the
# ratio middleware / by-hand at p50 (issue 32's target: at most 1.10).
# Not a timed test: numbers vary by machine.
#
# Environment: BENCH_SECONDS (per wrk run, default 5), BENCH_ROUNDS
# (default 5), BENCH_CONNECTIONS (default 4), BENCH_LANGS (default
# "python node go java"), IDEM_PG_CONFIG as for test/run.sh.  It takes no
# argument but --help; it waits for a test run on the same server
# installation to end (and says so), and needs the toolchains of
# test/toolchains.sh (Node.js 20 is installed into the cache if missing).

case "${1:-}" in
	-h | --help)
		sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
		exit 0
		;;
	"" | --measure) ;;
	*)
		echo "bench/clients.sh: unknown argument \"$1\" (it takes none; --help says what it does)" >&2
		exit 2
		;;
esac

BENCH_SECONDS=${BENCH_SECONDS:-5}
BENCH_ROUNDS=${BENCH_ROUNDS:-5}
BENCH_CONNECTIONS=${BENCH_CONNECTIONS:-4}
BENCH_LANGS=${BENCH_LANGS:-python node go java}
BDB=bench_clients

if [ "${1:-}" != --measure ]; then
	source "$(dirname "$0")/../test/lib.sh"
	IDEM_PACKAGES+=(wrk curl socat python3 python3-venv default-jdk-headless maven)
	command -v npm >/dev/null || IDEM_PACKAGES+=(npm)
	command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || IDEM_PACKAGES+=(golang-go)
	idem_setup "max_wal_size = '4GB'" "checkpoint_timeout = '30min'" "shared_buffers = '512MB'"
	source "$(dirname "$0")/../test/toolchains.sh"
	idem_toolchains
	as_test_user createdb "$BDB"
	as_test_user psql -X -q -v ON_ERROR_STOP=1 -d "$BDB" -c 'CREATE EXTENSION idempotency' \
		-f "$IDEM_SRC/clients/demo/schema.sql" >/dev/null
	as_test_user psql -X -q -v ON_ERROR_STOP=1 -d "$BDB" >/dev/null <<'SQL'
CREATE TABLE bench_effects (id bigserial PRIMARY KEY, k text);
GRANT INSERT, SELECT ON bench_effects TO idem_demo_app;
GRANT USAGE ON SEQUENCE bench_effects_id_seq TO idem_demo_app;
SQL
	# The measuring part, as the cluster's user (its processes are its own)
	as_test_user env BENCH_SECONDS="$BENCH_SECONDS" BENCH_ROUNDS="$BENCH_ROUNDS" \
		BENCH_CONNECTIONS="$BENCH_CONNECTIONS" BENCH_LANGS="$BENCH_LANGS" \
		IDEM_CLIENT_CACHE="${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}" IDEM_CLIENTS_FROM="${IDEM_CLIENTS_FROM:-}" \
		bash "$IDEM_SRC/bench/clients.sh" --measure
	exit
fi

set -euo pipefail
BTMP=$IDEM_WORK/bench-clients
mkdir -p "$BTMP"
source "$IDEM_SRC/test/scripts/lib/go_toolchain.sh"
CLIENTS=${IDEM_CLIENTS_FROM:-$IDEM_SRC/clients}  # IDEM_CLIENTS_FROM: development only
go_toolchain "$CLIENTS/go" >/dev/null

bq() {
	psql -X -q -At -v ON_ERROR_STOP=1 -d "$BDB" "$@"
}

# JDBC speaks TCP only and the cluster listens on its unix socket alone
RELAY=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
socat "TCP-LISTEN:$RELAY,bind=127.0.0.1,reuseaddr,fork,nodelay" "UNIX-CONNECT:$PGHOST/.s.PGSQL.$PGPORT" &
RELAY_PID=$!
DEMO_PID=
trap 'bench_rc=$?; set +e; [ -z "$DEMO_PID" ] || kill -KILL -- "-$DEMO_PID"; kill "$RELAY_PID"; exit $bench_rc' EXIT

# demo_start LANGUAGE: its demo with --bench, as the application role
demo_start() {
	local lang=$1 i
	rm -f "$BTMP/port"
	env PGDATABASE="$BDB" PGUSER=idem_demo_app DEMO_TOKENS=token-a=acct-a \
		JDBC_URL="jdbc:postgresql://127.0.0.1:$RELAY/$BDB?user=idem_demo_app" \
		setsid bash "$CLIENTS/$lang/demo/start.sh" --bench --port 0 --port-file "$BTMP/port" \
		--max-seconds 1800 >"$BTMP/$lang.log" 2>&1 &
	DEMO_PID=$!
	for i in $(seq 1 3000); do
		[ -s "$BTMP/port" ] && break
		kill -0 "$DEMO_PID" 2>/dev/null || break
		sleep 0.2
	done
	if ! [ -s "$BTMP/port" ]; then
		echo "FAIL: the $lang demo did not start"
		tail -40 "$BTMP/$lang.log"
		exit 1
	fi
	URL=http://127.0.0.1:$(cat "$BTMP/port")
}

demo_stop() {
	kill -TERM "$DEMO_PID" 2>/dev/null || true
	sleep 1
	kill -KILL -- "-$DEMO_PID" 2>/dev/null || true
	wait "$DEMO_PID" 2>/dev/null || true
	DEMO_PID=
}

# to_ms VALUE: wrk's 1.23ms / 456.00us / 1.01s in milliseconds
to_ms() {
	awk -v v="$1" 'BEGIN {
		n = v + 0
		if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000
		printf "%.3f", n }'
}

# run_wrk NAME ROUTE MODE: one wrk run; appends "p50 p99 rps" to $BTMP/NAME
run_wrk() {
	local name=$1 route=$2 mode=$3 out p50 p99 rps bad
	out=$(wrk -t 2 -c "$BENCH_CONNECTIONS" -d "${BENCH_SECONDS}s" --latency \
		-s "$IDEM_SRC/bench/clients.lua" "$URL$route" -- "$mode" "$name-$RANDOM$RANDOM")
	p50=$(awk '$1 == "50%" { print $2 }' <<<"$out")
	p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
	rps=$(awk '$1 == "Requests/sec:" { print $2 }' <<<"$out")
	bad=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' <<<"$out")
	if [ -n "$bad" ] || grep -q 'Socket errors' <<<"$out"; then
		echo "FAIL: $name: $(grep -E 'Non-2xx|Socket errors' <<<"$out")" >&2
		BENCH_FAIL="${BENCH_FAIL:+$BENCH_FAIL; }$name"
	fi
	echo "$(to_ms "$p50") $(to_ms "$p99") $rps" >>"$BTMP/$name"
}

# median COLUMN NAME: the median of a column of $BTMP/NAME
median() {
	awk -v c="$1" '{ print $c }' "$BTMP/$2" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

echo "# client libraries: middleware vs the same handler by hand"
echo
echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), $(nproc) cores," \
	"wrk -t 2 -c $BENCH_CONNECTIONS -d ${BENCH_SECONDS}s per run, $BENCH_ROUNDS interleaved rounds," \
	"medians; one POST = one transaction (reserve, INSERT, complete)."
echo
echo "| language | keys | by hand | by hand p50 | middleware p50 | p50 ratio | by hand p99 | middleware p99 | by hand req/s | middleware req/s |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for lang in $BENCH_LANGS; do
	demo_start "$lang"
	routes=(by-hand middleware)
	[ "$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$URL/bench/by-hand-tx")" = 404 ] || routes+=(by-hand-tx)
	# the replays' keys, completed once through each route; one warm-up run each
	for route in "${routes[@]}"; do
		for k in $(seq 0 15); do
			curl -sS -o /dev/null -X POST -H 'Content-Type: application/json' \
				-H 'Authorization: Bearer token-a' -H "Idempotency-Key: replay-$k" \
				--data '{"n": 1}' "$URL/bench/$route"
		done
		wrk -t 2 -c "$BENCH_CONNECTIONS" -d 2s -s "$IDEM_SRC/bench/clients.lua" "$URL/bench/$route" \
			-- new "warm-$lang-$route-$RANDOM" >/dev/null
	done
	for mode in new replay; do
		# the routes in turn, each one first in as many rounds as the others
		for round in $(seq 1 "$BENCH_ROUNDS"); do
			n=${#routes[@]}
			for i in $(seq 0 $((n - 1))); do
				route=${routes[$(((i + round) % n))]}
				run_wrk "$lang-$mode-$route" "/bench/$route" "$mode"
			done
		done
		m=$lang-$mode-middleware
		for route in "${routes[@]}"; do
			[ "$route" = middleware ] && continue
			h=$lang-$mode-$route
			printf '| %s | %s | `%s` | %s ms | %s ms | %s | %s ms | %s ms | %s | %s |\n' "$lang" "$mode" "$route" \
				"$(median 1 "$h")" "$(median 1 "$m")" \
				"$(awk -v a="$(median 1 "$m")" -v b="$(median 1 "$h")" 'BEGIN { printf "%.2f", a / b }')" \
				"$(median 2 "$h")" "$(median 2 "$m")" "$(median 3 "$h")" "$(median 3 "$m")"
		done
	done
	demo_stop
done
echo
echo "bench_effects rows (one per new key): $(bq -c 'SELECT count(*) FROM bench_effects')," \
	"records: $(bq -c 'SELECT count(*) FROM idem_keys')"
if [ -n "${BENCH_FAIL:-}" ]; then
	echo "FAIL: runs with errors: $BENCH_FAIL"
	exit 1
fi
