# The HTTP behaviour of the client libraries (doc/clients.md), checked the
# same way against the demo app of each language (clients/<language>/demo):
# test/scripts/client_*.sh, pgbouncer.sh and clients_cross.sh start a demo
# with hc_start and call hc_contract, which drives it with curl (401 and the
# 400s of the key parser, completed 400s, 201 with Location and its replay
# under the quoted and the bare key, 422, scopes, 402, a handler error that
# rolls back, a dropped response, a storm of concurrent duplicates over
# several keys, a stuck key, a crash between the commit and the answer, one
# before the commit) and counts the payments and the records in the
# database.  Sourced after test/scripts/lib/examples.sh.
#
# The demos are run from clients/<language>/demo/start.sh of this tree, or
# of ${IDEM_CLIENTS_FROM}/<language> when that is set (development only).

HC_SCOPE_256=$(printf 's%.0s' $(seq 256))
# The demo's bearer tokens and their accounts (the scope); token-long's
# account is over the extension's 255 bytes
HC_TOKENS="token-a=acct-a,token-b=acct-b,token-storm=acct-storm,token-long=$HC_SCOPE_256"
HC_PROBLEM_TYPE=https://github.com/pg-idempotency/idempotency/blob/main/doc/clients.md
HC_DEMO_ENV=()
HC_TEST_ENV=()
HC_SERVERS=()

# hc_setup NAME: the demo's database (idem_client_NAME, with the extension),
# its tables and role (clients/demo/schema.sql), and a scratch directory
hc_setup() {
	ex_database "idem_client_$1"
	EX_ROLES+=(idem_demo_app)
	ex_sql -f clients/demo/schema.sql
	ex_tmpdir
	HC_TMP=$EX_TMP
	trap hc_cleanup EXIT
}

# The EXIT trap: every demo's process group (start.sh may have children),
# then examples.sh's cleanup, keeping the exit status
hc_cleanup() {
	local rc=$? pid
	set +e
	for pid in "${HC_SERVERS[@]}"; do
		kill -KILL -- "-$pid" 2>/dev/null || true
	done
	(exit $rc)
	ex_cleanup
}

# The directory of a language's package
hc_client_dir() {
	echo "${IDEM_CLIENTS_FROM:-clients}/$1"
}

# hc_package_tests LANGUAGE: the package's own tests (clients/<language>/test.sh,
# which makes its own databases) as this user, a superuser, with libpq's
# environment; HC_TEST_ENV adds variables.  Its output is shown, and its
# exit status is a check.
hc_package_tests() {
	local lang=$1 dir rc=0 start
	dir=$(hc_client_dir "$lang")
	echo "== $lang: $dir/test.sh"
	start=$(date +%s)
	if [ -f "$dir/test.sh" ]; then
		env PGUSER="${PGUSER:-$(id -un)}" PGDATABASE=postgres "${HC_TEST_ENV[@]}" \
			bash "$dir/test.sh" 2>&1 | sed 's/^/  /' || rc=${PIPESTATUS[0]}
	else
		echo "$dir/test.sh is missing"
		rc=missing
	fi
	echo "$lang: test.sh took $(($(date +%s) - start)) s"
	ex_check "$lang: the package's tests (test.sh exit status)" "$rc" 0
}

# hc_tcp: a loopback TCP address of the cluster for JDBC, as HC_TCP_HOST
# and HC_TCP_PORT, with HC_TEST_ENV pointing libpq at the same server.
# The cluster's own 127.0.0.1:$PGPORT when it listens there; otherwise
# socat relays a free loopback port, and a unix socket of that port number
# in a directory of ours, to the cluster's unix socket.
hc_tcp() {
	local dir i
	local id="SELECT system_identifier FROM pg_control_system()"
	# the same server on both (another cluster may listen on that port)
	if [ "$(psql -X -q -At -h 127.0.0.1 -c "$id" 2>/dev/null)" = "$(ex_value "$id")" ]; then
		HC_TCP_HOST=127.0.0.1 HC_TCP_PORT=$PGPORT
		HC_TEST_ENV=()
		return 0
	fi
	HC_TCP_HOST=127.0.0.1 HC_TCP_PORT=$(hc_free_port)
	dir=$HC_TMP/relay
	mkdir -p "$dir"
	socat "TCP-LISTEN:$HC_TCP_PORT,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:$PGHOST/.s.PGSQL.$PGPORT" &
	EX_PIDS+=($!)
	socat "UNIX-LISTEN:$dir/.s.PGSQL.$HC_TCP_PORT,fork" "UNIX-CONNECT:$PGHOST/.s.PGSQL.$PGPORT" &
	EX_PIDS+=($!)
	HC_TEST_ENV=(PGHOST="$dir" PGPORT="$HC_TCP_PORT")
	for i in $(seq 1 100); do
		psql -X -q -h 127.0.0.1 -p "$HC_TCP_PORT" -c 'SELECT 1' >/dev/null 2>&1 &&
			PGHOST=$dir PGPORT=$HC_TCP_PORT psql -X -q -c 'SELECT 1' >/dev/null 2>&1 && break
		sleep 0.1
	done
	echo "the cluster listens on a unix socket only: relayed from 127.0.0.1:$HC_TCP_PORT and $dir"
	HC_JDBC_URL="jdbc:postgresql://127.0.0.1:$HC_TCP_PORT/$PGDATABASE?user=idem_demo_app"
}

