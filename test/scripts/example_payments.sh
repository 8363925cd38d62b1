#!/usr/bin/env bash
# examples/payments: the one-transaction payment flow.  Runs the walkthrough,
# then a concurrent retry (409 while the first is open, then its replay) and
# a client killed mid-transaction (nothing kept, the retry pays once), and
# counts the payments in the database.
source test/scripts/lib/examples.sh
ex_database idem_example_payments
ex_sql -f examples/payments/payments.sql
ex_sql -f examples/payments/demo.sql

echo "== the walkthrough's effects"
ex_check "payments for order-842 (account 1, account 2)" \
	"$(ex_value "SELECT count(*) FROM payments WHERE order_id = 'order-842'")" 2
ex_check "payments for the declined order-900" \
	"$(ex_value "SELECT count(*) FROM payments WHERE order_id = 'order-900'")" 0
ex_check "payments for order-901 (rolled back once, then paid)" \
	"$(ex_value "SELECT count(*) FROM payments WHERE order_id = 'order-901'")" 1
ex_check "payments for order-77 (idem_call twice)" \
	"$(ex_value "SELECT count(*) FROM payments WHERE order_id = 'order-77'")" 1
ex_check "replayed status of the declined card" \
	"$(ex_value "SELECT http_status FROM create_payment('6f1c1a52-1b5e-4a4e-9b1f-3c2f0d7a9e10', 'a1d0c6e8-3f5b-4d2a-9c7e-2b8f1e0d4c3a', '{\"order_id\": \"order-900\", \"amount\": 5000000, \"currency\": \"BRL\"}')")" 402
ex_check "records, all completed" \
	"$(ex_value "SELECT string_agg(status || ':' || response_status, ',' ORDER BY response_status) FROM idem_keys")" \
	"completed:200,completed:201,completed:201,completed:201,completed:402"

ACCOUNT=6f1c1a52-1b5e-4a4e-9b1f-3c2f0d7a9e10
REQ='{"order_id": "order-950", "amount": 700, "currency": "BRL"}'
CALL="SELECT http_status || ' ' || body FROM create_payment('$ACCOUNT', 'slow-950', '$REQ')"

echo "== a retry while the first attempt's transaction is still open"
ex_tmpdir
out=$EX_TMP/slow.out
PGAPPNAME=payments-slow psql -X -q -t -A -v ON_ERROR_STOP=1 \
	-c "BEGIN" -c "$CALL" -c "SELECT pg_sleep(2)" -c "COMMIT" >"$out" &
EX_PIDS+=($!)
ex_wait_for "the slow attempt to hold its key" \
	"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'payments-slow' AND wait_event = 'PgSleep')"
ex_check "retry during the first attempt" "$(ex_value "$CALL")" '409 {"error": "request in_progress"}'
wait "${EX_PIDS[-1]}"
first=$(head -1 "$out")
ex_check "first attempt" "${first%% *}" 201
ex_check "retry after it committed replays its answer" "$(ex_value "$CALL")" "$first"
ex_check "payments for order-950" \
	"$(ex_value "SELECT count(*) FROM payments WHERE order_id = 'order-950'")" 1

echo "== the client is killed in the middle of its transaction"
REQ='{"order_id": "order-960", "amount": 800, "currency": "BRL"}'
CALL="SELECT http_status FROM create_payment('$ACCOUNT', 'crash-960', '$REQ')"
# client_connection_check_interval lets the server notice the dead client
# during pg_sleep; without it the transaction would end when the sleep does
PGAPPNAME=payments-crash PGOPTIONS='-c client_connection_check_interval=100ms' \
	psql -X -q -t -A -c "BEGIN" -c "$CALL" -c "SELECT pg_sleep(60)" -c "COMMIT" >/dev/null 2>&1 &
crash_pid=$!
EX_PIDS+=($crash_pid)
ex_wait_for "the doomed attempt to hold its key" \
	"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'payments-crash' AND wait_event = 'PgSleep')"
kill -KILL "$crash_pid"
wait "$crash_pid" 2>/dev/null || true
ex_wait_for "the server to end the dead client's session" \
	"SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = 'payments-crash')"
ex_check "records of the killed attempt" \
	"$(ex_value "SELECT count(*) FROM idem_keys WHERE key = 'crash-960'")" 0
ex_check "the retry pays" "$(ex_value "$CALL")" 201
ex_check "a second retry replays" "$(ex_value "$CALL")" 201
ex_check "payments for order-960" \
	"$(ex_value "SELECT count(*) FROM payments WHERE order_id = 'order-960'")" 1

ex_check "payments in all" "$(ex_value "SELECT count(*) FROM payments")" 6
ex_finish
