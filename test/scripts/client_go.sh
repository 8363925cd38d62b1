#!/usr/bin/env bash
# clients/go (pgx v5, net/http middleware): the package's own tests
# (clients/go/test.sh: httptest, go vet), then its demo app (chi,
# clients/go/demo) through the HTTP contract of doc/clients.md
# (test/scripts/lib/http_contract.sh), and again on a read-only database;
# then the demo's connection ended by the server under a request in flight
# (go_connection_lost, Go's own until the contract has it). The Go
# toolchain: test/scripts/lib/go_toolchain.sh.
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
source test/scripts/lib/go_toolchain.sh

# go_connection_lost: the server ends the demo's connection while a payment
# waits between its INSERT and its COMMIT (X-Simulated-Latency-Ms): the
# request is 503 unavailable with Retry-After, nothing is kept, the demo
# lives on, and the retry makes the payment once
go_connection_lost() {
	local body='{"order_id": "order-lost", "amount": 700, "currency": "EUR"}' client
	echo "== 503: the database connection lost under a request in flight"
	hc_restart || return 1
	curl -sS -o "$HC_TMP/lost-body" -D "$HC_TMP/lost-headers" -w '%{http_code}' --max-time 30 -X POST \
		-H 'Content-Type: application/json' -H 'Authorization: Bearer token-a' \
		-H 'Idempotency-Key: "key-lost"' -H 'X-Simulated-Latency-Ms: 3000' \
		--data "$body" "$HC_URL/payments" >"$HC_TMP/lost-status" &
	client=$!
	ex_wait_for "the payment to wait before its COMMIT" "SELECT EXISTS (SELECT FROM pg_locks l
		JOIN pg_stat_activity a USING (pid) WHERE a.usename = 'idem_demo_app'
		AND a.state = 'idle in transaction' AND l.relation = 'payments'::regclass)" || true
	ex_check "the demo's backend ended" "$(ex_value "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))
		FROM pg_stat_activity WHERE usename = 'idem_demo_app' AND state = 'idle in transaction'")" 1
	wait "$client" || true
	cp "$HC_TMP/lost-body" "$HC_TMP/body"
	cp "$HC_TMP/lost-headers" "$HC_TMP/headers"
	cp "$HC_TMP/lost-status" "$HC_TMP/status"
	ex_check "the request in flight" "$(cat "$HC_TMP/status")" 503
	hc_problem unavailable 1
	ex_check "payments for order-lost" "$(hc_payments order-lost)" 0
	ex_check "records for key-lost" "$(hc_records key-lost)" 0
	ex_check "the demo lives on" "$(kill -0 "$HC_SERVER" 2>/dev/null && echo running || echo gone)" running
	ex_check "the retry" "$(hc_post token-a '"key-lost"' "$body")" 201
	ex_check "... is new, not a replay" "$(hc_header Idempotent-Replayed)" ""
	ex_check "payments for order-lost" "$(hc_payments order-lost)" 1
	hc_stop
}

hc_setup go
go_toolchain "$(hc_client_dir go)"
hc_package_tests go
hc_start go
hc_contract
hc_stop
hc_read_only
hc_shallow_stack
go_connection_lost
ex_finish