# hc_start LANGUAGE [ARGS...]: start that language's demo (in a session of
# its own, as the application role, with libpq's environment, or JDBC_URL
# for Java; HC_DEMO_ENV adds variables), wait for the port it listens on
# (the first start builds it) and set HC_URL.  The demo stops by itself
# after 900 seconds if nothing else stops it.
hc_start() {
	local lang=$1 dir i
	shift
	dir=$(hc_client_dir "$lang")
	rm -f "$HC_TMP/port"
	if ! [ -f "$dir/demo/start.sh" ]; then
		echo "FAIL: $dir/demo/start.sh is missing"
		EX_FAILED=1
		return 1
	fi
	echo "== starting the $lang demo ($dir/demo/start.sh)"
	env PGUSER=idem_demo_app DEMO_TOKENS="$HC_TOKENS" \
		JDBC_URL="${HC_JDBC_URL:-jdbc:postgresql://127.0.0.1:$PGPORT/$PGDATABASE?user=idem_demo_app}" \
		"${HC_DEMO_ENV[@]}" setsid bash "$dir/demo/start.sh" --port 0 --port-file "$HC_TMP/port" \
		--max-seconds 900 "$@" >>"$HC_TMP/server-$lang.log" 2>&1 &
	HC_SERVER=$!
	HC_SERVERS+=($HC_SERVER)
	HC_LANG=$lang
	HC_START=("$lang" "$@")
	for i in $(seq 1 3000); do
		[ -s "$HC_TMP/port" ] && break
		kill -0 "$HC_SERVER" 2>/dev/null || break
		sleep 0.2
	done
	if ! [ -s "$HC_TMP/port" ]; then
		echo "FAIL: the $lang demo did not start"
		tail -n 60 "$HC_TMP/server-$lang.log" | sed 's/^/  /'
		EX_FAILED=1
		return 1
	fi
	HC_URL=http://127.0.0.1:$(cat "$HC_TMP/port")
	echo "$lang demo: pid $HC_SERVER on $HC_URL"
}

# Start the last started demo again, with the same arguments
hc_restart() {
	hc_start "${HC_START[@]}"
}

# Stop the demo with SIGTERM and check that it went
hc_stop() {
	local i
	kill -TERM "$HC_SERVER" 2>/dev/null || true
	for i in $(seq 1 100); do kill -0 "$HC_SERVER" 2>/dev/null || break; sleep 0.1; done
	ex_check "$HC_LANG demo stopped on SIGTERM" \
		"$(kill -0 "$HC_SERVER" 2>/dev/null && echo running || echo stopped)" stopped
	kill -KILL -- "-$HC_SERVER" 2>/dev/null || true
	wait "$HC_SERVER" 2>/dev/null || true
	hc_log_on_failure
}

# SIGKILL the demo and every process of its session
hc_kill() {
	kill -KILL -- "-$HC_SERVER" 2>/dev/null || true
	wait "$HC_SERVER" 2>/dev/null || true
}

# The demo's log, once, when a check has failed
hc_log_on_failure() {
	if [ "$EX_FAILED" != 0 ] && [ -z "${HC_LOG_SHOWN:-}" ]; then
		HC_LOG_SHOWN=1
		echo "$HC_LANG demo log (the end):"
		tail -n 80 "$HC_TMP/server-$HC_LANG.log" | sed 's/^/  /'
	fi
}

# A free loopback TCP port
hc_free_port() {
	/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# hc_post TOKEN KEY BODY [curl args...]: POST /payments with that bearer
# token and Idempotency-Key field value (either '' for none); prints the
# status; the status, body and headers are kept in $HC_TMP
hc_post() {
	local token=$1 key=$2 body=$3
	shift 3
	curl -sS -o "$HC_TMP/body" -D "$HC_TMP/headers" -w '%{http_code}' --max-time 20 \
		-X POST -H 'Content-Type: application/json' \
		${token:+-H "Authorization: Bearer $token"} ${key:+-H "Idempotency-Key: $key"} \
		--data "$body" "$@" "$HC_URL/payments" | tee "$HC_TMP/status"
}

# hc_get TOKEN PATH: GET with that bearer token; prints the status
hc_get() {
	curl -sS -o "$HC_TMP/body" -D "$HC_TMP/headers" -w '%{http_code}' --max-time 20 \
		-H "Authorization: Bearer $1" "$HC_URL$2" | tee "$HC_TMP/status"
}

# hc_header NAME [FILE]: the value of a response header
hc_header() {
	grep -i "^$1:" "${2:-$HC_TMP/headers}" | head -1 | cut -d: -f2- | tr -d '\r' | sed 's/^ *//; s/ *$//'
}

# hc_media [FILE]: the response's media type (Content-Type without parameters)
hc_media() {
	hc_header Content-Type "$@" | cut -d';' -f1 | tr 'A-Z' 'a-z'
}

# hc_json MEMBER [FILE]: a member of the JSON object in the body (strings
# as they are, other values as JSON); "(not JSON)" for another body
hc_json() {
	/usr/bin/python3 - "$1" "${2:-$HC_TMP/body}" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[2], "rb"))
