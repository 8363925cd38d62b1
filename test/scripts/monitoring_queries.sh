#!/usr/bin/env bash
# The postgres_exporter queries file, examples/monitoring/queries.yaml: its
# structure is valid, every query runs as a monitoring role set up as the
# doc/monitoring.md says (pg_read_all_stats, USAGE on the schema, nothing else), and
# returns exactly the columns the file declares, of the right kinds
# (test/scripts/lib/exporter_queries.py).  Then the values it exports agree
# with the database: the counters of idem_stats with the calls made, the
# backlog with the expired and stuck records in idem_keys.  The worker's
# query runs here with the worker paused (no rows); TAP 025 runs the file
# against a live worker.
set -euo pipefail

DB=idem_monitoring
ROLE=idem_monitor_q
FILE=examples/monitoring/queries.yaml

cleanup() {
	dropdb --if-exists "$DB" >/dev/null 2>&1 || true
	psql -X -q -d postgres -c "DROP ROLE IF EXISTS $ROLE" >/dev/null 2>&1 || true
}
trap cleanup EXIT

q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }

dropdb --if-exists "$DB" >/dev/null 2>&1
createdb "$DB"
psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "SET client_min_messages = warning" -c "DROP ROLE IF EXISTS $ROLE" \
	-c "CREATE ROLE $ROLE LOGIN" -c "GRANT pg_read_all_stats TO $ROLE" >/dev/null
q -c "CREATE EXTENSION idempotency" -c "GRANT USAGE ON SCHEMA public TO $ROLE" -c "
SELECT idem_stats_reset();
-- 5 completed keys, 2 replays, 1 mismatch; 3 of them expired long ago
SELECT count(idem_complete('pay', 'k' || i)) FROM generate_series(1, 5) i,
	LATERAL idem_reserve('pay', 'k' || i, '{\"a\": 1}');
SELECT outcome FROM idem_reserve('pay', 'k1', '{\"a\": 1}');
SELECT outcome FROM idem_reserve('pay', 'k2', '{\"a\": 1}');
SELECT outcome FROM idem_reserve('pay', 'k3', '{\"a\": 2}');
UPDATE idem_keys SET expires_at = now() - interval '1 hour' WHERE key IN ('k1', 'k2', 'k3');
-- 2 records whose outcome is unknown: one flagged, one overdue
SELECT r.outcome FROM (VALUES ('s1'), ('s2')) v(k), LATERAL idem_reserve('ship', v.k) r;
" -c "
-- (a transaction of its own: the reservations are written when theirs commits)
UPDATE idem_keys SET status = 'stuck' WHERE key = 's1';
UPDATE idem_keys SET updated_at = now() - interval '1 day' WHERE key = 's2';
" >/dev/null

echo "== $FILE as $ROLE"
python3 test/scripts/lib/exporter_queries.py "$FILE" \
	"host=$PGHOST port=$PGPORT dbname=$DB user=$ROLE" --rows idem_stats idem_backlog

# The exported values, as the monitoring role reads them
values=$(python3 - "$FILE" "host=$PGHOST port=$PGPORT dbname=$DB user=$ROLE" <<'PY'
import sys, yaml, psycopg
doc = yaml.safe_load(open(sys.argv[1]))
conn = psycopg.connect(sys.argv[2])
cur = conn.cursor()
for name in ("idem_stats", "idem_backlog"):
    cur.execute(doc[name]["query"])
    cols = [d.name for d in cur.description]
    for row in cur.fetchall():
        r = dict(zip(cols, row))
        if name == "idem_stats":
            print(f"stats {r['operation']} {r['reserves']} {r['new']} {r['replays']} "
                  f"{r['mismatches']} {r['completes']}")
        else:
            print(f"backlog {r['expired']} {r['expired_age_seconds'] >= 3599} "
                  f"{r['stuck']} {r['stuck_age_seconds'] >= 86399}")
PY
)
want="backlog 3 True 2 True
stats pay 8 5 2 1 5
stats ship 2 2 0 0 0"
got=$(sort <<<"$values")
if [ "$got" != "$want" ]; then
	printf 'exported values differ:\n--- want\n%s\n--- got\n%s\n' "$want" "$got"
	exit 1
fi
echo "ok the exported values agree with the calls and the records"

# The backlog agrees with idem_keys read directly
direct=$(q -c "SELECT (SELECT count(*) FROM idem_keys WHERE status = 'completed' AND expires_at < now())
	|| ' ' || (SELECT count(*) FROM idem_stuck)")
[ "$direct" = "3 2" ] || { echo "idem_keys holds $direct expired and stuck records"; exit 1; }

# A role granted nothing cannot read what the file reads
if psql -X -q -At -d "$DB" -U "$ROLE" -c "SELECT count(*) FROM idem_keys" >/dev/null 2>&1; then
	echo "the monitoring role can read idem_keys"
	exit 1
fi
echo "ok the monitoring role reads no record itself"
