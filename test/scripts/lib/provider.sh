# The payment provider simulator (test/provider/provider.py) for a test
# script: prov_start starts it on a free loopback port with its state in a
# directory of the caller's, prov_stop / prov_kill stop it (a restart on the
# same directory keeps its charges), and prov_json / prov_stat read its
# answers.  Sourced from the source tree's root; needs curl and python3.
#
#   source test/scripts/lib/provider.sh
#   prov_start "$tmp/provider"        # sets PROV_URL and PROV_PID
#   curl -s -X POST "$PROV_URL/charges" -H 'Idempotency-Key: k1' \
#        -d '{"amount": 500, "currency": "eur", "reference": "order-1"}'
#   prov_stat charges                 # 1
#   prov_restart --kill               # kill -9, and again on the same port
#   prov_stop                         # at exit too, through the caller's trap

PROV_PYTHON=${IDEM_PYTHON:-/usr/bin/python3}
[ -x "$PROV_PYTHON" ] || PROV_PYTHON=$(command -v python3)
PROV_PID=
PROV_URL=
PROV_DIR=

# prov_start STATE_DIR [ARG...]: start the simulator (more arguments go to
# provider.py, e.g. --verbose) and wait until it answers; its output goes to
# STATE_DIR/provider.log
prov_start() {
	local dir=$1 i
	shift
	PROV_DIR=$dir
	mkdir -p "$dir"
	rm -f "$dir/port"
	"$PROV_PYTHON" test/provider/provider.py --port 0 --port-file "$dir/port" \
		--state-dir "$dir" "$@" >>"$dir/provider.log" 2>&1 &
	PROV_PID=$!
	for i in $(seq 1 100); do
		if [ -s "$dir/port" ]; then
			PROV_URL=http://127.0.0.1:$(cat "$dir/port")
			curl -sf -o /dev/null "$PROV_URL/health" && return 0
		fi
		kill -0 "$PROV_PID" 2>/dev/null || break
		sleep 0.1
	done
	echo "the provider simulator did not start; its log:" >&2
	cat "$dir/provider.log" >&2
	return 1
}

# prov_stop: SIGTERM and wait for it (nothing if it is not running)
prov_stop() {
	[ -n "$PROV_PID" ] || return 0
	kill "$PROV_PID" 2>/dev/null || true
	wait "$PROV_PID" 2>/dev/null || true
	PROV_PID=
}

# prov_kill: kill -9, as a crash
prov_kill() {
	[ -n "$PROV_PID" ] || return 0
	kill -KILL "$PROV_PID" 2>/dev/null || true
	wait "$PROV_PID" 2>/dev/null || true
	PROV_PID=
}

# prov_restart [--kill]: stop it (SIGTERM, or kill -9 with --kill) and
# start it again on the same state directory and port, so that an
# application pointed at PROV_URL finds it again
prov_restart() {
	local port=${PROV_URL##*:}
	if [ "${1:-}" = --kill ]; then prov_kill; else prov_stop; fi
	prov_start "$PROV_DIR" --port "$port"
}

# prov_json EXPR: evaluate a Python expression over the JSON on stdin,
# bound to j (e.g. prov_json 'j["id"]'); strings print bare, others as JSON
prov_json() {
	"$PROV_PYTHON" -c '
import json, sys
j = json.load(sys.stdin)
v = eval(sys.argv[1], {"j": j})
print(v if isinstance(v, str) else json.dumps(v))' "$1"
}

# prov_stat NAME: one count of GET /stats (charges, requests, replays,
# conflicts, mismatches, faults)
prov_stat() {
	curl -sf "$PROV_URL/stats" | prov_json "j['$1']"
}

# prov_charges REFERENCE: how many charges the provider has for a reference
prov_charges() {
	curl -sf -G "$PROV_URL/charges" --data-urlencode "reference=$1" | prov_json 'j["count"]'
}
