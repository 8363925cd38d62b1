# The HTTP contract of the examples/http services (doc/http.md),
# checked the same way for each language: test/scripts/client_*.sh start
# their service with hc_start and call hc_contract, which drives it with curl
# (the 400s, 201 and its replay, 422, a dropped response, a storm of
# concurrent duplicates over several keys, a stuck key, a declined card,
# scopes) and counts the payments in the database.  Sourced after
# test/scripts/lib/examples.sh.

# The service's database, its tables and role (examples/http/schema.sql)
hc_setup() {
	ex_database "idem_client_$1"
	EX_ROLES+=(idem_example_http_app)
	ex_sql -f examples/http/schema.sql
	ex_tmpdir
	HC_TMP=$EX_TMP
}

# hc_start COMMAND...: start the service, which is given
# --port-file F --max-seconds N, and wait for the port it listens on
hc_start() {
	local i
	rm -f "$HC_TMP/port"
	"$@" --port-file "$HC_TMP/port" --max-seconds 120 2>"$HC_TMP/server.log" &
	HC_SERVER=$!
	EX_PIDS+=($HC_SERVER)
	for i in $(seq 1 300); do
		[ -s "$HC_TMP/port" ] && break
		kill -0 "$HC_SERVER" 2>/dev/null || break
		sleep 0.1
	done
	if ! [ -s "$HC_TMP/port" ]; then
		echo "FAIL: the service did not start"
		sed 's/^/  /' "$HC_TMP/server.log"
		return 1
	fi
	HC_URL=http://127.0.0.1:$(cat "$HC_TMP/port")
	echo "service pid $HC_SERVER on $HC_URL"
}

# Start each language's service, as the application role, with libpq's
# environment (JDBC: the URL given); built first where it needs it
hc_start_python() {
	PGUSER=idem_example_http_app hc_start /usr/bin/python3 examples/http/python/server.py "$@"
}

hc_start_node() {
	if ! [ -d examples/http/node/node_modules/pg ]; then
		(cd examples/http/node && npm ci --no-audit --no-fund --loglevel=error)
	fi
	PGUSER=idem_example_http_app hc_start node examples/http/node/server.js
}

# Offline, from Debian's golang-github-jackc-pgx-v4-dev, in GOPATH mode as
# Debian packages Go libraries
hc_start_go() {
	if ! [ -x "$HC_TMP/payments-go" ]; then
		GO111MODULE=off GOPATH=/usr/share/gocode go build -o "$HC_TMP/payments-go" ./examples/http/go
	fi
	PGUSER=idem_example_http_app hc_start "$HC_TMP/payments-go"
}

# hc_start_java JDBC_URL
hc_start_java() {
	local jar=/usr/share/java/postgresql.jar
	if ! [ -d "$HC_TMP/classes" ]; then
		javac -Xlint:all -Werror -cp "$jar" -d "$HC_TMP/classes" examples/http/java/PaymentsServer.java
	fi
	JDBC_URL=$1 hc_start java -cp "$HC_TMP/classes:$jar" PaymentsServer
}

