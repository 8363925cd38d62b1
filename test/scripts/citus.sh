#!/usr/bin/env bash
# Scale-out on Citus (doc/citus.md): a coordinator and two
# workers on loopback, idem_keys distributed by scope next to payments
# (idem_distribute), and exactly one effect per key in every case:
#   - before the set-up, the local-table mode is refused;
#   - a storm with rollbacks from the coordinator and from a worker at once;
#   - one key used from all three nodes;
#   - a role that does not own idem_keys, from every node;
#   - a coordinator backend killed at commit (after the worker's part
#     committed, before its own commit is acknowledged), and one killed at
#     random during a storm, then every key retried;
#   - a shard move during a storm, then every key retried;
#   - the background worker of each node sweeping and flagging its shards;
#   - a node added after start-up (citus_add_node) maintained at once;
#   - a shard dropped during a pass (as after a move): the node maintained;
#   - held reservations on the shards: a new key written once, another
#     body told in_progress during the hold;
#   - the starting node killed in its commit, after Citus committed or
#     prepared the other nodes' part: a worker holding one of two scopes,
#     idem_consume with its effect on the other worker, and a worker
#     holding none; all or none of each, and one effect after the retry;
#   - a transaction that reached a node's shards over a connection refused
#     there, and which PREPARE TRANSACTIONs Citus refuses.
# Effects are counted in the distributed table payments.  Skipped (exit 77)
# where the server installation has no citus.so: Citus is not in Debian's
# archive, build it from its source to run this.
set -euo pipefail

PGBIN=${PGBIN:-$(pg_config --bindir)}
source "$(dirname "$0")/../citus_cluster.sh"

fail=0
check() {
	# check NAME ACTUAL EXPECTED
	if [ "$2" = "$3" ]; then
		echo "  ok: $1 = $2"
	else
		echo "  FAILED: $1 = $2, expected $3"
		fail=1
	fi
}

citus_cluster_start "fsync = off" "idempotency.sweep_interval = '1s'"
q 0 <<SQL >/dev/null
CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant text COLLATE "C" NOT NULL, key text NOT NULL, amount int);
SELECT pg_catalog.create_distributed_table('payments', 'tenant');
CREATE TABLE coordinator_audit (n int);
SQL
echo "cluster: coordinator :${ports[0]}, workers :${ports[1]} :${ports[2]}, $(q 0 -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'") citus"

echo "== local-table mode (idem_keys not distributed) is refused"
out=$(q 0 -c "SELECT outcome FROM idem_reserve('pay', 'k', scope => 't1')" 2>&1 || true)
echo "  $(echo "$out" | head -1)"
check "refused" "$(echo "$out" | grep -c 'must be distributed by scope')" 1

echo "== idem_distribute('payments')"
q 0 -c "SELECT idem_distribute('payments')" >/dev/null
check "idem_keys distributed, co-located with payments" \
	"$(q 0 -c "SELECT count(DISTINCT colocationid) FROM pg_dist_partition WHERE logicalrelid IN ('idem_keys'::regclass, 'payments'::regclass)")" 1
check "delegated functions" \
	"$(q 0 -c "SELECT count(*) FROM pg_dist_object WHERE objid IN ('idem_reserve'::regproc, 'idem_complete'::regproc, 'idem_release'::regproc, 'idem_checkpoint'::regproc, 'idem_lookup'::regproc, 'idem_call'::regproc) AND force_delegation")" 6

# One attempt of key K in scope tS, 20% rolled back
citus_attempt_script storm 400 rollbacks >"$work/attempt.sql"
# ... and every key once, in order, for the retries after a crash or a move
for k in $(seq 1 400); do
	t=$((k % 16))
	cat <<SQL
BEGIN;
SELECT (outcome = 'new') AS is_new FROM idem_reserve('storm', 'key-$k', '{"k": $k}', 't$t') \\gset
\\if :is_new
INSERT INTO payments (tenant, key, amount) VALUES ('t$t', 'key-$k', $k);
SELECT idem_complete('storm', 'key-$k', '{"charged": $k}', 201, NULL, 't$t');
\\endif
COMMIT;
SQL
done >"$work/retry_all.sql"

storm() {
	# storm NODE CLIENTS SECONDS LOG
	# --max-tries: a transaction that Citus cancels in a distributed
	# deadlock with a shard move (40P01) is retried, as an application would
	"$PGBIN/pgbench" -n -h 127.0.0.1 -p "${ports[$1]}" -c "$2" -j 1 -T "$3" \
		--max-tries=50 -f "$work/attempt.sql" idem >"$4" 2>&1
}

