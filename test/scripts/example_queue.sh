#!/usr/bin/env bash
# examples/queue: every message is delivered twice, in random order, to four
# workers running side by side; each worker rolls back one delivery in ten
# (it dies before the ack, so the delivery comes back), and one worker's
# session is terminated in the middle.  Each message's effect must be
# applied exactly once: counted in the ledger and the account balances.
source test/scripts/lib/examples.sh
ex_database idem_example_queue
ex_sql -f examples/queue/queue.sql

N=1000
ex_sql -c "CALL publish_twice($N)"
ex_check "deliveries published" "$(ex_value "SELECT count(*) FROM deliveries")" $((2 * N))

echo "== four workers"
workers=()
for w in 1 2 3 4; do
	PGAPPNAME=queue-worker-$w psql -X -q -v ON_ERROR_STOP=1 \
		-c "CALL consume_worker($w, crash_rate => 0.1)" >/dev/null 2>&1 &
	workers+=($!)
	EX_PIDS+=($!)
done
ex_wait_for "the workers to get going" "SELECT count(*) > 200 FROM consumer_log"
echo "terminating worker 4's session: $(ex_value "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'queue-worker-4'") terminated"
for w in 1 2 3 4; do
	rc=0
	wait "${workers[$((w - 1))]}" || rc=$?
	echo "worker $w exited with status $rc"
done
# Deliveries rolled back after the other workers had found the queue empty
echo "left for a last worker: $(ex_value "SELECT count(*) FROM deliveries")"
ex_sql -c "CALL consume_worker(5)"

echo "== the effects"
ex_check "deliveries left" "$(ex_value "SELECT count(*) FROM deliveries")" 0
ex_check "ledger lines" "$(ex_value "SELECT count(*) FROM ledger")" $N
ex_check "messages in the ledger" "$(ex_value "SELECT count(DISTINCT message_id) FROM ledger")" $N
ex_check "total balance" "$(ex_value "SELECT sum(balance) FROM accounts")" $((N * (N + 1) / 2))
ex_check "accounts whose balance is not their ledger's sum" \
	"$(ex_value "SELECT count(*) FROM accounts a WHERE balance <> (SELECT coalesce(sum(amount), 0) FROM ledger l WHERE l.account_id = a.id)")" 0
ex_check "committed deliveries: first time" "$(ex_value "SELECT count(*) FROM consumer_log WHERE first")" $N
ex_check "committed deliveries: duplicates skipped" "$(ex_value "SELECT count(*) FROM consumer_log WHERE NOT first")" $N
ex_check "inbox records" "$(ex_value "SELECT count(*) FROM idem_keys WHERE scope = 'idem:consume' AND operation = 'ledger' AND status = 'completed'")" $N
echo "effects applied per worker: $(ex_value "SELECT string_agg(worker || ':' || n, ' ') FROM (SELECT worker, count(*) n FROM ledger GROUP BY 1 ORDER BY 1) s")"
ex_finish