# A free loopback TCP port
hc_free_port() {
	/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Stop the service with SIGTERM and check that it went
hc_stop() {
	local i
	kill -TERM "$HC_SERVER"
	for i in $(seq 1 50); do kill -0 "$HC_SERVER" 2>/dev/null || break; sleep 0.1; done
	ex_check "service stopped" "$(kill -0 "$HC_SERVER" 2>/dev/null && echo running || echo stopped)" stopped
	if [ "$EX_FAILED" != 0 ]; then
		echo "service log:"
		sed 's/^/  /' "$HC_TMP/server.log"
	fi
}

# hc_post KEY BODY [curl args...]: prints the status; body and headers in $HC_TMP
hc_post() {
	local key=$1 body=$2
	shift 2
	curl -sS -o "$HC_TMP/body" -D "$HC_TMP/headers" -w '%{http_code}' --max-time 20 \
		-X POST -H 'Content-Type: application/json' \
		${key:+-H "Idempotency-Key: $key"} --data "$body" "$@" "$HC_URL/payments"
}

# hc_header NAME [FILE]: the value of a response header
hc_header() {
	grep -i "^$1:" "${2:-$HC_TMP/headers}" | head -1 | cut -d: -f2- | tr -d '\r' | sed 's/^ *//'
}

# hc_error [FILE]: the "error" member of a JSON error body
hc_error() {
	sed -nE 's/.*"error": ?"([a-z_]+)".*/\1/p' "${1:-$HC_TMP/body}"
}

hc_payments() { ex_value "SELECT count(*) FROM payments WHERE order_id = '$1'"; }

# hc_storm KEYS CLIENTS: CLIENTS concurrent requests for each of KEYS keys,
# all at once, each slowed so that they overlap; then each key's replay
hc_storm() {
	local keys=$1 clients=$2 k i pids=() status fresh conflicts replays
	for k in $(seq 1 "$keys"); do
		for i in $(seq 1 "$clients"); do
			curl -sS -o "$HC_TMP/storm-b$k-$i" -D "$HC_TMP/storm-h$k-$i" -w '%{http_code}' \
				--max-time 30 -X POST -H 'Content-Type: application/json' \
				-H "Idempotency-Key: storm-$k" -H 'X-Account-Id: acct-storm' \
				-H 'X-Simulated-Latency-Ms: 500' \
				--data "{\"order_id\": \"storm-$k\", \"amount\": $((k * 100)), \"currency\": \"EUR\"}" \
				"$HC_URL/payments" >"$HC_TMP/storm-s$k-$i" 2>&1 &
			pids+=($!)
		done
	done
	wait "${pids[@]}" || true
	for k in $(seq 1 "$keys"); do
		fresh=0 conflicts=0 replays=0
		for i in $(seq 1 "$clients"); do
			status=$(cat "$HC_TMP/storm-s$k-$i")
			if [ "$status" = 201 ] && [ "$(hc_header Idempotent-Replayed "$HC_TMP/storm-h$k-$i")" = true ]; then
				replays=$((replays + 1))
			elif [ "$status" = 201 ]; then
				fresh=$((fresh + 1))
				cp "$HC_TMP/storm-b$k-$i" "$HC_TMP/storm-fresh$k"
			elif [ "$status" = 409 ] && [ "$(hc_header Retry-After "$HC_TMP/storm-h$k-$i")" = 1 ] &&
				[ "$(hc_error "$HC_TMP/storm-b$k-$i")" = in_progress ]; then
				conflicts=$((conflicts + 1))
			else
				echo "storm-$k request $i: status $status, body $(cat "$HC_TMP/storm-b$k-$i" 2>/dev/null)"
			fi
		done
		echo "storm-$k: $fresh made the payment, $conflicts got 409 in_progress, $replays got the replay"
		ex_check "storm-$k: requests that made the payment" "$fresh" 1
		ex_check "storm-$k: the others got 409 in_progress with Retry-After, or the replay" \
			"$((conflicts + replays))" "$((clients - 1))"
		ex_check "storm-$k: payments" "$(hc_payments "storm-$k")" 1
		ex_check "storm-$k: replay" "$(hc_post "storm-$k" \
			"{\"currency\": \"EUR\", \"amount\": $((k * 100)), \"order_id\": \"storm-$k\"}" \
			-H 'X-Account-Id: acct-storm')" 201
		ex_check "storm-$k: ... Idempotent-Replayed" "$(hc_header Idempotent-Replayed)" true
		ex_check "storm-$k: ... the first answer's body" "$(cat "$HC_TMP/body")" \
			"$(cat "$HC_TMP/storm-fresh$k" 2>/dev/null)"
	done
}

# Every check of the contract against the running service at $HC_URL
hc_contract() {
	local body body2 body3 rc status i long
	ex_check "GET /healthz" "$(curl -sS -o /dev/null -w '%{http_code}' "$HC_URL/healthz")" 200

	echo "== 400: no key, bad keys (SQLSTATE 22023), a bad scope, a bad body -- nothing reserved"
	body='{"order_id": "order-1", "amount": 10000, "currency": "BRL"}'
	ex_check "no Idempotency-Key" "$(hc_post '' "$body")" 400
	ex_check "... error" "$(hc_error)" missing_key
	ex_check "Idempotency-Key with a non-ASCII character" "$(hc_post 'chave-é' "$body")" 400
	ex_check "... error" "$(hc_error)" invalid_request
	ex_check "... its message is the extension's" \
		"$(grep -o 'argument \\"key\\" contains a character outside printable ASCII' "$HC_TMP/body")" \
		'argument \"key\" contains a character outside printable ASCII'
	long=$(printf 'k%.0s' $(seq 256))
	ex_check "Idempotency-Key of 256 bytes" "$(hc_post "$long" "$body")" 400
	ex_check "X-Account-Id (the scope) of 256 bytes" "$(hc_post key-0 "$body" -H "X-Account-Id: $long")" 400
	ex_check "... its message names the scope" "$(grep -o 'argument \\"scope\\"' "$HC_TMP/body")" \
		'argument \"scope\"'
	ex_check "body that is not JSON" "$(hc_post key-0 '{"order_id": ')" 400
	ex_check "... error" "$(hc_error)" bad_request
	ex_check "body without an amount" "$(hc_post key-0 '{"order_id": "order-0", "currency": "BRL"}')" 400
	ex_check "records after the 400s" "$(ex_value "SELECT count(*) FROM idem_keys")" 0

	echo "== 201, then its replay"
	ex_check "first POST" "$(hc_post key-1 "$body" -H 'X-Account-Id: acct-1')" 201
	cp "$HC_TMP/body" "$HC_TMP/body1"
	cat "$HC_TMP/body1"; echo
	ex_check "... not a replay" "$(hc_header Idempotent-Replayed)" ""
	ex_check "retry" "$(hc_post key-1 "$body" -H 'X-Account-Id: acct-1')" 201
	ex_check "... Idempotent-Replayed" "$(hc_header Idempotent-Replayed)" true
	ex_check "... with the same body" "$(cat "$HC_TMP/body")" "$(cat "$HC_TMP/body1")"
	ex_check "retry with the members reordered" \
		"$(hc_post key-1 '{"currency":"BRL","amount":10000,"order_id":"order-1"}' -H 'X-Account-Id: acct-1')" 201
	ex_check "... Idempotent-Replayed" "$(hc_header Idempotent-Replayed)" true
	ex_check "payments for order-1" "$(hc_payments order-1)" 1

	echo "== 422: the key with another request"
	ex_check "same key, another amount" \
		"$(hc_post key-1 '{"order_id": "order-1", "amount": 99, "currency": "BRL"}' -H 'X-Account-Id: acct-1')" 422
	ex_check "... error" "$(hc_error)" mismatch
	ex_check "payments for order-1" "$(hc_payments order-1)" 1

	echo "== a dropped response: the client gives up while the service commits"
	body2='{"order_id": "order-2", "amount": 2000, "currency": "BRL"}'
	rc=0
	hc_post key-2 "$body2" -H 'X-Account-Id: acct-1' -H 'X-Simulated-Latency-Ms: 2000' \
		--max-time 0.5 >/dev/null 2>&1 || rc=$?
	ex_check "the first attempt timed out (curl exit status)" "$rc" 28
	# On a loaded machine the service may not have reserved the key yet
	ex_wait_for "the first attempt to hold its transaction open" \
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()
			AND usename = 'idem_example_http_app' AND state = 'idle in transaction')" || true
	ex_check "immediate retry" "$(hc_post key-2 "$body2" -H 'X-Account-Id: acct-1')" 409
	ex_check "... error" "$(hc_error)" in_progress
	ex_check "... Retry-After" "$(hc_header Retry-After)" 1
	status=409
	for i in $(seq 1 50); do
		status=$(hc_post key-2 "$body2" -H 'X-Account-Id: acct-1')
		[ "$status" != 409 ] && break
		sleep 0.2
	done
	ex_check "retry after the first attempt committed" "$status" 201
	ex_check "... a replay of the first attempt's answer" "$(hc_header Idempotent-Replayed)" true
	ex_check "payments for order-2" "$(hc_payments order-2)" 1

	echo "== a storm: 4 keys, 8 concurrent requests each"
	hc_storm 4 8

	echo "== 409 stuck: a committed reservation older than idempotency.processing_timeout"
	body3='{"order_id": "order-3", "amount": 3000, "currency": "BRL"}'
	ex_sql -c "SELECT outcome FROM idem_reserve('create-payment', 'key-3', '$body3', scope => 'acct-1')" >/dev/null
	ex_sql -c "UPDATE idem_keys SET updated_at = updated_at - interval '1 day' WHERE key = 'key-3'"
	ex_check "retry of the stuck request" "$(hc_post key-3 "$body3" -H 'X-Account-Id: acct-1')" 409
	ex_check "... error" "$(hc_error)" stuck
	ex_check "... Retry-After" "$(hc_header Retry-After)" 1
	ex_check "payments for order-3" "$(hc_payments order-3)" 0

	echo "== 402: a declined card is a final answer, replayed"
	body='{"order_id": "order-4", "amount": 5000000, "currency": "BRL"}'
	ex_check "declined" "$(hc_post key-4 "$body" -H 'X-Account-Id: acct-1')" 402
	ex_check "... error" "$(hc_error)" card_declined
	ex_check "retry" "$(hc_post key-4 "$body" -H 'X-Account-Id: acct-1')" 402
	ex_check "... Idempotent-Replayed" "$(hc_header Idempotent-Replayed)" true
	ex_check "payments for order-4" "$(hc_payments order-4)" 0

	echo "== keys are scoped by account"
	body='{"order_id": "order-1", "amount": 10000, "currency": "BRL"}'
	ex_check "key-1 from another account" "$(hc_post key-1 "$body" -H 'X-Account-Id: acct-2')" 201
	ex_check "... its own payment" "$(hc_header Idempotent-Replayed)" ""
	ex_check "payments for order-1" "$(hc_payments order-1)" 2

	ex_check "payments in all" "$(ex_value "SELECT count(*) FROM payments")" 7
	ex_check "records" "$(ex_value "SELECT string_agg(key || ':' || scope || ':' || status || ':' || coalesce(response_status::text, '-'), ' ' ORDER BY key, scope) FROM idem_keys")" \
		"key-1:acct-1:completed:201 key-1:acct-2:completed:201 key-2:acct-1:completed:201 key-3:acct-1:processing:- key-4:acct-1:completed:402 storm-1:acct-storm:completed:201 storm-2:acct-storm:completed:201 storm-3:acct-storm:completed:201 storm-4:acct-storm:completed:201"
}

