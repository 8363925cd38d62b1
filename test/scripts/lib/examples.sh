# Shared by test/scripts/example_*.sh: each example gets a database of its
# own, created here and dropped on exit, and checks print "ok:" or "FAIL:"
# lines.  Sourced from the source tree's root (run_scripts cd's there).

set -euo pipefail

EX_FAILED=0
EX_PIDS=()
EX_ROLES=()
EX_TMP=

# Create the example's database (with the extension) and make it the default
ex_database() {
	EX_DB=$1
	dropdb --if-exists --force "$EX_DB" 2>/dev/null
	createdb "$EX_DB"
	export PGDATABASE=$EX_DB
	psql -X -q -v ON_ERROR_STOP=1 -c 'CREATE EXTENSION idempotency'
	trap ex_cleanup EXIT
}

# Stop what we started, drop the database, keep the exit status
ex_cleanup() {
	local rc=$? pid role
	for pid in "${EX_PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	dropdb --if-exists --force "$EX_DB" || true
	for role in "${EX_ROLES[@]}"; do
		dropuser --if-exists "$role" || true
	done
	[ -n "$EX_TMP" ] && rm -rf "$EX_TMP"
	exit $rc
}

# A scratch directory, removed on exit
ex_tmpdir() {
	EX_TMP=$(mktemp -d)
}

# Run SQL from a file or stdin, stopping at the first error
ex_sql() {
	psql -X -q -v ON_ERROR_STOP=1 "$@"
}

# One value from a query
ex_value() {
	psql -X -q -t -A -v ON_ERROR_STOP=1 -c "$1"
}

# Compare what we got with what we want
ex_check() {
	local what=$1 got=$2 want=$3
	if [ "$got" = "$want" ]; then
		echo "ok: $what: $got"
	else
		echo "FAIL: $what: got '$got', want '$want'"
		EX_FAILED=1
	fi
}

# Wait (bounded) until a query returns "t"
ex_wait_for() {
	local what=$1 query=$2 i
	for i in $(seq 1 100); do
		[ "$(ex_value "$query")" = t ] && return 0
		sleep 0.1
	done
	echo "FAIL: timed out waiting for $what"
	EX_FAILED=1
	return 1
}

# The exit status of the example
ex_finish() {
	if [ "$EX_FAILED" = 0 ]; then
		echo "all checks passed"
	else
		echo "some checks FAILED"
	fi
	return "$EX_FAILED"
}
