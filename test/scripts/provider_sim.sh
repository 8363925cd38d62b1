#!/usr/bin/env bash
# The payment provider simulator's own test (test/provider/provider.py, the
# provider the client libraries' phase tests call): every behaviour they
# rely on, over real HTTP with curl, counted at the provider.  De-duplication
# by Idempotency-Key (201, then the first charge again with 200 and
# Idempotent-Replayed), 422 for another body, 409 while the first request
# runs, 20 concurrent requests with one key making one charge, each fault
# (a lost answer, then a retry that gets the same charge; 500 before the
# charge; 503 after it; a slow answer a client gives up on), lookups by
# reference and id, a restart and a kill -9 that keep the charges, and the
# counts of GET /stats.
source test/scripts/lib/examples.sh
source test/scripts/lib/provider.sh

for tool in curl "$PROV_PYTHON"; do
	command -v "$tool" >/dev/null || { echo "skipped: $tool is not installed"; exit 77; }
done

tmp=$(mktemp -d)
trap 'rc=$?; prov_kill; rm -rf "$tmp"; exit $rc' EXIT
state=$tmp/provider

# charge NAME KEY AMOUNT REFERENCE [CURL ARG...]: POST /charges (no
# Idempotency-Key when KEY is -); prints the status, keeps the body in
# $tmp/NAME.body, the headers in $tmp/NAME.head, curl's exit status in $tmp/NAME.rc
charge() {
	local name=$1 key=$2 amount=$3 ref=$4 rc=0
	shift 4
	local hdr=()
	[ "$key" = - ] || hdr=(-H "Idempotency-Key: $key")
	: >"$tmp/$name.body"
	curl -s -o "$tmp/$name.body" -D "$tmp/$name.head" -w '%{http_code}\n' "${hdr[@]}" "$@" \
		-H 'Content-Type: application/json' -X POST "$PROV_URL/charges" \
		-d "{\"amount\": $amount, \"currency\": \"eur\", \"reference\": \"$ref\"}" || rc=$?
	echo "$rc" >"$tmp/$name.rc"
}
field() { prov_json "j['$2']" <"$tmp/$1.body"; }
replayed() { tr -d '\r' <"$tmp/$1.head" | sed -n 's/^Idempotent-Replayed: //Ip'; }

prov_start "$state"
echo "== provider at $PROV_URL (pid $PROV_PID)"

echo "== de-duplication by Idempotency-Key"
ex_check "a new key charges" "$(charge a k-1 500 order-1)" 201
id1=$(field a id)
ex_check "the charge" "$(field a amount) $(field a currency) $(field a reference) $(field a idempotency_key) $(field a status)" \
	"500 eur order-1 k-1 succeeded"
ex_check "the same key and body: 200" "$(charge b k-1 500 order-1)" 200
ex_check "... the first charge again" "$(field b id)" "$id1"
ex_check "... marked as a replay" "$(replayed b)" true
ex_check "a new charge is not marked" "$(replayed a)" ""
ex_check "the same key with another amount: 422" "$(charge c k-1 600 order-1)" 422
ex_check "... its error" "$(field c error)" idempotency_key_mismatch
ex_check "the same key with another reference: 422" "$(charge c k-1 500 order-9)" 422
ex_check "charges for order-1" "$(prov_charges order-1)" 1
ex_check "no key: every request charges" "$(charge d - 700 order-nokey) $(charge d - 700 order-nokey)" "201 201"
ex_check "charges for order-nokey" "$(prov_charges order-nokey)" 2

echo "== bad requests"
ex_check "a body that is not JSON: 400" \
	"$(curl -s -o /dev/null -w '%{http_code}' -X POST "$PROV_URL/charges" -d 'nope')" 400
ex_check "a missing field: 400" \
	"$(curl -s -o /dev/null -w '%{http_code}' -X POST "$PROV_URL/charges" -d '{"amount": 1, "currency": "eur"}')" 400
ex_check "an amount of 0: 400" "$(charge e k-bad 0 order-bad)" 400
ex_check "... and the key stays free" "$(charge e k-bad 1 order-bad)" 201
ex_check "an Idempotency-Key of 256 characters: 400" \
	"$(charge e "$(printf 'k%.0s' $(seq 256))" 1 order-longkey) $(field e error)" "400 invalid_idempotency_key"
ex_check "... of 255: 201" "$(charge e "$(printf 'k%.0s' $(seq 255))" 1 order-longkey)" 201
ex_check "an unknown fault action: 400" \
	"$(curl -s -o /dev/null -w '%{http_code}' -X POST "$PROV_URL/faults" -d '{"action": "explode"}')" 400
ex_check "an unknown endpoint: 404" "$(curl -s -o /dev/null -w '%{http_code}' "$PROV_URL/refunds")" 404