# hc_read_only START-COMMAND...: a read-only database, as on a standby:
# replays still answer, a new key is 503 (SQLSTATE 25006) and nothing is
# written.  The service is started again (with START-COMMAND) so that its
# connections begin read-only; it is stopped at the end.
hc_read_only() {
	local body='{"order_id": "order-1", "amount": 10000, "currency": "BRL"}'
	echo "== 503: a read-only database (SQLSTATE 25006)"
	ex_sql -c "ALTER ROLE idem_example_http_app SET default_transaction_read_only = on"
	"$@"
	ex_check "a retry of key-1" "$(hc_post key-1 "$body" -H 'X-Account-Id: acct-1')" 201
	ex_check "... Idempotent-Replayed" "$(hc_header Idempotent-Replayed)" true
	ex_check "a new key" "$(hc_post key-5 "$body" -H 'X-Account-Id: acct-1')" 503
	ex_check "... error" "$(hc_error)" read_only
	ex_check "... Retry-After" "$(hc_header Retry-After)" 1
	ex_check "payments in all" "$(ex_value "SELECT count(*) FROM payments")" 7
	ex_check "records for key-5" "$(ex_value "SELECT count(*) FROM idem_keys WHERE key = 'key-5'")" 0
	ex_sql -c "ALTER ROLE idem_example_http_app RESET default_transaction_read_only"
	hc_stop
}