# The effects against the records, over the whole cluster
verify() {
	local label=$1 expect_all=$2
	check "$label: keys charged twice" \
		"$(q 0 -c "SELECT count(*) FROM (SELECT tenant, key FROM payments GROUP BY 1, 2 HAVING count(*) > 1) d")" 0
	check "$label: effects without a completed record" \
		"$(q 0 -c "SELECT count(*) FROM payments p LEFT JOIN idem_keys i ON i.scope = p.tenant AND i.key = p.key AND i.operation = 'storm' AND i.status = 'completed' WHERE i.key IS NULL AND p.key LIKE 'key-%'")" 0
	check "$label: completed records without an effect" \
		"$(q 0 -c "SELECT count(*) FROM idem_keys i LEFT JOIN payments p ON p.tenant = i.scope AND p.key = i.key WHERE i.operation = 'storm' AND p.key IS NULL")" 0
	check "$label: records not completed" \
		"$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'storm' AND status <> 'completed'")" 0
	if [ "$expect_all" = all ]; then
		check "$label: completed keys" \
			"$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'storm'")" 400
	fi
	check "$label: rows in the shells (must be none)" \
		"$(for n in 0 1 2; do q "$n" -c "SELECT pg_relation_size('idem_keys')"; done | awk '{ s += $1 } END { print s }')" 0
}

echo "== storm: 4 clients on the coordinator and 4 on worker1, 20% rollbacks, 10 s"
storm 0 4 10 "$work/storm0.log" &
p0=$!
storm 1 4 10 "$work/storm1.log" &
p1=$!
wait "$p0" || true
wait "$p1" || true
for n in 0 1; do
	echo "  ${names[$n]}: $(grep -E 'number of transactions actually processed' "$work/storm$n.log"), $(grep -cE 'ERROR|aborted' "$work/storm$n.log" || true) client errors"
	if grep -E 'ERROR|aborted' "$work/storm$n.log" | head -3; then fail=1; fi
done
verify storm some

echo "== one key from every node"
for n in 0 1 2; do
	q "$n" >/dev/null <<'SQL'
BEGIN;
SELECT (outcome = 'new') AS is_new FROM idem_reserve('cross', 'k1', NULL, 't7') \gset
\if :is_new
INSERT INTO payments VALUES ('t7', 'cross-k1', 1);
SELECT idem_complete('cross', 'k1', NULL, 200, NULL, 't7');
\endif
COMMIT;
SQL
	echo "  ${names[$n]}: $(q "$n" -c "SELECT outcome FROM idem_reserve('cross', 'k1', NULL, 't7')")"
done
check "cross-node effects" "$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'cross-k1'")" 1

echo "== an application role that does not own idem_keys"
# Citus lets only the table's owner take the shard metadata lock
# (lock_shard_metadata): the extension takes it as the owner
q 0 >/dev/null <<'SQL'
CREATE ROLE app LOGIN;
GRANT SELECT, INSERT, UPDATE, DELETE ON idem_keys, payments TO app;
GRANT EXECUTE ON FUNCTION idem_reserve(text, text, jsonb, text, interval),
	idem_complete(text, text, jsonb, integer, text, text) TO app;
SQL
for n in 0 1 2; do
	"$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "${ports[$n]}" -d idem -U app \
		>"$work/app$n.log" 2>&1 <<SQL || true
BEGIN;
SELECT (outcome = 'new') AS is_new FROM idem_reserve('app', 'k$n', NULL, 't$n') \\gset
\\if :is_new
INSERT INTO payments VALUES ('t$n', 'app-k$n', 1);
SELECT idem_complete('app', 'k$n', NULL, 200, NULL, 't$n');
\\endif
COMMIT;
SQL
	grep ERROR "$work/app$n.log" | head -1 | sed 's/^/  /' || true
done
check "keys of the role completed, one effect each" \
	"$(q 0 -c "SELECT count(*) FROM idem_keys i JOIN payments p ON p.tenant = i.scope AND p.key = 'app-' || i.key WHERE i.operation = 'app' AND i.status = 'completed'")" 3

