#!/usr/bin/env bash
# examples/gateway: a gateway call in two phases with recovery points.  Three
# clients are killed at different points (before the gateway call, after it
# charged, after the charge was recorded as a recovery point); their retries
# get 409 until the reconciler (registered with idem_set_reconciler and run
# by idem_maintain, one pass as the background worker makes it), asking the
# gateway, settles each key; then
# every order is charged exactly once and has exactly one payment row.  A
# fourth key with two charges at the gateway is left stuck for a human,
# without stopping the reconciliation of the others.
source test/scripts/lib/examples.sh
ex_database idem_example_gateway
ex_sql -f examples/gateway/gateway.sql
# A short timeout for the demonstration (the default is 5 minutes)
ex_sql -c "ALTER DATABASE idem_example_gateway SET idempotency.processing_timeout = '5s'"
# The example's reconciler runs as the superuser loading it, which the
# operator must allow (doc/security.md: give it a role of its own instead)
ex_sql -c "ALTER DATABASE idem_example_gateway SET idempotency.enable_superuser_reconcilers = on"

client=examples/gateway/client.sh
charges() { ex_value "SELECT count(*) FROM gateway.charges WHERE reference = '$1'"; }
payments() { ex_value "SELECT count(*) FROM payments WHERE order_id = '$1'"; }

echo "== a client that completes"
first=$(bash $client key-1 order-1 1000)
echo "$first"
ex_check "first attempt" "${first%% *}" 201
ex_check "retry replays the answer" "$(bash $client key-1 order-1 1000)" "$first"
ex_check "retry with another amount" "$(bash $client key-1 order-1 2000 | cut -d' ' -f1)" 422
ex_check "charges for key-1" "$(charges key-1)" 1

echo "== clients killed between phases"
for spec in "key-2 order-2 after-gateway" "key-3 order-3 before-gateway" "key-4 order-4 after-checkpoint"; do
	set -- $spec
	# the subshell reaps the killed client, so bash's "Killed" notice stays quiet
	rc=$( (bash $client "$1" "$2" 500 "$3" >/dev/null 2>&1; echo $?) 2>/dev/null )
	ex_check "client $1 killed $3 (exit status)" "$rc" 137
done
ex_check "charges made by the killed clients (key-2, key-4)" \
	"$(ex_value "SELECT string_agg(reference, ',' ORDER BY reference) FROM gateway.charges WHERE reference <> 'key-1'")" \
	"key-2,key-4"
ex_check "their records" \
	"$(ex_value "SELECT string_agg(key || ':' || status || ':' || recovery_point, ',' ORDER BY key) FROM idem_keys WHERE key NOT IN ('key-1')")" \
	"$(printf 'key-2:processing:calling-gateway,key-3:processing:calling-gateway,key-4:processing:charged:%s' \
		"$(ex_value "SELECT id FROM gateway.charges WHERE reference = 'key-4'")")"

# A fifth client died after charging, and something else charged its
# reference again: the reconciler must not guess, and must not stop the others
rc=$( (bash $client key-5 order-5 500 after-gateway >/dev/null 2>&1; echo $?) 2>/dev/null )
ex_check "client key-5 killed after-gateway (exit status)" "$rc" 137
ex_value "SELECT gateway.charge('key-5', 'order-5', 500)" >/dev/null

echo "== retries before the reconciler: 409, and no second charge"
ex_check "retry of key-2 at once" "$(bash $client key-2 order-2 500)" \
	'409 {"error": "in_progress"}'
ex_check "reconciler before the timeout (nothing is stuck yet)" \
	"$(ex_value "SELECT count(*) FROM reconcile_stuck_charges()")" 0
ex_wait_for "the killed clients' records to pass the timeout" \
	"SELECT bool_and(updated_at < now() - interval '5s') FROM idem_keys WHERE status = 'processing'"
ex_check "retry of key-2 after the timeout" "$(bash $client key-2 order-2 500)" \
	'409 {"error": "stuck", "recovery_point": "calling-gateway"}'
ex_check "charges for key-2" "$(charges key-2)" 1

echo "== the registered reconciler asks the gateway, in one pass as the worker runs it"
ex_sql -c "SELECT idem_set_reconciler('charge-card', 'reconcile_charge(idem_keys)')"
ex_sql -c "CALL idem_maintain()" 2>&1 | sed 's/^/   /'
ex_check "records after reconciliation" \
	"$(ex_value "SELECT string_agg(key || ':' || status, ',' ORDER BY key) FROM idem_keys")" \
	"key-1:completed,key-2:completed,key-4:completed,key-5:stuck"
ex_check "reconciler again (only the one for a human is left)" \
	"$(ex_value "SELECT string_agg(key || ': ' || resolution, ',') FROM reconcile_stuck_charges()")" \
	"key-5: left stuck: key key-5 has 2 charges at the gateway; refund by hand"
ex_check "retry of key-5" "$(bash $client key-5 order-5 500)" \
	'409 {"error": "stuck", "recovery_point": "calling-gateway"}'
ex_check "charges for key-5 (no third)" "$(charges key-5)" 2

echo "== retries after reconciliation"
r2=$(bash $client key-2 order-2 500)
echo "$r2"
charge2=$(ex_value "SELECT id FROM gateway.charges WHERE reference = 'key-2'")
ex_check "key-2 replays the reconciled payment, with the gateway's charge" \
	"$(sed -n "s/^\(201\) .*\"charge\": \"\($charge2\)\".*/\1 \2/p" <<<"$r2")" "201 $charge2"
r3=$(bash $client key-3 order-3 500)
echo "$r3"
ex_check "key-3 (released) charges now" "${r3%% *}" 201
ex_check "key-3 retried again replays" "$(bash $client key-3 order-3 500)" "$r3"
ex_check "key-4 replays" "$(bash $client key-4 order-4 500 | cut -d' ' -f1)" 201

echo "== every order charged once, with one payment"
for n in 1 2 3 4; do
	ex_check "charges for key-$n" "$(charges key-$n)" 1
	ex_check "payments for order-$n" "$(payments order-$n)" 1
done
ex_check "payments for order-5 (for a human to settle)" "$(payments order-5)" 0
ex_check "payments match charges" \
	"$(ex_value "SELECT count(*) FROM payments p JOIN gateway.charges c ON c.id = p.charge_id AND c.amount = p.amount AND c.order_id = p.order_id")" 4
ex_finish
