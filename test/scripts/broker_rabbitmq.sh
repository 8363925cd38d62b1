#!/usr/bin/env bash
# The throwaway RabbitMQ node of test/scripts/lib/rabbitmq.sh, which the
# client libraries' consumer tests use (issue 37): it starts as this user on
# loopback, declares a quorum queue with a delivery limit and a dead-letter
# queue, and carries messages for a real AMQP client (pika,
# test/scripts/lib/amqp_tool.py): acked messages are gone, a consumer killed
# with -9 gives its unacked messages back (redelivered, with
# x-delivery-count 1), a poison message nacked every time ends in the
# dead-letter queue after the configured tries, the counts of list_queues
# say so, a second node started beside it (and a start that fails in a
# subshell) does not disturb it, and rmq_stop leaves
# no process, port or file behind.  Fails (does not skip) when Debian's
# rabbitmq-server is not installed.
source test/scripts/lib/examples.sh
source test/scripts/lib/rabbitmq.sh

rmq_check || exit 1
tmp=$(mktemp -d)
second=
trap 'rc=$?; [ -z "$second" ] || wait "$second"; rmq_stop; rm -rf "$tmp"; exit $rc' EXIT

venv=$(rmq_py_venv) || { echo "FAIL: no virtual environment with pika (rmq_py_venv)"; exit 1; }
tool() { "$venv/bin/python" test/scripts/lib/amqp_tool.py "$@"; }
echo "== pika $("$venv/bin/python" -c 'import pika; print(pika.__version__)'), $(dpkg-query -W -f '${Package} ${Version}' rabbitmq-server 2>/dev/null)"

rmq_start
# A second node, in a subshell (its RMQ_* variables are its own), starting
# while this one works: neither may disturb the other
(
	trap 'rmq_stop; echo "second stopped"' EXIT
	rmq_start
	tool publish --declare "$RMQ_URL" other x1
	tool consume "$RMQ_URL" other --idle 1
) >"$tmp/second.out" 2>&1 &
second=$!
# every socket the node and its epmd listen on is on loopback
if command -v ss >/dev/null; then
	for port in "$RMQ_PORT" "$RMQ_DIST_PORT" "$RMQ_EPMD_PORT"; do
		ex_check "port $port listens on loopback only" \
			"$(ss -ltnH "sport = :$port" | awk '{print $4}' | grep -vcE '^(127\.0\.0\.1|\[::1\]):' || true)" 0
	done
fi

echo "== publish and consume"
rmq_declare_queue selftest 2
ex_check "declared" "$(rmq_ctl -q list_queues name type arguments | grep -P '^selftest\t' | cut -f2-)" \
	'quorum	[{"x-dead-letter-exchange","selftest.dlx"},{"x-delivery-limit",2},{"x-queue-type","quorum"}]'
tool publish "$RMQ_URL" selftest m1 m2 m3 m2
ex_check "messages in the queue" "$(rmq_wait_counts "selftest 4 4 0" "selftest.dead 0 0 0")" \
	"selftest 4 4 0; selftest.dead 0 0 0"
tool consume "$RMQ_URL" selftest --idle 1 >"$tmp/c1.out"
cat "$tmp/c1.out"
ex_check "consumed, each acked" "$(sort "$tmp/c1.out" | tr '\n' ',')" \
	"delivery m1 redelivered=False count=0,delivery m2 redelivered=False count=0,delivery m2 redelivered=False count=0,delivery m3 redelivered=False count=0,"

echo "== a consumer killed with messages unacked gives them back"
tool publish "$RMQ_URL" selftest k1 k2 k3
# python itself in the background, not a function's subshell, so that
# kill -9 kills the consumer
"$venv/bin/python" test/scripts/lib/amqp_tool.py consume "$RMQ_URL" selftest --hold --prefetch 3 \
	>"$tmp/held.out" 2>&1 &
held=$!
for i in $(seq 1 100); do
	grep -q '^holding 3' "$tmp/held.out" && break
	sleep 0.1
done
ex_check "the consumer holds 3" "$(tail -n 1 "$tmp/held.out")" "holding 3"
ex_check "unacked while it lives (the earlier 4 acked)" \
	"$(rmq_wait_counts "selftest 3 0 3" "selftest.dead 0 0 0")" "selftest 3 0 3; selftest.dead 0 0 0"