echo "== a coordinator backend killed at commit, after the worker's part committed"
# The coordinator's own commit waits for a standby that never comes
# (synchronous_standby_names), after Citus has committed on the worker.
q 0 -c "ALTER SYSTEM SET synchronous_standby_names = 'nobody'" -c "SELECT pg_reload_conf()" >/dev/null
q 0 >/dev/null 2>&1 <<'SQL' &
SET application_name = 'killed_at_commit';
BEGIN;
SELECT outcome FROM idem_reserve('kill', 'k1', NULL, 't5');
INSERT INTO payments VALUES ('t5', 'kill-k1', 1);
SELECT idem_complete('kill', 'k1', NULL, 200, NULL, 't5');
INSERT INTO coordinator_audit VALUES (1);
COMMIT;
SQL
client=$!
pid=
for _ in $(seq 1 100); do
	pid=$(q 0 -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'killed_at_commit' AND wait_event = 'SyncRep'")
	[ -n "$pid" ] && break
	sleep 0.1
done
check "backend waiting in its commit" "$([ -n "$pid" ] && echo yes || echo no)" yes
[ -n "$pid" ] && kill -9 "$pid"
wait "$client" || true
for _ in $(seq 1 100); do "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "${ports[0]}" -d idem && break; sleep 0.2; done
sleep 1
q 0 -c "ALTER SYSTEM RESET synchronous_standby_names" -c "SELECT pg_reload_conf()" >/dev/null
echo "  after the restart: $(q 0 -c "SELECT outcome FROM idem_reserve('kill', 'k1', NULL, 't5')")"
check "effects of the killed key" "$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'kill-k1'")" 1

echo "== kill -9 of a coordinator backend during a storm, then every key retried"
storm 0 4 6 "$work/storm_kill.log" &
p0=$!
sleep 3
pid=$(q 0 -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench' AND state <> 'idle' ORDER BY random() LIMIT 1")
echo "  killed backend $pid"
kill -9 "$pid" || true
wait "$p0" || true
for _ in $(seq 1 100); do "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "${ports[0]}" -d idem && break; sleep 0.2; done
sleep 1
q 0 -f "$work/retry_all.sql" >/dev/null
verify "after the kill" all

echo "== shard move during a storm, then every key retried"
read -r shardid src <<<"$(q 0 -F ' ' -c "SELECT s.shardid, p.nodeport FROM pg_dist_shard s JOIN pg_dist_shard_placement p USING (shardid) WHERE s.logicalrelid = 'idem_keys'::regclass AND s.shardid = get_shard_id_for_distribution_column('idem_keys', 't3')")"
dst=$([ "$src" = "${ports[1]}" ] && echo "${ports[2]}" || echo "${ports[1]}")
before=$(q 0 -c "SELECT count(*) FROM idem_keys WHERE scope = 't3'")
q 0 -c "DELETE FROM payments WHERE tenant = 't3'" -c "DELETE FROM idem_keys WHERE scope = 't3'"
storm 0 4 8 "$work/storm_move.log" &
p0=$!
sleep 2
# A transaction that reserved on the shard's node before the move and then
# waits for the move on the coordinator (its INSERT) deadlocks with it; Citus
# cancels the younger of the two, sometimes the move: try it again then.
# Citus drops the old placement later, in the background (every
# citus.defer_shard_delete_interval); off until the calls below have been
# made on both sides of that drop
for n in 0 1 2; do
	q "$n" -c "ALTER SYSTEM SET citus.defer_shard_delete_interval = -1" -c "SELECT pg_reload_conf()" >/dev/null
done
moved=0
for attempt in $(seq 1 20); do
	if q 0 -c "SELECT citus_move_shard_placement($shardid, '127.0.0.1', $src, '127.0.0.1', $dst, shard_transfer_mode => 'block_writes')" >/dev/null 2>"$work/move.err"; then
		moved=1
		break
	fi
	sleep 0.2
done
check "shard moved (attempt $attempt)" "$moved" 1
# A call that reaches the old node after the move (Citus routed it before)
# must be told to retry, 40001, while the old placement waits there for
# Citus's deferred cleanup; after that, 55000 (not on this node).  The
# scope is a subquery, so that Citus does not delegate the call.
n_src=$([ "$src" = "${ports[1]}" ] && echo 1 || echo 2)
old_node_call() {
	q "$n_src" -v VERBOSITY=verbose -c "SELECT status FROM idem_lookup('storm', 'key-3', (SELECT 't3'))" 2>&1 |
		sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p' | head -1 || true
}
check "the old placement left on the old node" \
	"$(q "$n_src" -c "SELECT to_regclass('public.idem_keys_$shardid') IS NOT NULL")" t
check "a call on the old node, its old placement there" "$(old_node_call)" 40001
q 0 -c "CALL citus_cleanup_orphaned_resources()" >/dev/null
check "the old placement dropped by Citus's cleanup" \
	"$(q "$n_src" -c "SELECT to_regclass('public.idem_keys_$shardid') IS NOT NULL")" f
check "a call on the old node after the cleanup" "$(old_node_call)" 55000
for n in 0 1 2; do
	q "$n" -c "ALTER SYSTEM RESET citus.defer_shard_delete_interval" -c "SELECT pg_reload_conf()" >/dev/null
done
echo "  moved shard $shardid of scope t3 (records $before, then re-created by the storm) from :$src to :$dst"
wait "$p0" || true
echo "  coordinator: $(grep -E 'number of transactions actually processed' "$work/storm_move.log"), $(grep -E 'number of transactions retried' "$work/storm_move.log" || echo 'none retried')"
check "client errors during the move" "$(grep -cE 'aborted|number of failed transactions: [1-9]' "$work/storm_move.log" || true)" 0
grep -E 'ERROR|aborted' "$work/storm_move.log" | sort | uniq -c | head -3 || true
t3=$(q 0 -c "SELECT count(*) FROM idem_keys WHERE scope = 't3' AND status = 'completed'")
q 0 -f "$work/retry_all.sql" >/dev/null
check "t3 records after the move and the retries" "$(q 0 -c "SELECT count(*) FROM idem_keys WHERE scope = 't3'")" 25
check "t3 completed before the retries, replayed by them" "$(q 0 -c "SELECT count(*) FROM payments WHERE tenant = 't3'")" 25
echo "  ($t3 keys of t3 were completed before the retries)"
check "replay after the move" "$(q 0 -c "SELECT outcome FROM idem_reserve('storm', 'key-3', '{\"k\": 3}', 't3')")" replay
verify "after the move" all

echo "== the background worker of each node maintains its shards"
# Expire every storm record, and age the two others into stuck ones
q 0 -c "UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE operation = 'storm'" >/dev/null
q 0 -c "UPDATE idem_keys SET status = 'processing', updated_at = now() - interval '1 hour' WHERE operation IN ('cross', 'kill')" >/dev/null
for _ in $(seq 1 30); do
	[ "$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'storm'")" = 0 ] &&
		[ "$(q 0 -c "SELECT count(*) FROM idem_keys WHERE status = 'stuck'")" = 2 ] && break
	sleep 0.5
done
check "expired records left in the shards" "$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'storm'")" 0
check "records flagged stuck in the shards" "$(q 0 -c "SELECT count(*) FROM idem_keys WHERE status = 'stuck'")" 2
# A reconciler registered on each worker settles stuck records of its
# shards; it runs as the superuser, which the operator allows
for n in 0 1 2; do
	q "$n" -c "ALTER SYSTEM SET idempotency.enable_superuser_reconcilers = on" -c "SELECT pg_reload_conf()" >/dev/null
