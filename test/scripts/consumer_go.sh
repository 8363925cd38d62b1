#!/usr/bin/env bash
# clients/go's message consumer (package idemamqp, issue 37) against a real
# RabbitMQ (test/scripts/lib/rabbitmq.sh) and a real database: 200 messages,
# 20 of them published twice by the publisher (same message id and body),
# consumed by two consumers at a time (clients/go/demo/consumer, prefetch
# 10, 4 workers each) that crash: SIGKILL of itself after COMMIT before the
# ACK, after the effect before COMMIT, and kill -9 by this script while a
# handler runs; then consumers again until the queue is empty. Checks:
# effects == records == the distinct messages, the queue empty with nothing
# unacked, a poison message (its handler always fails) dead-lettered
# after the queue's delivery limit + 1 tries with no effect and no record,
# and a message without an id and one reusing an id with another body
# (mismatch) rejected into the dead-letter queue, logged.
source test/scripts/lib/examples.sh
source test/scripts/lib/rabbitmq.sh
source test/scripts/lib/go_toolchain.sh

rmq_check || exit 1
ex_database idem_consumer_go
ex_tmpdir
trap 'rc=$?; rmq_stop; (exit $rc); ex_cleanup' EXIT
go_toolchain clients/go
(GO_MODULE_DIR=$PWD/clients/go; source clients/go/goenv.sh; cd clients/go &&
	"$GO_BIN" build -o "$EX_TMP/consumer" ./demo/consumer) || { echo "FAIL: the consumer did not build"; exit 1; }
venv=$(rmq_py_venv) || { echo "FAIL: no virtual environment with pika (rmq_py_venv)"; exit 1; }
publish() { "$venv/bin/python" test/scripts/lib/amqp_tool.py publish "$RMQ_URL" orders "$@" >/dev/null; }

ex_sql -c 'CREATE TABLE consumer_effects (message_id text NOT NULL, body text NOT NULL)'
LIMIT=3
rmq_start
rmq_declare_queue orders "$LIMIT"

ids=() dups=()
for i in $(seq 1 200); do ids+=("$(printf 'm%03d' "$i")"); done
dups=("${ids[@]:0:20}")
publish "${ids[@]}" "${dups[@]}"
ex_check "published" "$(rmq_wait_counts "orders 220 220 0" "orders.dead 0 0 0")" "orders 220 220 0; orders.dead 0 0 0"

# consumer NAME ARG...: one consumer in the background, its pid in PID_NAME
consumer() {
	local name=$1
	shift
	"$EX_TMP/consumer" --url "$RMQ_URL" --queue orders --prefetch 10 --workers 4 "$@" \
		>>"$EX_TMP/$name.log" 2>&1 &
	printf -v "PID_$name" %s $!
	EX_PIDS+=($!)
}
# ended NAME: wait for the consumer; its exit status in RC (not in a
# subshell: only this shell can wait for its children)
ended() {
	local pid=PID_$1
	RC=0
	wait "${!pid}" 2>/dev/null || RC=$?
}

echo "== two consumers: one killed after COMMIT before ACK, one before COMMIT"
consumer a --crash after-commit --crash-at 5
consumer b --crash before-commit --crash-at 7
ended a; ex_check "killed after COMMIT, before its ACK" "$RC" 137
ended b; ex_check "killed before COMMIT" "$RC" 137

echo "== two consumers: one killed (kill -9) in the middle of a handler"
rm -f "$EX_TMP/waiting"
consumer c --crash mid-handler --crash-at 9 --crash-file "$EX_TMP/waiting"
consumer d --idle 2s
for _ in $(seq 1 100); do [ -f "$EX_TMP/waiting" ] && break; sleep 0.1; done
ex_check "a handler is running" "$([ -f "$EX_TMP/waiting" ] && echo yes)" yes
kill -9 "$PID_c"
ended c; ex_check "killed in a handler" "$RC" 137
ended d

echo "== a poison message, a message without an id, one with m001's id and another body; consumers until the queue is empty"
publish poison-1
"$venv/bin/python" - "$RMQ_URL" <<'PY'
import sys, pika
conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
ch = conn.channel()
ch.confirm_delivery()
json = pika.BasicProperties(delivery_mode=2, content_type="application/json")
ch.basic_publish("", "orders", b'{"id": "no-key"}', json, mandatory=True)
json.message_id = "m001"
ch.basic_publish("", "orders", b'{"id": "m001", "other": true}', json, mandatory=True)
conn.close()
PY
for round in 1 2 3; do
	consumer e --idle 2s
	consumer f --idle 2s
	ended e; ex_check "consumer e, round $round" "$RC" 0
	ended f; ex_check "consumer f, round $round" "$RC" 0
	[ "$(rmq_count orders messages)" = 0 ] && break
done

ex_check "the queues: orders empty, nothing unacked; poison, keyless and mismatch dead-lettered" \
	"$(rmq_wait_counts "orders 0 0 0" "orders.dead 3 3 0")" "orders 0 0 0; orders.dead 3 3 0"
ex_check "effects" "$(ex_value 'SELECT count(*) FROM consumer_effects')" 200
ex_check "distinct messages in the effects" "$(ex_value 'SELECT count(DISTINCT message_id) FROM consumer_effects')" 200
ex_check "records" "$(ex_value "SELECT count(*) FROM idem_keys WHERE operation = 'ship-orders' AND status = 'completed'")" 200
ex_check "records not completed" "$(ex_value "SELECT count(*) FROM idem_keys WHERE status <> 'completed'")" 0
ex_check "the poison message's effects and record" \
	"$(ex_value "SELECT (SELECT count(*) FROM consumer_effects WHERE message_id LIKE 'poison%') + (SELECT count(*) FROM idem_keys WHERE key LIKE 'poison%')")" 0
ex_check "the poison message's tries (the delivery limit + 1)" \
	"$(cat "$EX_TMP"/e.log "$EX_TMP"/f.log | grep -c 'the handler failed, requeued.*key=poison-1' || true)" $((LIMIT + 1))
ex_check "deliveries rejected without a key" \
	"$(cat "$EX_TMP"/*.log | grep -c 'a message without a key, rejected' || true)" 1
ex_check "deliveries rejected for a mismatch (m001)" \
	"$(cat "$EX_TMP"/*.log | grep -c 'another message, rejected.*key=m001' || true)" 1
ex_finish