except ValueError:
    print("(not JSON)")
    sys.exit(0)
value = doc.get(sys.argv[1]) if isinstance(doc, dict) else None
print("" if value is None else value if isinstance(value, str) else json.dumps(value))
PY
}

# hc_canon [FILE]: the body as canonical JSON (sorted members, no spaces),
# so that two answers compare as documents; "(not JSON)" for another body
hc_canon() {
	/usr/bin/python3 -c '
import json, sys
try:
    print(json.dumps(json.load(open(sys.argv[1], "rb")), sort_keys=True, separators=(",", ":")))
except (ValueError, OSError):
    print("(not JSON)")' "${1:-$HC_TMP/body}"
}

# hc_problem CODE [RETRY-AFTER]: the last answer is an RFC 9457 problem
# with that code (the library's codes also with doc/clients.md's anchor as
# its type), its status in the body, a detail, and that Retry-After (none
# when not given)
hc_problem() {
	local code=$1 retry=${2:-}
	ex_check "... problem code" "$(hc_json code)" "$code"
	ex_check "... Content-Type" "$(hc_media)" application/problem+json
	ex_check "... problem status" "$(hc_json status)" "$(cat "$HC_TMP/status")"
	case "$code" in
		card-declined | bad-request) ;;
		*) ex_check "... problem type" "$(hc_json type)" "$HC_PROBLEM_TYPE#$code" ;;
	esac
	ex_check "... a detail" "$([ -n "$(hc_json detail)" ] && echo present || echo missing)" present
	ex_check "... Retry-After" "$(hc_header Retry-After)" "$retry"
}

# hc_keep NAME: keep the last answer (status, headers, body) as NAME
hc_keep() {
	cp "$HC_TMP/body" "$HC_TMP/$1.body"
	cp "$HC_TMP/headers" "$HC_TMP/$1.headers"
	cp "$HC_TMP/status" "$HC_TMP/$1.status"
}

# hc_replayed WHAT NAME: the last answer is a replay of the kept answer NAME:
# its status, Location, media type and body (as a JSON document), and
# Idempotent-Replayed: true
hc_replayed() {
	local what=$1 name=$2
	ex_check "$what: status" "$(cat "$HC_TMP/status")" "$(cat "$HC_TMP/$name.status")"
	ex_check "$what: Idempotent-Replayed" "$(hc_header Idempotent-Replayed)" true
	ex_check "$what: Location" "$(hc_header Location)" "$(hc_header Location "$HC_TMP/$name.headers")"
	ex_check "$what: Content-Type" "$(hc_media)" "$(hc_media "$HC_TMP/$name.headers")"
	ex_check "$what: body" "$(hc_canon)" "$(hc_canon "$HC_TMP/$name.body")"
}

hc_payments() { ex_value "SELECT count(*) FROM payments WHERE order_id = '$1'"; }
hc_records() { ex_value "SELECT count(*) FROM idem_keys WHERE key = '$1'"; }

# hc_request_doc BODY: the request document the libraries send to
# idem_reserve for POST /payments with that JSON body (doc/clients.md)
hc_request_doc() {
	echo "{\"method\": \"POST\", \"path\": \"/payments\", \"body\": $1}"
}

# The demo's transactions open now: sessions of the application role that
# have written (an xid), i.e. that are past the payment's INSERT
hc_open_writes() {
	echo "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()
		AND usename = 'idem_demo_app' AND backend_xid IS NOT NULL)"
}