done
q 0 >/dev/null <<'SQL'
CREATE FUNCTION rec_release(r idem_keys) RETURNS void LANGUAGE plpgsql
	AS $$ BEGIN PERFORM idem_release(r.operation, r.key, r.scope); END $$;
SELECT run_command_on_workers($$SELECT idem_set_reconciler('rec', 'rec_release(idem_keys)')$$);
SELECT idem_reserve('rec', 'r1', NULL, 't1');
SELECT idem_reserve('rec', 'r2', NULL, 't2');
UPDATE idem_keys SET status = 'stuck' WHERE operation = 'rec';
SQL
for _ in $(seq 1 30); do
	[ "$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'rec'")" = 0 ] && break
	sleep 0.5
done
check "stuck records reconciled on their nodes" "$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'rec'")" 0
for n in 0 1 2; do
	echo "  ${names[$n]}: $(q "$n" -c "SELECT coalesce(sum(total_deleted), 0) || ' swept, ' || coalesce(sum(total_flagged), 0) || ' flagged, ' || coalesce(sum(total_reconciled), 0) || ' reconciled by its worker' FROM idem_worker_status WHERE datname = 'idem'")"
	# (the coordinator restarted after the kills: its worker exits are those)
	pattern='distributed plan|own a lock'
	[ "$n" = 0 ] || pattern="$pattern|background worker \"idempotency.*exited with exit code"
	check "${names[$n]}: worker exits, planner errors, lock warnings" \
		"$(grep -cE "$pattern" "$work/n$n.log" || true)" 0
done

echo "== a node added after start-up: its worker serves the database within two sweep intervals"
# citus_add_node creates the extension on the new node with two-phase
# commit, right after CREATE DATABASE there: the PREPARE's hint brings a
# visit that finds no extension yet (test/t/032_worker_new_node.pl does the
# same without Citus)
citus_node_start 3 "fsync = off" "idempotency.sweep_interval = '2s'"
q 0 -c "SELECT pg_catalog.citus_add_node('127.0.0.1', ${ports[3]})" >/dev/null
t0=$EPOCHREALTIME
check "worker3: the extension, created by citus_add_node" \
	"$(q 3 -c "SELECT count(*) FROM pg_extension WHERE extname = 'idempotency'")" 1
