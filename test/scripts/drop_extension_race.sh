#!/usr/bin/env bash
# 100,000 calls of the functions that return rows (idem_reserve, its
# composite-returning spelling through SELECT *, and idem_lookup) racing a
# loop of DROP EXTENSION / CREATE EXTENSION in the same database.  A call
# either works or fails cleanly (the function does not exist, the table is
# gone): never XX000.  With the result declared as the composite type
# idem_reservation or as SETOF idem_keys, PostgreSQL opened that type's
# relation for the result after parse analysis had found the function,
# without a lock that keeps it, and about one call in 36,000 failed with
# XX000 "could not open relation with OID ..." (issue 22, item 6); with OUT
# parameters no relation is opened for the result.
#
# CALLS (default 100000) calls over CLIENTS (default 4) psql sessions.
set -euo pipefail

calls=${CALLS:-100000}
clients=${CLIENTS:-4}
db=idem_drop_race
dropdb --if-exists "$db" 2>/dev/null
createdb "$db"
psql -X -q -v ON_ERROR_STOP=1 -d "$db" -c 'CREATE EXTENSION idempotency'

dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT

# Each client's statements, one call each, errors reported and passed
per=$((calls / clients))
for c in $(seq 1 "$clients"); do
	{
		echo '\set VERBOSITY verbose'
		echo '\set ON_ERROR_STOP 0'
		for i in $(seq 1 3 "$per"); do
			echo "SELECT * FROM idem_reserve('race', 'k$c-$i');"
			echo "SELECT outcome FROM idem_reserve('race', 'k$c-$i');"
			echo "SELECT * FROM idem_lookup('race', 'k$c-$i');"
		done
	} >"$dir/client$c.sql"
done

# The DDL loop, until the clients are done
(
	while [ ! -e "$dir/done" ]; do
		# in one transaction: a call finds the extension, or waits for
		# the drop's locks and then finds it gone or new
		psql -X -q -d "$db" -c 'BEGIN' -c 'DROP EXTENSION IF EXISTS idempotency' \
			-c 'CREATE EXTENSION idempotency' -c 'COMMIT' >/dev/null 2>&1 || true
		sleep 0.05
	done
) &
ddl=$!

pids=()
for c in $(seq 1 "$clients"); do
	psql -X -q -d "$db" -f "$dir/client$c.sql" >/dev/null 2>"$dir/client$c.err" &
	pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done
touch "$dir/done"
wait "$ddl" || true

cat "$dir"/client*.err >"$dir/errors"
made=$(cat "$dir"/client*.sql | grep -c '^SELECT')
errors=$(grep -c '^psql:.*ERROR:' "$dir/errors" || true)
echo "calls: $made, failed cleanly or not: $errors"
# The SQLSTATEs, most frequent first
grep -o 'ERROR:  [0-9A-Z]\{5\}: .*' "$dir/errors" | sed 's/"[^"]*"/"..."/g; s/\(OID\|key\) [0-9]*/\1 N/g' |
	sort | uniq -c | sort -rn | head -10 | sed 's/^/  /'

rc=0
if grep -q 'ERROR:  XX000' "$dir/errors"; then
	echo "FAIL: XX000 racing DROP EXTENSION:"
	grep 'ERROR:  XX000' "$dir/errors" | head -5
	rc=1
fi
if [ "$errors" -lt 100 ]; then
	echo "FAIL: only $errors calls failed: the DROP EXTENSION loop did not race the calls"
	rc=1
fi
if grep -qE 'terminated by signal|server closed the connection' "$dir/errors"; then
	echo "FAIL: a backend crashed"
	rc=1
fi
dropdb "$db" 2>/dev/null || true
[ $rc = 0 ] && echo "ok: $made calls racing DROP/CREATE EXTENSION, no XX000"
exit $rc
