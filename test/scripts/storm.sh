#!/usr/bin/env bash
# Storm: 16 connections x 2,000 attempts over 500 keys, with random rollbacks,
# at READ COMMITTED, REPEATABLE READ and SERIALIZABLE at once.  Afterwards the
# effect table must hold exactly one row per key that has a completed record
# and none for the others, and no client may have seen an error (a unique
# violation escaping idem_reserve would abort its pgbench client).
set -euo pipefail

db=idem_storm
dropdb --if-exists "$db" 2>/dev/null
createdb "$db"
psql -X -q -v ON_ERROR_STOP=1 -d "$db" <<'SQL'
CREATE EXTENSION idempotency;
CREATE TABLE storm_effects (op text NOT NULL, k int NOT NULL, at timestamptz DEFAULT clock_timestamp());
SQL

script=test/scripts/lib/storm.pgbench
log=$(mktemp)
trap 'rm -f "$log"*' EXIT

pids=()
for iso in 'read committed' 'repeatable read' 'serializable'; do
	# 6 + 5 + 5 = 16 clients, 2,000 attempts each
	case "$iso" in 'read committed') c=6 ;; *) c=5 ;; esac
	PGOPTIONS="-c default_transaction_isolation=${iso// /\\ }" \
		pgbench -n -c "$c" -j 1 -t 2000 --max-tries=1000 -D op=storm -D keys=500 \
		-f "$script" "$db" >"$log.${iso// /_}.log" 2>&1 &
	pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for f in "$log".*.log; do
	iso=${f#"$log".}
	iso=${iso%.log}
	grep -E 'isolation|number of (transactions actually processed|failed|transactions retried)|aborted|ERROR' "$f" | sed "s|^|  $iso: |" || true
	if grep -qE 'aborted|ERROR|number of failed transactions: [1-9]' "$f"; then
		echo "client errors in $f:"; grep -E 'ERROR|aborted' "$f" | head -5; rc=1
	fi
	rm -f "$f"
done

psql -X -q -v ON_ERROR_STOP=1 -d "$db" -At <<'SQL' >"$log.check"
SELECT 'completed keys: ' || count(*) FROM idem_keys WHERE status = 'completed';
SELECT 'effect rows: ' || count(*) FROM storm_effects;
SELECT 'keys charged twice: ' || count(*) FROM (SELECT k FROM storm_effects GROUP BY k HAVING count(*) > 1) d;
SELECT 'effects without completed record: ' || count(*) FROM storm_effects e
	WHERE NOT EXISTS (SELECT 1 FROM idem_keys i WHERE i.key = 'key-' || e.k AND i.status = 'completed');
SELECT 'completed records without effect: ' || count(*) FROM idem_keys i
	WHERE NOT EXISTS (SELECT 1 FROM storm_effects e WHERE i.key = 'key-' || e.k);
SELECT 'records not completed: ' || count(*) FROM idem_keys WHERE status <> 'completed';
SQL
cat "$log.check"
grep -qE '^keys charged twice: 0$' "$log.check" || rc=1
grep -qE '^effects without completed record: 0$' "$log.check" || rc=1
grep -qE '^completed records without effect: 0$' "$log.check" || rc=1
grep -qE '^records not completed: 0$' "$log.check" || rc=1
# with 32,000 attempts over 500 keys, every key must have been charged once
grep -qE '^completed keys: 500$' "$log.check" || rc=1
rm -f "$log.check"
dropdb "$db"
exit $rc