served=no
while awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { exit !(b - a < 4) }'; do
	if [ "$(q 3 -c "SELECT count(*) FROM idem_worker_status WHERE datname = 'idem' AND passes > 0")" = 1 ]; then
		served=yes
		break
	fi
	sleep 0.1
done
echo "  $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s after citus_add_node"
check "worker3: maintained within two sweep intervals (2 s each)" "$served" yes
check "worker3: worker exits" \
	"$(grep -cE 'background worker "idempotency.*exited with exit code' "$work/n3.log" || true)" 0

# The first scope PREFIX1, PREFIX2, ... whose shard is on node N
scope_on() {
	q 0 -c "SELECT x.s FROM generate_series(1, 500) i, LATERAL (SELECT '$2' || i AS s) x
		JOIN pg_dist_shard_placement p ON p.shardid = get_shard_id_for_distribution_column('idem_keys', x.s)
		WHERE p.nodeport = ${ports[$1]} ORDER BY i LIMIT 1"
}
A=$(scope_on 1 a)
B=$(scope_on 2 b)
shardA=$(q 0 -c "SELECT shard_name('idem_keys', get_shard_id_for_distribution_column('idem_keys', '$A'))")

echo "== held reservations on the shards: one write per new key, in_progress during the hold"
# On worker1, in scope $A (its shard $shardA): a new key reserved and
# completed writes its record once, an insert of the completed record
check "writes of a new key into $shardA (inserted/updated)" "$(q 1 <<SQL
BEGIN;
SELECT outcome FROM idem_reserve('held', 'h1', '{"a": 1}', '$A') \\g /dev/null
SELECT idem_complete('held', 'h1', '{"ok": true}', 201, NULL, '$A') \\g /dev/null
SELECT pg_stat_get_xact_tuples_inserted('$shardA'::regclass) || '/' || pg_stat_get_xact_tuples_updated('$shardA'::regclass);
COMMIT;
SQL
)" 1/0
# While a transaction on worker1 holds key h2 (no record written yet),
# another body from the coordinator (delegated to worker1) is told
# in_progress, as on one server; once the holder committed, mismatch.
# The holder waits for a row in a table of worker1's own.
q 1 -c "CREATE TABLE held_release (x int)"
PGAPPNAME=held_holder q 1 >/dev/null <<SQL &
BEGIN;
SELECT outcome FROM idem_reserve('held', 'h2', '{"a": 1}', '$A');
DO \$\$ BEGIN WHILE NOT EXISTS (SELECT FROM held_release) LOOP PERFORM pg_sleep(0.05); END LOOP; END \$\$;
COMMIT;
SQL
holder=$!
for _ in $(seq 1 100); do
	[ "$(q 1 -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'held_holder' AND wait_event = 'PgSleep'")" = 1 ] && break
	sleep 0.05
done
check "during the hold: rows of h2 in $shardA" "$(q 1 -c "SELECT count(*) FROM $shardA WHERE key = 'h2'")" 0
check "during the hold: another body, from the coordinator" \
	"$(q 0 -c "SELECT outcome FROM idem_reserve('held', 'h2', '{\"a\": 2}', '$A')")" in_progress
check "during the hold: the same body, from worker2" \
	"$(q 2 -c "SELECT outcome FROM idem_reserve('held', 'h2', '{\"a\": 1}', '$A')")" in_progress
q 1 -c "INSERT INTO held_release VALUES (1)"
wait "$holder"
check "after the holder's commit: another body" \
	"$(q 0 -c "SELECT outcome FROM idem_reserve('held', 'h2', '{\"a\": 2}', '$A')")" mismatch
check "after the holder's commit: its record, written at commit" \
	"$(q 0 -c "SELECT status FROM idem_keys WHERE scope = '$A' AND key = 'h2'")" processing
q 0 -c "SELECT idem_release('held', 'h2', '$A')" >/dev/null