# hc_storm KEYS CLIENTS [PREFIX]: CLIENTS concurrent requests for each of
# KEYS keys (PREFIX1, ...; storm- by default; the order_id is the key), all
# at once, each slowed so that they overlap; then each key's replay
hc_storm() {
	local keys=$1 clients=$2 p=${3:-storm-} k i pids=() status fresh conflicts replays body
	for k in $(seq 1 "$keys"); do
		body="{\"order_id\": \"$p$k\", \"amount\": $((k * 100)), \"currency\": \"EUR\"}"
		for i in $(seq 1 "$clients"); do
			curl -sS -o "$HC_TMP/storm-b$k-$i" -D "$HC_TMP/storm-h$k-$i" -w '%{http_code}' \
				--max-time 60 -X POST -H 'Content-Type: application/json' \
				-H "Idempotency-Key: $p$k" -H 'Authorization: Bearer token-storm' \
				-H 'X-Simulated-Latency-Ms: 500' --data "$body" \
				"$HC_URL/payments" >"$HC_TMP/storm-s$k-$i" 2>&1 &
			pids+=($!)
		done
	done
	wait "${pids[@]}" || true
	for k in $(seq 1 "$keys"); do
		fresh=0 conflicts=0 replays=0
		rm -f "$HC_TMP/fresh$k.body"
		for i in $(seq 1 "$clients"); do
			status=$(cat "$HC_TMP/storm-s$k-$i")
			if [ "$status" = 201 ] && [ "$(hc_header Idempotent-Replayed "$HC_TMP/storm-h$k-$i")" = true ]; then
				replays=$((replays + 1))
			elif [ "$status" = 201 ]; then
				fresh=$((fresh + 1))
				cp "$HC_TMP/storm-b$k-$i" "$HC_TMP/fresh$k.body"
				cp "$HC_TMP/storm-h$k-$i" "$HC_TMP/fresh$k.headers"
				echo 201 >"$HC_TMP/fresh$k.status"
			elif [ "$status" = 409 ] && [ "$(hc_header Retry-After "$HC_TMP/storm-h$k-$i")" = 1 ] &&
				[ "$(hc_json code "$HC_TMP/storm-b$k-$i")" = in-progress ]; then
				conflicts=$((conflicts + 1))
			else
				echo "$p$k request $i: status $status, body $(cat "$HC_TMP/storm-b$k-$i" 2>/dev/null)"
			fi
		done
		echo "$p$k: $fresh made the payment, $conflicts got 409 in-progress, $replays got the replay"
		ex_check "$p$k: requests that made the payment" "$fresh" 1
		ex_check "$p$k: the others got 409 in-progress with Retry-After: 1, or the replay" \
			"$((conflicts + replays))" "$((clients - 1))"
		ex_check "$p$k: payments in the database" "$(hc_payments "$p$k")" 1
		ex_check "$p$k: its record" "$(ex_value "SELECT status || ':' || response_status FROM idem_keys WHERE key = '$p$k'")" \
			completed:201
		hc_post token-storm "$p$k" \
			"{\"currency\": \"EUR\", \"amount\": $((k * 100)), \"order_id\": \"$p$k\"}" >/dev/null
		if [ -s "$HC_TMP/fresh$k.body" ]; then
			hc_replayed "$p$k: a later retry" "fresh$k"
		fi
	done
}

