#!/usr/bin/env bash
# Race on brand-new keys: 16 connections for 8 seconds, all reserving the
# same key at the same moment (the key changes every millisecond),
# with idem_reserve and with idem_consume.  Every attempt finds the key
# absent or just taken, which is the path where a reservation that found
# nothing takes the key lock and reads again before it inserts.  Without
# that second read, a second inserter would reach the unique index and its
# client would abort with a duplicate-key error (or wait).
#
# Checks: no client error, and each key got exactly one "new" (reserve) or
# one true (consume), as many as there are records.
set -euo pipefail

db=idem_race
dropdb --if-exists "$db" 2>/dev/null
createdb "$db"
psql -X -q -v ON_ERROR_STOP=1 -d "$db" <<'SQL'
CREATE EXTENSION idempotency;
CREATE TABLE race_outcomes (kind text NOT NULL, won boolean NOT NULL);
SQL

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/reserve.sql" <<'PGB'
INSERT INTO race_outcomes
SELECT 'reserve', outcome = 'new'
FROM idem_reserve('race', 'k-' || (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
PGB
cat >"$dir/consume.sql" <<'PGB'
INSERT INTO race_outcomes
SELECT 'consume', coalesce(idem_consume('race', 'm-' || (extract(epoch FROM clock_timestamp()) * 1000)::bigint), false);
PGB

rc=0
pgbench -n -c 16 -j 2 -T 8 -f "$dir/reserve.sql" -f "$dir/consume.sql" "$db" \
	>"$dir/pgbench.log" 2>&1 || rc=1
grep -E 'number of (transactions actually processed|failed)' "$dir/pgbench.log" | sed 's/^/  /'
if grep -qE 'aborted|ERROR' "$dir/pgbench.log"; then
	echo "client errors:"; grep -E 'ERROR|aborted' "$dir/pgbench.log" | head -5; rc=1
fi

psql -X -q -v ON_ERROR_STOP=1 -d "$db" -At <<'SQL' >"$dir/check"
SELECT 'reserve attempts: ' || count(*) FROM race_outcomes WHERE kind = 'reserve';
SELECT 'reserve: winners minus records: ' ||
	(SELECT count(*) FROM race_outcomes WHERE kind = 'reserve' AND won) -
	(SELECT count(*) FROM idem_keys WHERE operation = 'race' AND scope = '');
SELECT 'consume: winners minus records: ' ||
	(SELECT count(*) FROM race_outcomes WHERE kind = 'consume' AND won) -
	(SELECT count(*) FROM idem_keys WHERE operation = 'race' AND scope = 'idem:consume');
SELECT 'contested reserves: ' || (count(*) > 1000) FROM race_outcomes WHERE kind = 'reserve' AND NOT won;
SQL
cat "$dir/check"
grep -qE '^reserve: winners minus records: 0$' "$dir/check" || rc=1
grep -qE '^consume: winners minus records: 0$' "$dir/check" || rc=1
# the race must really have been run: many attempts lost to another client
grep -qE '^contested reserves: true$' "$dir/check" || rc=1
dropdb "$db"
exit $rc