echo "== atomic from every node: the starting node killed between the other nodes' commit and its own"
# kill_between NODE NAME SQL: run the transaction SQL (which ends in
# NOTIFY and COMMIT) on NODE and kill its backend in its commit, after
# Citus committed or prepared the other nodes' parts and before its own
# commit record: there PreCommit_Notify waits for the lock that a NOTIFY
# of another session holds while its own commit waits for a standby that
# never comes (synchronous_standby_names).  Then the node restarts and
# Citus's recovery of two-phase commits runs on it.
# standby_names NODE VALUE: set synchronous_standby_names on NODE, and wait
# until a new session has it (once the postmaster has reloaded)
standby_names() {
	q "$1" -c "ALTER SYSTEM SET synchronous_standby_names = '$2'" -c "SELECT pg_reload_conf()" >/dev/null
	for _ in $(seq 1 100); do
		[ "$(q "$1" -c "SHOW synchronous_standby_names")" = "$2" ] && break
		sleep 0.05
	done
}
kill_between() {
	local n=$1 app=$2 sql=$3 pid= holding=no holder client
	standby_names "$n" nobody
	# (a commit waits for the standby only if its transaction wrote WAL)
	PGAPPNAME=notify_holder q "$n" -c "BEGIN" -c "SELECT pg_logical_emit_message(true, 'idem_test', 'hold')" \
		-c "NOTIFY idem_test_hold" -c "COMMIT" >/dev/null 2>&1 &
	holder=$!
	for _ in $(seq 1 100); do
		if [ "$(q "$n" -c "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'notify_holder' AND wait_event = 'SyncRep'")" = 1 ]; then
			holding=yes
			break
		fi
		sleep 0.05
	done
	check "$app: the notify lock held" "$holding" yes
	PGAPPNAME=$app q "$n" <<<"$sql" >"$work/$app.log" 2>&1 &
	client=$!
	for _ in $(seq 1 200); do
		pid=$(q "$n" -c "SELECT pid FROM pg_stat_activity WHERE application_name = '$app' AND wait_event_type = 'Lock' AND wait_event = 'object'")
		[ -n "$pid" ] && break
		sleep 0.05
	done
	check "$app: killed in its commit, after the other nodes' part" "$([ -n "$pid" ] && echo yes || echo no)" yes
	if [ -n "$pid" ]; then
		kill -9 "$pid"
	else
		# let whatever waits go on
		standby_names "$n" ""
	fi
	wait "$client" || true
	wait "$holder" || true
	for _ in $(seq 1 100); do "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "${ports[$n]}" -d idem && break; sleep 0.2; done
	for _ in $(seq 1 50); do q "$n" -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.2; done
	standby_names "$n" ""
	q "$n" -c "SELECT recover_prepared_transactions()" >/dev/null
	check "$app: transactions left prepared on any node" \
		"$(for m in 0 1 2 3; do q "$m" -c "SELECT count(*) FROM pg_prepared_xacts WHERE database = 'idem'"; done | awk '{ s += $1 } END { print s }')" 0
}
# all_or_none LABEL COUNTS...: each of the counts 0, or each 1
all_or_none() {
	local label=$1 state
	shift
	state="$*"
	if [ -z "${state//[0 ]/}" ] || [ -z "${state//[1 ]/}" ]; then
		check "$label: all or none ($state)" yes yes
	else
		check "$label: all or none ($state)" no yes
	fi
}

# transfer OPERATION KEY PAYMENTS [notify]: reserve KEY in $A and in $B,
# insert the payment of each scope named in PAYMENTS ("B", or "A B"),
# complete both
transfer() {
	local op=$1 key=$2 pay=$3 s
	echo "BEGIN;"
	for s in A B; do
		echo "SELECT (outcome = 'new') AS ${s,,}_new FROM idem_reserve('$op', '$key', NULL, '${!s}') \\gset"
	done
	for s in A B; do
		echo "\\if :${s,,}_new"
		if [[ " $pay " = *" $s "* ]]; then
			echo "INSERT INTO payments VALUES ('${!s}', '$op-$key', 1);"
		fi
		echo "SELECT idem_complete('$op', '$key', NULL, 200, NULL, '${!s}');"
		echo "\\endif"
	done
	if [ "${4:-}" = notify ]; then echo "NOTIFY idem_test;"; fi
	echo "COMMIT;"
}

# From worker1, which holds $A: reserve in $A (here) and $B (worker2's,
# delegated), the payment on worker2, complete both.  Scope $A writes only
# its record: nothing of Citus's own writes on worker1, where an INSERT
# through Citus would have Citus use two-phase commit by itself.
kill_between 1 killed_worker1 "$(transfer atom t1 B notify)"
all_or_none "worker1 holding $A, with $B on worker2: its record, $B's record, $B's payment" \
	"$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'atom' AND key = 't1' AND scope = '$A'")" \
	"$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'atom' AND key = 't1' AND scope = '$B'")" \
	"$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'atom-t1'")"
q 1 <<<"$(transfer atom t1 B)" >/dev/null
check "worker1: after the retry, records completed/payments" \
	"$(q 0 -c "SELECT count(*) FILTER (WHERE status = 'completed') FROM idem_keys WHERE operation = 'atom' AND key = 't1'")/$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'atom-t1'")" 2/1