# Every check of the contract against the running demo at $HC_URL
hc_contract() {
	local body body1 body2 body3 rc i status long id idb
	echo "== 401 and 400s: no principal, the key parser, the extension's checks -- nothing reserved"
	body='{"order_id": "order-0", "amount": 100, "currency": "EUR"}'
	ex_check "no Authorization" "$(hc_post '' key-0 "$body")" 401
	hc_problem unauthenticated
	ex_check "an unknown token" "$(hc_post token-nobody key-0 "$body")" 401
	hc_problem unauthenticated
	ex_check "no Idempotency-Key" "$(hc_post token-a '' "$body")" 400
	hc_problem missing-key
	ex_check "two Idempotency-Key fields" "$(hc_post token-a key-0 "$body" -H 'Idempotency-Key: key-0')" 400
	hc_problem invalid-key
	ex_check "a list in one field" "$(hc_post token-a '"key-0", "key-9"' "$body")" 400
	hc_problem invalid-key
	ex_check "a bare value with a comma" "$(hc_post token-a 'key-0,key-9' "$body")" 400
	hc_problem invalid-key
	ex_check "a quoted value not closed" "$(hc_post token-a '"key-0' "$body")" 400
	hc_problem invalid-key
	ex_check "an escape other than \\\" and \\\\" "$(hc_post token-a '"key\n0"' "$body")" 400
	hc_problem invalid-key
	ex_check "a parameter after the string" "$(hc_post token-a '"key-0";p=1' "$body")" 400
	hc_problem invalid-key
	ex_check "an empty quoted key" "$(hc_post token-a '""' "$body")" 400
	hc_problem invalid-key
	ex_check "an empty field" "$(hc_post token-a '' "$body" -H 'Idempotency-Key;')" 400
	hc_problem invalid-key
	ex_check "a non-ASCII character in a quoted key" "$(hc_post token-a '"chave-é"' "$body")" 400
	hc_problem invalid-key
	# doc/clients.md leaves open whether the parser (invalid-key) or the
	# extension (invalid-request) refuses it in the bare form
	ex_check "a non-ASCII character in a bare key" "$(hc_post token-a 'chave-é' "$body")" 400
	long=$(printf 'k%.0s' $(seq 256))
	ex_check "a key of 256 bytes (SQLSTATE 22023)" "$(hc_post token-a "$long" "$body")" 400
	hc_problem invalid-request
	ex_check "... the detail is the extension's message" "$(hc_json detail)" 'argument "key" is too long'
	ex_check "a scope of 256 bytes (SQLSTATE 22023)" "$(hc_post token-long key-0 "$body")" 400
	hc_problem invalid-request
	ex_check "... the detail is the extension's message" "$(hc_json detail)" 'argument "scope" is too long'
	hc_refused
	ex_check "records after the 401s and 400s" "$(ex_value "SELECT count(*) FROM idem_keys")" 0

	echo "== 400 bad-request: a body that is not a payment is a final answer, completed and replayed"
	ex_check "a body that is not JSON" "$(hc_post token-a bad-1 '{"order_id": ')" 400
	hc_problem bad-request
	hc_keep bad-1
	ex_check "its retry" "$(hc_post token-a bad-1 '{"order_id": ')" 400
	hc_replayed "... a replay" bad-1
	ex_check "a body without an amount" "$(hc_post token-a bad-2 '{"order_id": "order-0", "currency": "EUR"}')" 400
	hc_problem bad-request
	ex_check "records of the 400s" "$(ex_value "SELECT string_agg(key || ':' || status || ':' || response_status, ' ' ORDER BY key) FROM idem_keys")" \
		"bad-1:completed:400 bad-2:completed:400"
	ex_check "payments" "$(ex_value "SELECT count(*) FROM payments")" 0

	echo "== 201 with Location, then its replay: the quoted and the bare key are one key"
	body1='{"order_id": "order-1", "amount": 10000, "currency": "BRL"}'
	ex_check "first POST, the key quoted" "$(hc_post token-a '"key-1"' "$body1")" 201
	hc_keep key-1
	cat "$HC_TMP/body"; echo
	id=$(hc_json id)
	ex_check "... Location" "$(hc_header Location)" "/payments/$id"
	ex_check "... Content-Type" "$(hc_media)" application/json
	ex_check "... the payment" "$(hc_json order_id):$(hc_json amount):$(hc_json currency):$(hc_json status)" \
		order-1:10000:BRL:paid
	ex_check "... not a replay" "$(hc_header Idempotent-Replayed)" ""
	ex_check "... in the database" "$(ex_value "SELECT account || ':' || status FROM payments WHERE id = '$id'")" \
		acct-a:paid
	ex_check "... the record's key is the string, without its quotes" \
		"$(ex_value "SELECT key || ':' || scope || ':' || operation || ':' || status FROM idem_keys WHERE response_status = 201")" \
		key-1:acct-a:create-payment:completed
	ex_check "retry, the key bare" "$(hc_post token-a key-1 "$body1")" 201
	hc_replayed "... a replay" key-1
	ex_check "retry, quoted with spaces around" "$(hc_post token-a ' "key-1"  ' "$body1")" 201
	hc_replayed "... a replay" key-1
	ex_check "retry with the members reordered and the amount spelt 10000.0" \
		"$(hc_post token-a key-1 '{"currency":"BRL","amount":10000.0,"order_id":"order-1"}')" 201
	hc_replayed "... a replay" key-1
	ex_check "payments for order-1" "$(hc_payments order-1)" 1
	ex_check "GET the payment" "$(hc_get token-a "/payments/$id")" 200
	ex_check "... its id" "$(hc_json id)" "$id"

	echo "== 422: the key with another request"
	ex_check "same key, another amount" \
		"$(hc_post token-a key-1 '{"order_id": "order-1", "amount": 99, "currency": "BRL"}')" 422
	hc_problem mismatch
	ex_check "payments for order-1" "$(hc_payments order-1)" 1

	echo "== the scope is the account of the bearer token: user B cannot replay user A's key"
	ex_check "GET A's payment as B" "$(hc_get token-b "/payments/$id")" 404
	ex_check "key-1 from B" "$(hc_post token-b key-1 "$body1")" 201
	hc_keep key-1-b
	idb=$(hc_json id)
	ex_check "... not a replay of A's answer" "$(hc_header Idempotent-Replayed)" ""
	ex_check "... a payment of its own" "$([ -n "$idb" ] && [ "$idb" != "$id" ] && echo "yes" || echo "no ($idb)")" yes
	ex_check "... in B's account" "$(ex_value "SELECT account FROM payments WHERE id = '$idb'")" acct-b
	ex_check "B's retry" "$(hc_post token-b key-1 "$body1")" 201
	hc_replayed "... replays B's answer" key-1-b
	ex_check "A's retry" "$(hc_post token-a key-1 "$body1")" 201
	hc_replayed "... still replays A's answer" key-1
	ex_check "B reusing the key with another amount (B's record, not A's)" \
		"$(hc_post token-b key-1 '{"order_id": "order-1", "amount": 99, "currency": "BRL"}')" 422
	ex_check "payments for order-1" "$(hc_payments order-1)" 2

	echo "== 402: a declined card is a final answer, completed and replayed"
	body='{"order_id": "order-4", "amount": 5000000, "currency": "BRL"}'
	ex_check "declined" "$(hc_post token-a key-4 "$body")" 402
	hc_problem card-declined
	hc_keep key-4
	ex_check "retry" "$(hc_post token-a key-4 "$body")" 402
	hc_replayed "... a replay" key-4
	ex_check "payments for order-4 (declined)" "$(ex_value "SELECT string_agg(status, ' ') FROM payments WHERE order_id = 'order-4'")" \
		declined
	ex_check "its record" "$(ex_value "SELECT status || ':' || response_status FROM idem_keys WHERE key = 'key-4'")" \
		completed:402

	echo "== a handler error rolls back: an error after the payment's INSERT (a trigger)"
	ex_sql <<'SQL'
CREATE FUNCTION hc_fail() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.order_id LIKE 'order-fail-%' THEN
		RAISE EXCEPTION 'simulated failure after the payment' USING ERRCODE = substr(NEW.order_id, 12);
	END IF;
	RETURN NEW;
END
$$;
CREATE TRIGGER hc_fail AFTER INSERT ON payments FOR EACH ROW EXECUTE FUNCTION hc_fail();
SQL
	body='{"order_id": "order-fail-P0001", "amount": 500, "currency": "EUR"}'
	ex_check "an error (SQLSTATE P0001)" "$(hc_post token-a key-5 "$body")" 500
	hc_problem internal-error
	ex_check "... the detail does not show the error" "$(grep -c 'simulated failure' "$HC_TMP/body")" 0
	ex_check "a serialization failure (SQLSTATE 40001)" \
		"$(hc_post token-a key-5s '{"order_id": "order-fail-40001", "amount": 500, "currency": "EUR"}')" 503
	hc_problem retry 1
	ex_check "a deadlock (SQLSTATE 40P01)" \
		"$(hc_post token-a key-5d '{"order_id": "order-fail-40P01", "amount": 500, "currency": "EUR"}')" 503
	hc_problem retry 1
	ex_check "payments after the errors" "$(ex_value "SELECT count(*) FROM payments WHERE order_id LIKE 'order-fail-%'")" 0
	ex_check "records after the errors" "$(ex_value "SELECT count(*) FROM idem_keys WHERE key LIKE 'key-5%'")" 0
	ex_sql -c 'DROP TRIGGER hc_fail ON payments' -c 'DROP FUNCTION hc_fail()'
	ex_check "the retry, once the failure is gone" "$(hc_post token-a key-5 "$body")" 201
	ex_check "... is new, not a replay" "$(hc_header Idempotent-Replayed)" ""
	ex_check "payments for order-fail-P0001" "$(hc_payments order-fail-P0001)" 1

	echo "== a dropped response: the client gives up while the demo commits"
	body2='{"order_id": "order-2", "amount": 2000, "currency": "BRL"}'
	rc=0
	hc_post token-a key-2 "$body2" -H 'X-Simulated-Latency-Ms: 2500' --max-time 0.5 >/dev/null 2>&1 || rc=$?
	ex_check "the first attempt timed out (curl exit status)" "$rc" 28
	# On a loaded machine the demo may not have inserted the payment yet
	ex_wait_for "the first attempt to be in its transaction, past the INSERT" "$(hc_open_writes)" || true
	ex_check "immediate retry" "$(hc_post token-a key-2 "$body2")" 409
	hc_problem in-progress 1
	status=409
	for i in $(seq 1 100); do
		status=$(hc_post token-a key-2 "$body2")
		[ "$status" != 409 ] && break
		sleep 0.2
	done
	ex_check "retry after the first attempt committed" "$status" 201
	ex_check "... a replay of the first attempt's answer" "$(hc_header Idempotent-Replayed)" true
	ex_check "... its Location" "$(hc_header Location)" \
		"/payments/$(ex_value "SELECT id FROM payments WHERE order_id = 'order-2'")"
	ex_check "payments for order-2" "$(hc_payments order-2)" 1

	echo "== a storm: 4 keys, 8 concurrent requests each"
	hc_storm 4 8

	echo "== 409 stuck: a committed reservation older than idempotency.processing_timeout"
	body3='{"order_id": "order-3", "amount": 3000, "currency": "BRL"}'
	ex_sql -c "SELECT outcome FROM idem_reserve('create-payment', 'key-3', '$(hc_request_doc "$body3")', scope => 'acct-a')" >/dev/null
	ex_sql -c "UPDATE idem_keys SET updated_at = updated_at - interval '1 day' WHERE key = 'key-3'"
	ex_check "retry of the stuck request" "$(hc_post token-a key-3 "$body3")" 409
	hc_problem stuck 1
	ex_check "payments for order-3" "$(hc_payments order-3)" 0

	hc_crash_after_commit
	hc_crash_before_commit

	ex_check "payments in all" "$(ex_value "SELECT count(*) FROM payments")" 11
	ex_check "records" "$(ex_value "SELECT string_agg(key || ':' || scope || ':' || CASE WHEN status IN ('processing', 'stuck') THEN 'unfinished' ELSE status END || ':' || coalesce(response_status::text, '-'), ' ' ORDER BY key, scope) FROM idem_keys")" \
		"bad-1:acct-a:completed:400 bad-2:acct-a:completed:400 key-1:acct-a:completed:201 key-1:acct-b:completed:201 key-2:acct-a:completed:201 key-3:acct-a:unfinished:- key-4:acct-a:completed:402 key-5:acct-a:completed:201 key-6:acct-a:completed:201 key-7:acct-a:completed:201 storm-1:acct-storm:completed:201 storm-2:acct-storm:completed:201 storm-3:acct-storm:completed:201 storm-4:acct-storm:completed:201"
	hc_log_on_failure
}