kill -KILL "$held"
wait "$held" 2>/dev/null || true
ex_check "after kill -9: ready again, none unacked" \
	"$(rmq_wait_counts "selftest 3 3 0" "selftest.dead 0 0 0")" "selftest 3 3 0; selftest.dead 0 0 0"
tool consume "$RMQ_URL" selftest --idle 1 >"$tmp/c2.out"
ex_check "redelivered, with x-delivery-count 1" "$(sort "$tmp/c2.out" | tr '\n' ',')" \
	"delivery k1 redelivered=True count=1,delivery k2 redelivered=True count=1,delivery k3 redelivered=True count=1,"

echo "== a poison message ends in the dead-letter queue after the limit"
tool publish "$RMQ_URL" selftest poison ok1
tool consume "$RMQ_URL" selftest --nack poison --idle 1.5 >"$tmp/c3.out"
cat "$tmp/c3.out"
ex_check "poison delivered limit + 1 = 3 times" "$(grep -c '^delivery poison ' "$tmp/c3.out")" 3
ex_check "... counted 0, 1, 2" "$(grep '^delivery poison ' "$tmp/c3.out" | sed 's/.*count=//' | tr '\n' ' ')" "0 1 2 "
ex_check "the good message once" "$(grep -c '^delivery ok1 ' "$tmp/c3.out")" 1
ex_check "counts: selftest empty, selftest.dead holds the poison" \
	"$(rmq_wait_counts "selftest 0 0 0" "selftest.dead 1 1 0")" "selftest 0 0 0; selftest.dead 1 1 0"
tool consume "$RMQ_URL" selftest.dead --idle 1 >"$tmp/c4.out"
ex_check "the dead-lettered message" "$(cut -d' ' -f1-2 "$tmp/c4.out")" "delivery poison"

echo "== a second node, started while the first one worked, and stopped"
wait "$second" || true
second=
cat "$tmp/second.out"
ex_check "the second node carried its message" "$(grep '^delivery' "$tmp/second.out")" \
	"delivery x1 redelivered=False count=0"
ex_check "... and stopped" "$(grep -c '^second stopped$' "$tmp/second.out")" 1
# a subshell whose rmq_start fails stops nothing of the node it inherited
( trap rmq_stop EXIT; RMQ_BIN=/nonexistent rmq_start ) 2>"$tmp/third.err" || true
ex_check "a start that fails says why" "$(grep -c "RabbitMQ is not installed" "$tmp/third.err")" 1
tool publish "$RMQ_URL" selftest after >/dev/null
ex_check "the first node, after the second stopped, carries messages, and has only its own queues" \
	"$(rmq_wait_counts "selftest 1 1 0" "selftest.dead 0 0 0")" "selftest 1 1 0; selftest.dead 0 0 0"

echo "== rmq_stop"
dir=$RMQ_DIR pid=$RMQ_PID epmd=$RMQ_EPMD_PID port=$RMQ_PORT epmd_port=$RMQ_EPMD_PORT
ex_check "the node registered with our epmd, on its port" \
	"$(epmd -port "$epmd_port" -names 2>/dev/null | grep -c "^name ${RMQ_NODE%@*} at port $RMQ_DIST_PORT\$")" 1
rmq_stop
ex_check "the node's process is gone" "$(kill -0 "$pid" 2>/dev/null && echo alive || echo gone)" gone
ex_check "its epmd is gone" "$(kill -0 "$epmd" 2>/dev/null && echo alive || echo gone)" gone
ex_check "its directory is gone" "$([ -e "$dir" ] && echo there || echo gone)" gone
for p in "$port" "$epmd_port"; do
	ex_check "port $p is closed (AMQP, epmd)" \
		"$( (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && echo open || echo closed)" closed
done
ex_check "no process of this user runs from it" \
	"$(pgrep -u "$(id -u)" -f "$dir" | wc -l)" 0
echo "rabbitmq: start took $((RMQ_START_MS / 1000)).$(printf '%03d' $((RMQ_START_MS % 1000))) s; broker_rabbitmq took $SECONDS s"
ex_finish
