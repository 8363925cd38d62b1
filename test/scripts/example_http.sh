#!/usr/bin/env bash
# examples/http: the Idempotency-Key HTTP service, driven end to end with
# curl: 400 for a missing or invalid key or body, 201 and its replay, 422
# for a reused key, a dropped response (the client times out while the
# server commits, then its retry gets 409 and finally the replay),
# concurrent retries (one payment, the others 409), a declined card (402,
# replayed) and scopes.  Payments are counted in the database.
source test/scripts/lib/examples.sh
ex_database idem_example_http
EX_ROLES+=(idem_example_http_app)
ex_sql -f examples/http/schema.sql

ex_tmpdir
tmp=$EX_TMP
PGUSER=idem_example_http_app /usr/bin/python3 examples/http/server.py \
	--port-file "$tmp/port" --max-seconds 120 2>"$tmp/server.log" &
server=$!
EX_PIDS+=($server)
for i in $(seq 1 100); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port")
URL=http://127.0.0.1:$port
echo "server pid $server on $URL"

# post KEY BODY [curl args...]: prints the status; body and headers in $tmp
post() {
	local key=$1 body=$2
	shift 2
	curl -sS -o "$tmp/body" -D "$tmp/headers" -w '%{http_code}' --max-time 20 \
		-X POST -H 'Content-Type: application/json' \
		${key:+-H "Idempotency-Key: $key"} --data "$body" "$@" "$URL/payments"
}
replayed() { grep -qi '^Idempotent-Replayed: true' "$tmp/headers" && echo yes || echo no; }
payments() { ex_value "SELECT count(*) FROM payments WHERE order_id = '$1'"; }

ex_check "GET /healthz" "$(curl -sS -o /dev/null -w '%{http_code}' "$URL/healthz")" 200

echo "== 400: no key, a bad key, a bad body -- nothing reserved"
BODY='{"order_id": "order-1", "amount": 10000, "currency": "BRL"}'
ex_check "no Idempotency-Key" "$(post '' "$BODY")" 400
ex_check "Idempotency-Key with a non-ASCII character" "$(post 'chave-é' "$BODY")" 400
ex_check "... its error" "$(cat "$tmp/body")" \
	'{"error": "invalid Idempotency-Key", "detail": "argument \"key\" contains a character outside printable ASCII"}'
ex_check "Idempotency-Key of 256 bytes" "$(post "$(printf 'k%.0s' $(seq 256))" "$BODY")" 400
ex_check "body that is not JSON" "$(post key-0 '{"order_id": ')" 400
ex_check "body without an amount" "$(post key-0 '{"order_id": "order-0", "currency": "BRL"}')" 400
ex_check "records after the 400s" "$(ex_value "SELECT count(*) FROM idem_keys")" 0

echo "== 201, then its replay"
ex_check "first POST" "$(post key-1 "$BODY" -H 'X-Account-Id: acct-1')" 201
cp "$tmp/body" "$tmp/body1"
cat "$tmp/body1"; echo
ex_check "... not a replay" "$(replayed)" no
ex_check "retry" "$(post key-1 "$BODY" -H 'X-Account-Id: acct-1')" 201
ex_check "... is a replay" "$(replayed)" yes
ex_check "... with the same body" "$(cat "$tmp/body")" "$(cat "$tmp/body1")"
ex_check "retry with the members reordered" \
	"$(post key-1 '{"currency":"BRL","amount":10000,"order_id":"order-1"}' -H 'X-Account-Id: acct-1')" 201
ex_check "... is a replay" "$(replayed)" yes
ex_check "payments for order-1" "$(payments order-1)" 1

echo "== 422: the key with another request"
ex_check "same key, another amount" \
	"$(post key-1 '{"order_id": "order-1", "amount": 99, "currency": "BRL"}' -H 'X-Account-Id: acct-1')" 422
ex_check "payments for order-1" "$(payments order-1)" 1