# Requests every demo takes that the server cannot read (doc/clients.md,
# "Requests the server refuses"): 400 invalid-request with the server's
# message, nothing reserved (counted by hc_contract)
hc_refused() {
	local pay='"order_id": "order-0", "amount": 100, "currency": "EUR"'
	ex_check "\\u0000 in a string (SQLSTATE 22P05)" "$(hc_post token-a key-0 "{$pay, \"note\": \"a\\u0000b\"}")" 400
	hc_problem invalid-request
	ex_check "... the server's message" "$(hc_json detail)" "unsupported Unicode escape sequence"
	ex_check "\\u0000 as a member name (SQLSTATE 22P05)" "$(hc_post token-a key-0 "{$pay, \"\\u0000\": 1}")" 400
	hc_problem invalid-request
	ex_check "a lone surrogate (SQLSTATE 22P02)" "$(hc_post token-a key-0 "{$pay, \"note\": \"\\ud800\"}")" 400
	hc_problem invalid-request
	ex_check "... the server's message" "$(hc_json detail)" "invalid input syntax for type json"
	ex_check "a number beyond a double (SQLSTATE 22003)" "$(hc_post token-a key-0 "{$pay, \"note\": 1e400}")" 400
	hc_problem invalid-request
	ex_check "... the server's message" "$(hc_json detail)" "number 1e+400 is out of range for canonical JSON"
	ex_check "a number beyond numeric (SQLSTATE 22003)" "$(hc_post token-a key-0 "{$pay, \"note\": 1e1000000}")" 400
	hc_problem invalid-request
	ex_check "... the server's message" "$(hc_json detail)" "value overflows numeric format"
	# Go hands the byte to the server (22021), the others read it as Latin-1 (22023)
	ex_check "a bare key with a byte that is not UTF-8 (SQLSTATE 22021 or 22023)" \
		"$(hc_post token-a "$(printf 'key-\377')" "{$pay}")" 400
	hc_problem invalid-request
}