echo "== a key in use: 409 while the first request runs"
before=$(prov_stat requests)
charge f k-busy 800 order-busy -H 'Simulate-Delay-Ms: 1500' >"$tmp/f.status" &
slow=$!
wait_requests() {
	local i
	for i in $(seq 1 50); do
		[ "$(prov_stat requests)" -ge "$1" ] && return 0
		sleep 0.05
	done
	echo "FAIL: the provider never saw request $1"
	EX_FAILED=1
}
wait_requests $((before + 1))
ex_check "the same key meanwhile: 409" "$(charge g k-busy 800 order-busy)" 409
ex_check "... its error" "$(field g error)" idempotency_key_in_use
ex_check "... and nothing charged yet" "$(prov_charges order-busy)" 0
wait "$slow"
ex_check "the first request, slow: 201" "$(cat "$tmp/f.status")" 201
ex_check "the same key after it: the same charge" "$(charge h k-busy 800 order-busy) $(field h id)" \
	"200 $(field f id)"

echo "== 20 concurrent requests with one key: one charge"
# (wait for the curls by pid: a bare wait would wait for the provider too)
pids=()
for n in $(seq 1 20); do
	charge "storm-$n" k-storm 900 order-storm >"$tmp/storm-$n.status" &
	pids+=($!)
done
wait "${pids[@]}"
statuses=$(cat "$tmp"/storm-*.status | sort | uniq -c | awk '{print $2 "x" $1}' | tr '\n' ' ')
echo "statuses: $statuses"
ex_check "one 201 among them" "$(cat "$tmp"/storm-*.status | grep -c 201)" 1
ex_check "the others 200 or 409" "$(cat "$tmp"/storm-*.status | grep -cE '^(200|409)$')" 19
ex_check "every 200 is the one charge" \
	"$(for n in $(seq 1 20); do [ "$(cat "$tmp/storm-$n.status")" = 409 ] || field "storm-$n" id; done | sort -u | wc -l)" 1
ex_check "charges for order-storm" "$(prov_charges order-storm)" 1
# and 20 more while the first of them is held for 3 s at the provider:
# every one of them 409
before=$(prov_stat requests)
charge slow-0 k-slow-storm 900 order-slow-storm -H 'Simulate-Delay-Ms: 3000' >"$tmp/slow-0.status" &
held=$!
wait_requests $((before + 1))
pids=()
for n in $(seq 1 20); do
	charge "slow-$n" k-slow-storm 900 order-slow-storm >"$tmp/slow-$n.status" &
	pids+=($!)
done
wait "${pids[@]}"
ex_check "held storm: all 409" "$(cat "$tmp"/slow-{1..20}.status | grep -c 409)" 20
wait "$held"
ex_check "held storm: the held request 201" "$(cat "$tmp/slow-0.status")" 201
ex_check "charges for order-slow-storm" "$(prov_charges order-slow-storm)" 1

echo "== faults"
# a lost answer: the provider charges, then closes the connection
curl -sf -o /dev/null -X POST "$PROV_URL/faults" -d '{"action": "lose-answer", "reference": "order-lost"}'
charge i k-lost 1000 order-lost >/dev/null
ex_check "lose-answer: no answer (curl: empty reply)" "$(cat "$tmp/i.rc") $(wc -c <"$tmp/i.body")" "52 0"
lost_id=$(curl -sf "$PROV_URL/charges?reference=order-lost" | prov_json 'j["data"][0]["id"]')
ex_check "... but it charged (found by reference)" "$(prov_charges order-lost)" 1
ex_check "... the retry with the same key gets that charge" "$(charge j k-lost 1000 order-lost) $(field j id)" \
	"200 $lost_id"
ex_check "... the rule was used once" "$(curl -sf "$PROV_URL/faults" | prov_json 'len(j["data"])')" 0
# the same fault by request header
charge k k-lost-h 1000 order-lost-h -H 'Simulate-Fault: lose-answer' >/dev/null
ex_check "lose-answer by header" "$(cat "$tmp/k.rc") $(prov_charges order-lost-h)" "52 1"
# 500 before charging: nothing charged, the key is free again
curl -sf -o /dev/null -X POST "$PROV_URL/faults" -d '{"action": "fail-before", "key": "k-500", "times": 2}'
ex_check "fail-before: 500" "$(charge l k-500 1100 order-500)" 500
ex_check "... nothing charged" "$(prov_charges order-500)" 0
ex_check "... twice (times: 2)" "$(charge l k-500 1100 order-500) $(prov_charges order-500)" "500 0"
ex_check "... the third try charges" "$(charge l k-500 1100 order-500)" 201
ex_check "... once" "$(prov_charges order-500)" 1
# 503 after charging: charged, and a retry replays it
ex_check "fail-after: 503" "$(charge m k-503 1200 order-503 -H 'Simulate-Fault: fail-after')" 503
ex_check "... but charged" "$(prov_charges order-503)" 1
ex_check "... the retry replays that charge" \
	"$(charge n k-503 1200 order-503) $(field n id)" \
	"200 $(curl -sf "$PROV_URL/charges?reference=order-503" | prov_json 'j["data"][0]["id"]')"