echo "== a dropped response: the client gives up while the server commits"
BODY2='{"order_id": "order-2", "amount": 2000, "currency": "BRL"}'
rc=0
post key-2 "$BODY2" -H 'X-Account-Id: acct-1' -H 'X-Simulated-Latency-Ms: 2000' \
	--max-time 0.5 >/dev/null 2>&1 || rc=$?
ex_check "the first attempt timed out (curl exit status)" "$rc" 28
ex_check "immediate retry" "$(post key-2 "$BODY2" -H 'X-Account-Id: acct-1')" 409
ex_check "... tells when to retry" "$(grep -i '^Retry-After:' "$tmp/headers" | tr -d '\r')" "Retry-After: 1"
status=409
for i in $(seq 1 50); do
	status=$(post key-2 "$BODY2" -H 'X-Account-Id: acct-1')
	[ "$status" != 409 ] && break
	sleep 0.2
done
ex_check "retry after the first attempt committed" "$status" 201
ex_check "... is a replay of the first attempt's answer" "$(replayed)" yes
ex_check "payments for order-2" "$(payments order-2)" 1

echo "== eight concurrent retries of one request"
BODY3='{"order_id": "order-3", "amount": 3000, "currency": "BRL"}'
clients=()
for i in $(seq 1 8); do
	curl -sS -o /dev/null -D "$tmp/h$i" -w '%{http_code}\n' --max-time 20 -X POST \
		-H 'Content-Type: application/json' -H 'Idempotency-Key: key-3' \
		-H 'X-Account-Id: acct-1' -H 'X-Simulated-Latency-Ms: 1000' \
		--data "$BODY3" "$URL/payments" >"$tmp/s$i" &
	clients+=($!)
done
wait "${clients[@]}" || true
fresh=0 replays=0 conflicts=0
for i in $(seq 1 8); do
	case "$(cat "$tmp/s$i")" in
		201) if grep -qi '^Idempotent-Replayed: true' "$tmp/h$i"; then replays=$((replays + 1)); else fresh=$((fresh + 1)); fi ;;
		409) conflicts=$((conflicts + 1)) ;;
	esac
done
echo "answers: $fresh made the payment, $conflicts got 409, $replays got the replay"
ex_check "requests that made the payment" "$fresh" 1
ex_check "the others: 409 or the replay" "$((conflicts + replays))" 7
ex_check "payments for order-3" "$(payments order-3)" 1

echo "== 402: a declined card is a final answer, replayed"
BODY4='{"order_id": "order-4", "amount": 5000000, "currency": "BRL"}'
ex_check "declined" "$(post key-4 "$BODY4" -H 'X-Account-Id: acct-1')" 402
ex_check "retry" "$(post key-4 "$BODY4" -H 'X-Account-Id: acct-1')" 402
ex_check "... is a replay" "$(replayed)" yes
ex_check "payments for order-4" "$(payments order-4)" 0

echo "== keys are scoped by account"
ex_check "key-1 from another account" "$(post key-1 "$BODY" -H 'X-Account-Id: acct-2')" 201
ex_check "... is its own payment" "$(replayed)" no
ex_check "payments for order-1" "$(payments order-1)" 2

echo "== stopping the server"
kill -TERM "$server"
for i in $(seq 1 50); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
ex_check "server stopped" "$(kill -0 "$server" 2>/dev/null && echo running || echo stopped)" stopped
ex_check "payments in all" "$(ex_value "SELECT count(*) FROM payments")" 4
ex_check "records" "$(ex_value "SELECT string_agg(key || ':' || scope || ':' || status || ':' || response_status, ' ' ORDER BY key, scope) FROM idem_keys")" \
	"key-1:acct-1:completed:201 key-1:acct-2:completed:201 key-2:acct-1:completed:201 key-3:acct-1:completed:201 key-4:acct-1:completed:402"
echo "server log:"
sed 's/^/  /' "$tmp/server.log"
ex_finish