# idem_consume on the node of its scope, the effect on the other worker
C=$(q 0 -c "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = get_shard_id_for_distribution_column('idem_keys', 'idem:consume')")
nc=$([ "$C" = "${ports[1]}" ] && echo 1 || echo 2)
other=$([ "$nc" = 1 ] && echo "$B" || echo "$A")
consume() {
	cat <<SQL
BEGIN;
SELECT idem_consume('atom-consumer', 'm1') AS fresh \\gset
\\if :fresh
INSERT INTO payments VALUES ('$other', 'consume-m1', 1);
\\endif
$([ "${1:-}" = notify ] && echo 'NOTIFY idem_test;')
COMMIT;
SQL
}
kill_between "$nc" killed_consumer "$(consume notify)"
all_or_none "idem_consume on ${names[$nc]}, the payment in $other: its record, the payment" \
	"$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'atom-consumer'")" \
	"$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'consume-m1'")"
q "$nc" <<<"$(consume)" >/dev/null
q "$nc" <<<"$(consume)" >/dev/null
check "idem_consume: payments after two redeliveries" "$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'consume-m1'")" 1

# From worker3, which holds no shard: $A on worker1 and $B on worker2,
# both delegated, with their payments
check "worker3 holds no shard of idem_keys" \
	"$(q 0 -c "SELECT count(*) FROM pg_dist_shard_placement p JOIN pg_dist_shard s USING (shardid) WHERE s.logicalrelid = 'idem_keys'::regclass AND p.nodeport = ${ports[3]}")" 0
kill_between 3 killed_worker3 "$(transfer atom3 t1 "A B" notify)"
all_or_none "worker3 holding none, $A on worker1 and $B on worker2: records and payments of both" \
	"$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'atom3' AND scope = '$A'")" \
	"$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'atom3' AND scope = '$B'")" \
	"$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'atom3-t1' AND tenant = '$A'")" \
	"$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'atom3-t1' AND tenant = '$B'")"
q 3 <<<"$(transfer atom3 t1 "A B")" >/dev/null
check "worker3: after the retry, records completed/payments" \
	"$(q 0 -c "SELECT count(*) FILTER (WHERE status = 'completed') FROM idem_keys WHERE operation = 'atom3'")/$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'atom3-t1'")" 2/2

echo "== a transaction that reached a node's shards over a connection is refused there"
# citus.enable_local_execution off: Citus writes $A's payment over a
# connection to worker1 itself, which would not see the record
code=$(q 1 -v VERBOSITY=verbose 2>&1 <<SQL | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p' | head -1 || true
BEGIN;
SET LOCAL citus.enable_local_execution = off;
INSERT INTO payments VALUES ('$A', 'conn-k1', 1);
SELECT idem_reserve('conn', 'k1', NULL, '$A');
COMMIT;
SQL
)
check "refused after a connection to this node" "$code" 0A000
check "nothing kept of it" "$(q 0 -c "SELECT count(*) FROM payments WHERE key = 'conn-k1'")/$(q 0 -c "SELECT count(*) FROM idem_keys WHERE operation = 'conn'")" 0/0

echo "== PREPARE TRANSACTION"
# Citus refuses it in a transaction in which it ran a statement, even one
# on this node's own shards; the extension's calls on the node of their
# scope do not make it refuse
prepare() {
	# prepare NODE STATEMENTS: the SQLSTATE of PREPARE TRANSACTION, or "prepared"
	q "$1" -v VERBOSITY=verbose 2>&1 <<SQL | sed -n 's/^ERROR:  \([0-9A-Z]\{5\}\):.*/\1/p; s/^prepared$/prepared/p' | head -1 || true
BEGIN;
$2
PREPARE TRANSACTION 'idem_prep';
COMMIT PREPARED 'idem_prep';
SELECT 'prepared';
SQL
}
check "on worker1, the calls of its scope only" \
	"$(prepare 1 "SELECT idem_reserve('prep', 'k1', NULL, '$A'); SELECT idem_complete('prep', 'k1', NULL, 200, NULL, '$A');")" prepared
check "on worker1, with the payment through Citus" \
	"$(prepare 1 "SELECT idem_reserve('prep', 'k2', NULL, '$A'); INSERT INTO payments VALUES ('$A', 'prep-k2', 1);")" 0A000
check "from the coordinator" \
	"$(prepare 0 "SELECT idem_reserve('prep', 'k3', NULL, '$A');")" 0A000
check "prepared records kept, refused ones not" \
	"$(q 0 -c "SELECT string_agg(key || ':' || status, ',' ORDER BY key) FROM idem_keys WHERE operation = 'prep'")/$(q 0 -c "SELECT count(*) FROM payments WHERE key LIKE 'prep-%'")" k1:completed/0

