#!/usr/bin/env bash
# One record, four languages: the demo apps of clients/python, node, go
# and java against one database.  A payment made through each demo is
# replayed through each of the other three (status, Location, media type,
# body, Idempotent-Replayed), a declined card written by Python too, and
# the key reused with another amount is 422 in every language: the request
# document (the fingerprint) and the response envelope of doc/clients.md are
# the same in all.  Then records written by plain SQL: a response without
# "v" replays as a JSON body, a non-JSON body stored as body_base64 replays
# as its bytes with its media type, and an envelope of a higher version is
# 500 unsupported-envelope, in every language.  Payments are counted in the
# database.
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
source test/scripts/lib/go_toolchain.sh
hc_setup cross
go_toolchain "$(hc_client_dir go)"
hc_tcp
LANGS=(python node go java)
declare -A URL PID
for lang in "${LANGS[@]}"; do
	hc_start "$lang" || ex_finish || exit 1
	URL[$lang]=$HC_URL
	PID[$lang]=$HC_SERVER
done

# on LANGUAGE: the next requests go to that language's demo
on() {
	HC_URL=${URL[$1]} HC_SERVER=${PID[$1]} HC_LANG=$1
}

echo "== a payment made through each demo replays through the other three"
n=0
for w in "${LANGS[@]}"; do
	n=$((n + 1))
	body="{\"order_id\": \"cross-$w\", \"amount\": $((n * 1000)), \"currency\": \"EUR\"}"
	on "$w"
	ex_check "$w: POST cross-$w" "$(hc_post token-a "\"cross-$w\"" "$body")" 201
	hc_keep "cross-$w"
	for r in "${LANGS[@]}"; do
		[ "$r" = "$w" ] && continue
		on "$r"
		hc_post token-a "cross-$w" "$body" >/dev/null
		hc_replayed "$w's record through $r" "cross-$w"
		ex_check "$w's record through $r, another amount" \
			"$(hc_post token-a "cross-$w" "{\"order_id\": \"cross-$w\", \"amount\": 1, \"currency\": \"EUR\"}")" 422
		ex_check "... problem code" "$(hc_json code)" mismatch
		ex_check "$w's record through $r, as user B" "$(hc_get token-b "$(hc_header Location "$HC_TMP/cross-$w.headers")")" 404
	done
	ex_check "payments for cross-$w" "$(hc_payments "cross-$w")" 1
done

echo "== a declined card written through Python replays as a problem everywhere"
body='{"order_id": "cross-402", "amount": 2000000, "currency": "EUR"}'
on python
ex_check "python: declined" "$(hc_post token-a cross-402 "$body")" 402
hc_keep cross-402
for r in node go java; do
	on "$r"
	hc_post token-a cross-402 "$body" >/dev/null
	hc_replayed "python's 402 through $r" cross-402
	ex_check "... problem code" "$(hc_json code)" card-declined
done
ex_check "payments for cross-402" "$(hc_payments cross-402)" 1

echo "== records completed by plain SQL"
# sql_record KEY RESPONSE STATUS: a record of create-payment for acct-a's KEY
# and the body {"order_id": KEY, "amount": 1, "currency": "EUR"}
sql_record() {
	local doc
	doc=$(hc_request_doc "{\"order_id\": \"$1\", \"amount\": 1, \"currency\": \"EUR\"}")
	ex_sql -c "BEGIN" \
		-c "SELECT outcome FROM idem_reserve('create-payment', '$1', '$doc', scope => 'acct-a')" \
		-c "SELECT idem_complete('create-payment', '$1', '$2', $3, scope => 'acct-a')" \
		-c "COMMIT" >/dev/null
}
sql_record sql-plain '{"id": 7, "status": "paid", "by": "SQL"}' 201
sql_record sql-text '{"v": 1, "headers": {"content-type": "text/plain; charset=utf-8", "location": "/payments/7"}, "body_base64": "cGFpZCwgYnkgU1FMCg=="}' 200
sql_record sql-v2 '{"v": 2, "headers": {}, "body": {"id": 7}}' 201
for r in "${LANGS[@]}"; do
	on "$r"
	ex_check "$r: a response without \"v\"" \
		"$(hc_post token-a sql-plain '{"order_id": "sql-plain", "amount": 1, "currency": "EUR"}')" 201
	ex_check "... Idempotent-Replayed" "$(hc_header Idempotent-Replayed)" true
	ex_check "... a JSON body" "$(hc_media):$(hc_canon)" 'application/json:{"by":"SQL","id":7,"status":"paid"}'
	ex_check "$r: a body_base64 envelope" \
		"$(hc_post token-a sql-text '{"order_id": "sql-text", "amount": 1, "currency": "EUR"}')" 200
	# Tomcat (Java) respells the parameters: text/plain;charset=utf-8
	ex_check "... its headers" "$(hc_header Content-Type | sed 's/; */;/g' | tr 'A-Z' 'a-z') $(hc_header Location)" \
		"text/plain;charset=utf-8 /payments/7"
	ex_check "... its bytes" "$(base64 -w0 "$HC_TMP/body")" cGFpZCwgYnkgU1FMCg==
	ex_check "$r: an envelope of version 2" \
		"$(hc_post token-a sql-v2 '{"order_id": "sql-v2", "amount": 1, "currency": "EUR"}')" 500
	hc_problem unsupported-envelope
done

ex_check "payments in all" "$(ex_value "SELECT count(*) FROM payments")" 5
ex_check "records" "$(ex_value "SELECT string_agg(key || ':' || status || ':' || response_status, ' ' ORDER BY key) FROM idem_keys")" \
	"cross-402:completed:402 cross-go:completed:201 cross-java:completed:201 cross-node:completed:201 cross-python:completed:201 sql-plain:completed:201 sql-text:completed:200 sql-v2:completed:201"
for lang in "${LANGS[@]}"; do
	on "$lang"
	hc_stop
done
ex_finish
