#!/usr/bin/env bash
# idem_stats stays exact under concurrent sessions.  pgbench runs workloads
# whose outcome counts are known, then idem_stats is compared with counts
# taken from the database itself:
#   1. N distinct keys, each reserved and completed once by one of several
#      clients: new = completes = reserves = the completed records in idem_keys;
#   2. every key replayed M times on average (random keys, same request;
#      each client has its own keys, since two sessions replaying the same
#      key at the same instant may get in_progress): replays = the calls;
#   3. a few hot keys with a short ttl, two request variants, several clients
#      at once: new, replay, in_progress and mismatch all occur; each
#      transaction logs the outcome it got in a table, and every counter must
#      equal the logged count (completes and releases follow the log too);
#   4. each session replays its own keys of phase 1 in a tight server-side
#      loop, all sessions at once, so that the counters are hammered from
#      both CPUs: replays grow by exactly the replays the loops returned.
# The first calls of each operation race to create its entry.
set -euo pipefail

DB=idem_stats_concurrent
CLIENTS=4
PER_CLIENT=250
N=$((CLIENTS * PER_CLIENT))
M=2
HOT_CLIENTS=6
HOT_PER_CLIENT=300
TIGHT=50000
export PGOPTIONS='-c synchronous_commit=off'

W=$(mktemp -d)
cleanup() {
	rm -rf "$W"
	dropdb --if-exists "$DB" >/dev/null 2>&1 || true
}
trap cleanup EXIT

q() { psql -X -q -At -v ON_ERROR_STOP=1 -d "$DB" -c "$1"; }

dropdb --if-exists "$DB" >/dev/null 2>&1
createdb "$DB"
q "CREATE EXTENSION idempotency"
q "CREATE TABLE hot_log (outcome text NOT NULL, variant int NOT NULL)"
q "CREATE SEQUENCE key_seq"
q "SELECT idem_stats_reset()" >/dev/null

cat >"$W/new.sql" <<'SQL'
SELECT nextval('key_seq') AS n \gset
BEGIN;
SELECT outcome FROM idem_reserve('conc-new', 'k' || :n, jsonb_build_object('n', :n));
SELECT idem_complete('conc-new', 'k' || :n, jsonb_build_object('id', :n));
COMMIT;
SQL

cat >"$W/replay.sql" <<SQL
\\set n :client_id * $PER_CLIENT + random(1, $PER_CLIENT)
SELECT outcome FROM idem_reserve('conc-new', 'k' || :n, jsonb_build_object('n', :n));
SQL

cat >"$W/hot.sql" <<'SQL'
\set k random(1, 8)
\set v random(1, 2)
BEGIN;
WITH r AS (SELECT outcome FROM idem_reserve('conc-hot', 'h' || :k,
                jsonb_build_object('v', :v), ttl => '30 milliseconds')),
     l AS (INSERT INTO hot_log SELECT outcome, :v FROM r)
SELECT (outcome = 'new')::int AS isnew FROM r \gset
\if :isnew
SELECT pg_sleep(0.002);
\if :v = 1
SELECT idem_complete('conc-hot', 'h' || :k, '{"ok": true}');
\else
SELECT idem_release('conc-hot', 'h' || :k);
\endif
\endif
COMMIT;
SQL

bench() {
	local file=$1 clients=$2 per_client=$3
	pgbench -n -c "$clients" -j 2 -t "$per_client" -f "$W/$file" "$DB" >"$W/$file.log" 2>&1 ||
		{ cat "$W/$file.log"; echo "FAIL: pgbench $file"; exit 1; }
}

echo "phase 1: $N distinct keys reserved and completed by $CLIENTS clients"
bench new.sql "$CLIENTS" "$PER_CLIENT"
echo "phase 2: $((N * M)) replays by $CLIENTS clients"
bench replay.sql "$CLIENTS" $((PER_CLIENT * M))
echo "phase 3: $((HOT_CLIENTS * HOT_PER_CLIENT)) contended reservations of 8 hot keys by $HOT_CLIENTS clients"
bench hot.sql "$HOT_CLIENTS" "$HOT_PER_CLIENT"
echo "phase 4: $((CLIENTS * TIGHT)) replays in tight server-side loops, $CLIENTS sessions at once"
pids=()
for c in $(seq 0 $((CLIENTS - 1))); do
	q "SELECT count(*) FROM generate_series(1, $TIGHT) i,
		LATERAL idem_reserve('conc-new', 'k' || ($c * $PER_CLIENT + i % $PER_CLIENT + 1),
			jsonb_build_object('n', $c * $PER_CLIENT + i % $PER_CLIENT + 1))
		WHERE outcome = 'replay'" >"$W/tight.$c" &
	pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
tight_replays=$(cat "$W"/tight.* | awk '{ s += $1 } END { print s }')

fail=0
check() {
	local what=$1 got=$2 want=$3
	if [ "$got" = "$want" ]; then
		echo "ok: $what = $got"
	else
		echo "FAIL: $what: idem_stats has $got, expected $want"
		fail=1
	fi
}

stat() { q "SELECT $2 FROM idem_stats WHERE operation = '$1'"; }

completed=$(q "SELECT count(*) FROM idem_keys WHERE operation = 'conc-new' AND status = 'completed'")
check "records completed in phase 1" "$completed" "$N"
check "conc-new new" "$(stat conc-new '"new"')" "$completed"
check "conc-new completes" "$(stat conc-new completes)" "$completed"
check "replays returned by the tight loops" "$tight_replays" $((CLIENTS * TIGHT))
check "conc-new replays" "$(stat conc-new replays)" $((N * M + tight_replays))
check "conc-new reserves" "$(stat conc-new reserves)" $((N + N * M + tight_replays))
check "conc-new other outcomes" \
	"$(stat conc-new 'in_progress + mismatches + stuck + releases')" 0

logged() { q "SELECT count(*) FROM hot_log WHERE $1"; }
check "conc-hot reserves" "$(stat conc-hot reserves)" "$(logged true)"
check "conc-hot reserves (all transactions)" "$(stat conc-hot reserves)" $((HOT_CLIENTS * HOT_PER_CLIENT))
for o in new replay in_progress mismatch stuck; do
	col=$o
	case $o in
		new) col='"new"' ;;
		replay) col=replays ;;
		mismatch) col=mismatches ;;
	esac
	check "conc-hot $o" "$(stat conc-hot "$col")" "$(logged "outcome = '$o'")"
done
check "conc-hot completes" "$(stat conc-hot completes)" "$(logged "outcome = 'new' AND variant = 1")"
check "conc-hot releases" "$(stat conc-hot releases)" "$(logged "outcome = 'new' AND variant = 2")"
echo "conc-hot outcomes: $(q "SELECT string_agg(outcome || '=' || n, ' ' ORDER BY outcome)
	FROM (SELECT outcome, count(*) AS n FROM hot_log GROUP BY outcome) s")"

# Contention must really have happened for phase 3 to mean anything
for o in new replay in_progress mismatch; do
	if [ "$(logged "outcome = '$o'")" -eq 0 ]; then
		echo "FAIL: phase 3 produced no $o outcome"
		fail=1
	fi
done

exit $fail