# hc_shallow_stack: the nesting limit of doc/clients.md, the same in every
# language, against the server's smallest stack (max_stack_depth 100kB,
# about 600 levels): a body nested 256 levels deep is JSON (its "body" in
# the fingerprint) and the server takes it; one nested 257 levels is bytes
# ("body_base64").  Either way the payment is made once.  The demo is
# started again so that its connections have that stack; it is stopped at
# the end.
hc_shallow_stack() {
	local levels body key doc
	echo "== the nesting limit: 256 levels of JSON are JSON, 257 are bytes, on the server's smallest stack"
	ex_sql -c "ALTER ROLE idem_demo_app SET max_stack_depth = '100kB'"
	hc_restart || return 1
	for levels in 256 257; do
		# the object and the note's arrays
		body="{\"order_id\": \"order-deep-$levels\", \"amount\": 100, \"currency\": \"EUR\", \"note\": $(printf '[%.0s' $(seq $((levels - 1))))$(printf ']%.0s' $(seq $((levels - 1))))}"
		key=key-deep-$levels
		if [ "$levels" = 256 ]; then
			doc=$(hc_request_doc "$body")
		else
			doc="{\"method\": \"POST\", \"path\": \"/payments\", \"body_base64\": \"$(printf '%s' "$body" | base64 -w0)\"}"
		fi
		ex_check "$levels levels" "$(hc_post token-a "$key" "$body")" 201
		ex_check "... fingerprinted as $([ "$levels" = 256 ] && echo JSON || echo bytes)" \
			"$(ex_value "SELECT request_hash = idem_hash('$doc'::jsonb) FROM idem_keys WHERE key = '$key'")" t
		ex_check "... replayed" "$(hc_post token-a "$key" "$body")" 201
		ex_check "... payments for order-deep-$levels" "$(hc_payments "order-deep-$levels")" 1
	done
	ex_sql -c "ALTER ROLE idem_demo_app RESET max_stack_depth"
	hc_stop
}