echo "== a shard dropped during a pass of its node's worker: the node stays maintained"
# As Citus drops the old placement of a moved shard: a reconciler, called
# for a stuck record in worker1's first shard, drops worker1's last shard,
# which the pass listed and reaches later.  The pass goes on, and the
# worker keeps serving the database (last, since it breaks that shard).
# worker1 restarts first: its launcher kept visiting the database whatever
# a visit found, as the extension came by PREPARE (citus_add_node), and a
# restart forgets that, as after any server restart.
"$PGBIN/pg_ctl" -D "$work/n1" -m fast -w restart >/dev/null
for _ in $(seq 1 50); do
	[ "$(q 1 -c "SELECT count(*) FROM idem_worker_status WHERE datname = 'idem' AND passes > 0" 2>/dev/null)" = 1 ] && break
	sleep 0.2
done
g1=$(q 0 -c "SELECT groupid FROM pg_dist_node WHERE nodeport = ${ports[1]}")
read -r first victim <<<"$(q 0 -F ' ' -c "SELECT min(s.shardid), max(s.shardid) FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) WHERE s.logicalrelid = 'idem_keys'::regclass AND p.groupid = $g1")"
read -r scope_first scope_other <<<"$(q 0 -F ' ' -c "WITH g AS (SELECT 'g' || i AS scope, get_shard_id_for_distribution_column('idem_keys', 'g' || i) AS shardid FROM generate_series(1, 500) i)
	SELECT (SELECT min(scope) FROM g WHERE shardid = $first),
		(SELECT min(g.scope) FROM g JOIN pg_dist_placement p USING (shardid) WHERE p.groupid = $g1 AND g.shardid NOT IN ($first, $victim))")"
q 0 >/dev/null <<SQL
CREATE FUNCTION rec_drop(r idem_keys) RETURNS void LANGUAGE plpgsql
	SET citus.enable_manual_changes_to_shards = on
	AS \$\$ BEGIN DROP TABLE IF EXISTS public.idem_keys_$victim; PERFORM idem_release(r.operation, r.key, r.scope); END \$\$;
SQL
q 1 -c "SELECT idem_set_reconciler('drop', 'rec_drop(idem_keys)')" >/dev/null
q 0 -c "SELECT idem_reserve('drop', 'd1', NULL, '$scope_first')" -c "UPDATE idem_keys SET status = 'stuck' WHERE operation = 'drop'" >/dev/null
for _ in $(seq 1 30); do
	[ "$(q 1 -c "SELECT to_regclass('public.idem_keys_$victim') IS NULL")" = t ] &&
		[ "$(q 0 -c "SELECT count(*) FROM idem_keys WHERE scope = '$scope_first'")" = 0 ] && break
	sleep 0.5
done
check "worker1: shard $victim dropped by the reconciler, the stuck record released" \
	"$(q 1 -c "SELECT to_regclass('public.idem_keys_$victim') IS NULL")/$(q 0 -c "SELECT count(*) FROM idem_keys WHERE scope = '$scope_first'")" t/0
# Records that expire now, in another shard of worker1: swept by the next
# passes (written on worker1: a call in a FROM list is not delegated)
q 1 >/dev/null <<SQL
SELECT idem_reserve('after', 'a' || i, NULL, '$scope_other'), idem_complete('after', 'a' || i, NULL, 200, NULL, '$scope_other') FROM generate_series(1, 20) i;
UPDATE idem_keys SET expires_at = now() - interval '1 second' WHERE scope = '$scope_other' AND operation = 'after';
SQL
t0=$EPOCHREALTIME
while [ "$(q 0 -c "SELECT count(*) FROM idem_keys WHERE scope = '$scope_other' AND operation = 'after'")" != 0 ] &&
	awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { exit !(b - a < 2) }'; do
	sleep 0.1
done
check "worker1: expired records of $scope_other swept within two sweep intervals after the drop" \
	"$(q 0 -c "SELECT count(*) FROM idem_keys WHERE scope = '$scope_other' AND operation = 'after'")" 0
check "worker1: its idem_worker_status row" "$(q 1 -c "SELECT count(*) FROM idem_worker_status WHERE datname = 'idem'")" 1

if [ "$fail" != 0 ]; then
	for n in 0 1 2 3; do [ -f "$work/n$n.log" ] || continue; echo "--- ${names[$n]} log"; grep -E 'ERROR|FATAL|PANIC' "$work/n$n.log" | sort | uniq -c | sort -rn | head -10; done
fi
exit "$fail"
