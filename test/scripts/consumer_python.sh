#!/usr/bin/env bash
# clients/python's Celery consumer (pg_idempotency.celery, demo/consumer.py)
# against a real RabbitMQ (issue 37): N tasks, some published twice with the
# same task id and arguments, and a poison task, on a quorum queue with a
# delivery limit; two solo workers with prefetch 4; one worker killed (-9,
# by itself) mid-handler, one after idem_complete before COMMIT, one after
# COMMIT before the late ACK; dead workers restarted until the queue is
# empty.  Then: one effect row and one completed record per distinct task,
# the queue empty with nothing unacked, only the poison dead-lettered,
# after limit + 1 tries, with no effect.  With DEMO_ACKS_LATE=0 (ACK on
# receipt) the effects check fails: the crashed messages are lost.
source test/scripts/lib/examples.sh
source test/scripts/lib/rabbitmq.sh
source clients/python/scripts/venv.sh
ex_database idem_consumer_python
ex_tmpdir
trap 'rc=$?; rmq_stop; (exit $rc); ex_cleanup' EXIT
ex_sql -c "CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, n int NOT NULL)"

N=100
LIMIT=4
POISON=1000
venv=$(idem_py_venv)
rmq_start
rmq_declare_queue tasks $LIMIT

mkdir "$EX_TMP/crash"
demo=$PWD/clients/python/demo
export PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD/clients/python/src:$demo
export CELERY_BROKER_URL=$RMQ_URL DEMO_QUEUE=tasks DEMO_DELIVERY_LIMIT=$LIMIT
export DEMO_DATABASE="dbname=$PGDATABASE" DEMO_CRASH_DIR=$EX_TMP/crash DEMO_POISON_LOG=$EX_TMP/poison.log
export DEMO_CRASH=mid:10,before_commit:20,after_commit:30
: >"$EX_TMP/poison.log"

echo "== publishing $N tasks, every tenth twice, and a poison task"
(cd "$EX_TMP" && "$venv/bin/python" - "$N" "$POISON" <<-'PY'
	import sys
	from consumer import app
	n, poison = int(sys.argv[1]), int(sys.argv[2])
	published = 0
	with app.producer_or_acquire() as producer:
	    for i in range(1, n + 1):
	        for _ in range(2 if i % 10 == 5 else 1):
	            app.send_task("demo.apply", args=[i], task_id=f"t-{i}", producer=producer)
	            published += 1
	    app.send_task("demo.poison", args=[poison], task_id="poison-1", producer=producer)
	print("published", published + 1)
	PY
)
ex_check "messages in the queue" "$(rmq_wait_counts "tasks $((N + N / 10 + 1)) $((N + N / 10 + 1)) 0" "tasks.dead 0 0 0" | cut -d';' -f1)" \
	"tasks $((N + N / 10 + 1)) $((N + N / 10 + 1)) 0"

pids=()
start_worker() {
	(cd "$EX_TMP" && exec nice -n 10 "$venv/bin/celery" -A consumer worker --pool=solo --prefetch-multiplier=4 \
		-n "w$1@localhost" --without-gossip --without-mingle --without-heartbeat -l info) >>"$EX_TMP/w$1.log" 2>&1 &
	pids[$1]=$!
	EX_PIDS+=($!)
}

echo "== two workers, restarted when they die"
start_worker 1
start_worker 2
restarts=0
settled=0
deadline=$((SECONDS + 90))
while [ $SECONDS -lt $deadline ]; do
	for w in 1 2; do
		if ! kill -0 "${pids[$w]}" 2>/dev/null; then
			wait "${pids[$w]}" 2>/dev/null || true
			restarts=$((restarts + 1))
			echo "worker $w died; restarting it"
			start_worker "$w"
		fi
	done
	counts="$(rmq_counts | grep -E '^tasks(\.dead)? ' | paste -sd ';')"
	if [ "$counts" = "tasks 0 0 0;tasks.dead 1 1 0" ]; then
		settled=$((settled + 1))
		[ $settled -ge 3 ] && break
	else
		settled=0
	fi
	sleep 1
done
for w in 1 2; do
	kill -TERM "${pids[$w]}" 2>/dev/null || true
	wait "${pids[$w]}" 2>/dev/null || true
done

echo "== the effects and the broker"
ex_check "crash points reached" "$(ls "$EX_TMP/crash" | sort | paste -sd ' ')" "after_commit-30 before_commit-20 mid-10"
ex_check "workers restarted after their crash" "$restarts" 3
ex_check "effects, distinct tasks with an effect" \
	"$(ex_value "SELECT count(*) || ' ' || count(DISTINCT n) FROM effects WHERE n <= $N")" "$N $N"
ex_check "completed records, all records" \
	"$(ex_value "SELECT count(*) FILTER (WHERE status = 'completed' AND operation = 'demo.apply' AND key ~ '^t-') || ' ' || count(*) FROM idem_keys")" "$N $N"
ex_check "the poison's effects" "$(ex_value "SELECT count(*) FROM effects WHERE n = $POISON")" 0
ex_check "the poison's tries (delivery limit $LIMIT + 1)" "$(wc -l <"$EX_TMP/poison.log")" $((LIMIT + 1))
ex_check "queues (messages, ready, unacked)" \
	"$(rmq_counts | grep -E '^tasks(\.dead)? ' | paste -sd ';')" \
	"tasks 0 0 0;tasks.dead 1 1 0"
ex_check "replays logged (duplicates ACKed without running)" \
	"$(cat "$EX_TMP"/w*.log | grep -c 'replayed, not run again' | awk '{ print ($1 >= 10) }')" 1
if [ "$EX_FAILED" != 0 ]; then
	for w in 1 2; do
		echo "--- worker $w's log (tail)"
		tail -n 40 "$EX_TMP/w$w.log"
	done
fi
ex_finish