# A crash between the effect and the answer.  A deferred trigger holds the
# demo's COMMIT on an advisory lock of ours; once its backend waits there,
# the demo is stopped (SIGSTOP), the lock released, the commit seen in the
# database, and the demo killed (SIGKILL): the payment and its record are
# committed and the client never got the answer.  Started again, the demo
# replays it to the retry.
hc_crash_after_commit() {
	local body='{"order_id": "order-6", "amount": 6000, "currency": "BRL"}' got client holder
	echo "== a crash between the effect and the answer (the demo stopped in its COMMIT, then killed)"
	ex_sql <<'SQL'
CREATE FUNCTION hc_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock_shared(4242);
	RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER hc_hold AFTER INSERT ON payments DEFERRABLE INITIALLY DEFERRED
	FOR EACH ROW WHEN (NEW.order_id = 'order-6') EXECUTE FUNCTION hc_hold();
SQL
	PGAPPNAME=hc_holder psql -X -q -c 'SELECT pg_advisory_lock(4242), pg_sleep(300)' >/dev/null 2>&1 &
	holder=$!
	ex_wait_for "the lock to be held" "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'hc_holder')" || true
	curl -sS -o "$HC_TMP/crash-body" -w '%{http_code}' --max-time 60 -X POST \
		-H 'Content-Type: application/json' -H 'Authorization: Bearer token-a' \
		-H 'Idempotency-Key: key-6' --data "$body" \
		"$HC_URL/payments" >"$HC_TMP/crash-status" 2>/dev/null &
	client=$!
	ex_wait_for "the demo's COMMIT to wait for the lock" "SELECT EXISTS (SELECT FROM pg_stat_activity
		WHERE datname = current_database() AND usename = 'idem_demo_app'
		AND wait_event_type = 'Lock' AND wait_event = 'advisory')" || true
	kill -STOP -- "-$HC_SERVER"
	ex_value "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'hc_holder'" >/dev/null
	wait "$holder" || true
	ex_wait_for "the payment to commit" "SELECT EXISTS (SELECT FROM payments WHERE order_id = 'order-6')" || true
	hc_kill
	wait "$client" || true
	got=$(cat "$HC_TMP/crash-status")
	ex_check "the client got no answer (curl's status 000)" "$got" 000
	ex_sql -c 'DROP TRIGGER hc_hold ON payments' -c 'DROP FUNCTION hc_hold()'
	ex_check "the payment and its record committed together" \
		"$(hc_payments order-6):$(ex_value "SELECT status || ':' || response_status FROM idem_keys WHERE key = 'key-6'")" \
		1:completed:201
	hc_restart || return 1
	ex_check "the retry, to the restarted demo" "$(hc_post token-a key-6 "$body")" 201
	ex_check "... a replay" "$(hc_header Idempotent-Replayed)" true
	ex_check "... its Location" "$(hc_header Location)" \
		"/payments/$(ex_value "SELECT id FROM payments WHERE order_id = 'order-6'")"
	ex_check "payments for order-6" "$(hc_payments order-6)" 1
}

# A crash before the commit: the demo is killed (SIGKILL) during the
# simulated latency, after the payment's INSERT; nothing of it stays, and
# the retry is new
hc_crash_before_commit() {
	local body='{"order_id": "order-7", "amount": 7000, "currency": "BRL"}'
	echo "== a crash before the commit (SIGKILL during the latency, after the INSERT)"
	curl -sS -o /dev/null --max-time 30 -X POST \
		-H 'Content-Type: application/json' -H 'Authorization: Bearer token-a' \
		-H 'Idempotency-Key: key-7' -H 'X-Simulated-Latency-Ms: 3000' --data "$body" \
		"$HC_URL/payments" >/dev/null 2>&1 &
	local client=$!
	ex_wait_for "the request to be in its transaction, past the INSERT" "$(hc_open_writes)" || true
	hc_kill
	wait "$client" || true
	ex_wait_for "the killed demo's transactions to end" \
		"SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()
			AND usename = 'idem_demo_app' AND xact_start IS NOT NULL)" || true
	ex_check "payments for order-7 after the crash" "$(hc_payments order-7)" 0
	ex_check "records for key-7 after the crash" "$(hc_records key-7)" 0
	hc_restart || return 1
	ex_check "the retry, to the restarted demo" "$(hc_post token-a key-7 "$body")" 201
	ex_check "... is new, not a replay" "$(hc_header Idempotent-Replayed)" ""
	ex_check "payments for order-7" "$(hc_payments order-7)" 1
}

# hc_read_only: a read-only database, as on a standby: replays still
# answer, a new key is 503 read-only (SQLSTATE 25006) and nothing is
# written.  The demo is started again so that its connections begin
# read-only; it is stopped at the end.
hc_read_only() {
	local body='{"order_id": "order-1", "amount": 10000, "currency": "BRL"}'
	echo "== 503: a read-only database (SQLSTATE 25006)"
	ex_sql -c "ALTER ROLE idem_demo_app SET default_transaction_read_only = on"
	hc_restart || return 1
	ex_check "a retry of key-1" "$(hc_post token-a key-1 "$body")" 201
	hc_replayed "... a replay" key-1
	ex_check "a GET" "$(hc_get token-a "$(hc_header Location "$HC_TMP/key-1.headers")")" 200
	ex_check "a new key" "$(hc_post token-a key-8 "$body")" 503
	hc_problem read-only 1
	ex_check "payments in all" "$(ex_value "SELECT count(*) FROM payments")" 11
	ex_check "records for key-8" "$(hc_records key-8)" 0
	ex_sql -c "ALTER ROLE idem_demo_app RESET default_transaction_read_only"
	hc_stop
}