# slow before the charge: the answer comes after the delay
t0=$(date +%s%N)
ex_check "Simulate-Delay-Ms: 800: 201" "$(charge o k-slow 1300 order-slow -H 'Simulate-Delay-Ms: 800')" 201
ms=$((($(date +%s%N) - t0) / 1000000))
ex_check "... after at least 800 ms" "$([ "$ms" -ge 800 ] && echo yes || echo "no: $ms ms")" yes
# slow after the charge: a client that gives up has been charged all the same
curl -sf -o /dev/null -X POST "$PROV_URL/faults" -d '{"delay_after_ms": 1500, "reference": "order-late"}'
charge p k-late 1400 order-late --max-time 0.5 >/dev/null
ex_check "delay_after_ms: the client timed out (curl 28)" "$(cat "$tmp/p.rc")" 28
ex_check "... and was charged" "$(prov_charges order-late)" 1
ex_check "... its retry gets that charge" "$(charge q k-late 1400 order-late) $(replayed q)" "200 true"
# a rule matches only its reference
curl -sf -o /dev/null -X POST "$PROV_URL/faults" -d '{"action": "fail-before", "reference": "order-other"}'
ex_check "a rule for another reference leaves this one alone" "$(charge r k-unrelated 1 order-unrelated)" 201
ex_check "DELETE /faults clears the rules" \
	"$(curl -sf -X DELETE "$PROV_URL/faults" | prov_json 'len(j["data"])') $(charge r k-other 1 order-other)" "0 201"

echo "== lookups"
ex_check "GET /charges/ID" "$(curl -sf "$PROV_URL/charges/$id1" | prov_json 'j["reference"]')" order-1
ex_check "GET /charges/unknown: 404" "$(curl -s -o /dev/null -w '%{http_code}' "$PROV_URL/charges/ch_nope")" 404
ex_check "GET /charges?idempotency_key=k-1" \
	"$(curl -sf "$PROV_URL/charges?idempotency_key=k-1" | prov_json '[c["id"] for c in j["data"]]')" "[\"$id1\"]"
ex_check "GET /charges?reference=order-none" "$(prov_charges order-none)" 0

echo "== the counts"
# the charges made above (a, d twice, e twice, f, i, k, l, m, o, p, r twice and
# one in each storm), the replays (b, h, j, n, q and the storms' 200s), the
# 409s (g and the storms'), the 422s (c twice), the faults applied (f, i, k,
# l twice, m, o, p and one in the held storm), and the requests: the 18 that
# charged or failed, and those replays, 409s and 422s (a 400 is not counted)
storm200=$(cat "$tmp"/storm-*.status "$tmp"/slow-*.status | grep -c 200 || true)
storm409=$(cat "$tmp"/storm-*.status "$tmp"/slow-*.status | grep -c 409 || true)
all=$(curl -sf "$PROV_URL/charges" | prov_json 'j["count"]')
ex_check "charges: the number listed" "$(prov_stat charges)" "$all"
ex_check "charges: the number made above" "$all" 16
ex_check "replays" "$(prov_stat replays)" $((5 + storm200))
ex_check "conflicts" "$(prov_stat conflicts)" $((1 + storm409))
ex_check "mismatches" "$(prov_stat mismatches)" 2
ex_check "faults applied" "$(prov_stat faults)" 9
ex_check "requests" "$(prov_stat requests)" $((18 + 5 + storm200 + 1 + storm409 + 2))
stats=$(curl -sf "$PROV_URL/stats")

echo "== a restart keeps the charges, the keys and the counts"
prov_stop
ex_check "stopped" "$(curl -s -o /dev/null -w '%{http_code}' "$PROV_URL/health" || true)" 000
prov_start "$state"
ex_check "the counts after a restart" "$(curl -sf "$PROV_URL/stats")" "$stats"
ex_check "charges for order-1" "$(prov_charges order-1)" 1
ex_check "k-1 replays its charge" "$(charge s k-1 500 order-1) $(field s id)" "200 $id1"
ex_check "k-1 with another body: 422" "$(charge s k-1 501 order-1)" 422
ex_check "a new key charges" "$(charge t k-after 1 order-after)" 201
url=$PROV_URL
prov_restart --kill
ex_check "kill -9 and a restart on the same port" "$PROV_URL" "$url"
ex_check "after kill -9: the charge made just before" "$(prov_charges order-after)" 1
ex_check "... and its key" "$(charge u k-after 1 order-after) $(field u id)" "200 $(field t id)"
ex_check "charges" "$(prov_stat charges)" 17
ex_check "POST /reset" "$(curl -sf -X POST "$PROV_URL/reset" >/dev/null; prov_stat charges) $(prov_charges order-1)" "0 0"

echo "provider_sim took $SECONDS s"
ex_finish
