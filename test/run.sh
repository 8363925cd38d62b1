#!/usr/bin/env bash
# The whole test suite: `bash test/run.sh` (as root or a user with sudo).
#
# Installs what is missing, builds with -Werror, installs, starts a throwaway
# cluster and runs, in order: pg_regress (test/sql/, test/expected/), the isolation
# specs (test/specs/), the scripted checks (test/scripts/*.sh: storms,
# cross-checks, examples) and the TAP tests (test/t/*.pl).  Prints every
# result and ends with "N passed, N failed"; exits non-zero on any failure.
#
# Environment: IDEM_KEEP=1 keeps the temp directory (logs, diffs);
# IDEM_ONLY=regress|isolation|scripts|tap runs one group; IDEM_VALGRIND=1
# runs the suite's server under valgrind's memcheck (test/valgrind.supp) and
# fails on any error it reports: use it with IDEM_ONLY=regress or isolation
# (the TAP tests start servers of their own, and the storms get slow).
# IDEM_PG_CONFIG=/path/to/pg_config builds and runs against another server
# build, such as one configured with --enable-cassert.

source "$(dirname "$0")/lib.sh"

IDEM_PACKAGES+=(libipc-run-perl nodejs curl python3 python3-psycopg python3-psycopg-pool
	"postgresql-$PGVER-cron")
# The HTTP clients (test/scripts/client_*.sh); npm comes with some nodejs builds
IDEM_PACKAGES+=(golang-go golang-github-jackc-pgx-v4-dev default-jdk-headless
	libpostgresql-jdbc-java socat)
command -v npm >/dev/null || IDEM_PACKAGES+=(npm)

# The worker stays paused on the suite's cluster: the SQL tests create expired
# and overdue records on purpose and look at them.  The worker's own tests
# (test/t/02*) start clusters of their own with it running.
idem_setup "idempotency.enabled = off"

PASSED=0
FAILED=0
FAILED_NAMES=()

# Record a result line
result() {
	local name=$1 ok=$2
	if [ "$ok" = 0 ]; then
		PASSED=$((PASSED + 1))
	else
		FAILED=$((FAILED + 1))
		FAILED_NAMES+=("$name")
	fi
}

# Count the "... ok" and "... FAILED" lines a pg_regress run printed
count_regress() {
	local log=$1 group=$2 line name
	while IFS= read -r line; do
		name=$(sed -E 's/^[[:space:]]*(test[[:space:]]+)?([^ ]+).*/\2/' <<<"$line")
		case "$line" in
			*"... ok"*) result "$group/$name" 0 ;;
			*) result "$group/$name" 1 ;;
		esac
	done < <(grep -E '\.\.\. (ok|FAILED|failed)' "$log")
}

# Run pg_regress or pg_isolation_regress over globbed tests
run_regress() {
	local group=$1 driver=$2 inputdir=$3 pattern=$4 tests=()
	local f
	for f in $inputdir/$pattern; do
		case "$f" in */idempotency--*) continue ;; esac
		[ -e "$f" ] && tests+=("$(basename "${f%.*}")")
	done
	[ ${#tests[@]} -eq 0 ] && return 0
	echo "== $group: ${#tests[@]} tests"
	local out=$IDEM_WORK/out-$group
	as_test_user mkdir -p "$out"
	as_test_user "$driver" --bindir="$PGBIN" --inputdir="$inputdir" \
		--outputdir="$out" --load-extension=idempotency --dbname="idem_$group" \
		"${tests[@]}" 2>&1 | tee "$IDEM_WORK/$group.log" || true
	count_regress "$IDEM_WORK/$group.log" "$group"
	if ! grep -qE '\.\.\. (ok|FAILED|failed)' "$IDEM_WORK/$group.log"; then
		result "$group (did not run)" 1
	fi
	if [ -s "$out/regression.diffs" ]; then
		echo "== $group: regression.diffs"
		cat "$out/regression.diffs"
	fi
}

# Run each test/scripts/*.sh against the running cluster
run_scripts() {
	local f name rc
	for f in "$IDEM_SRC"/test/scripts/*.sh; do
		[ -e "$f" ] || continue
		name=$(basename "$f" .sh)
		echo "== script $name"
		set +e
		(cd "$IDEM_SRC" && as_test_user bash "$f") 2>&1 | sed 's/^/   /'
		rc=${PIPESTATUS[0]}
		set -e
		if [ "$rc" = 0 ]; then echo "script $name ... ok"; else echo "script $name ... FAILED (exit $rc)"; fi
		result "script/$name" "$rc"
	done
}

# Run the TAP tests with prove; every assertion counts, a file that dies counts once more
run_tap() {
	local f name log rc n_ok n_fail
	for f in "$IDEM_SRC"/test/t/*.pl; do
		[ -e "$f" ] || continue
		name=$(basename "$f" .pl)
		log=$IDEM_WORK/tap-$name.log
		echo "== tap $name"
		as_test_user mkdir -p "$IDEM_WORK/tap-$name"
		set +e
		(cd "$IDEM_SRC/test" && as_test_user env TESTDIR="$IDEM_WORK/tap-$name" \
			PERL5LIB="$PGXS_TEST/perl" PG_REGRESS="$PGXS_TEST/regress/pg_regress" \
			prove -v "t/$name.pl") >"$log" 2>&1
		rc=$?
		set -e
		sed 's/^/   /' "$log"
		n_ok=$(grep -cE '^ok [0-9]+' "$log" || true)
		n_fail=$(grep -cE '^not ok [0-9]+' "$log" || true)
		PASSED=$((PASSED + n_ok))
		FAILED=$((FAILED + n_fail))
		[ "$n_fail" -gt 0 ] && FAILED_NAMES+=("tap/$name")
		if [ "$rc" != 0 ] && [ "$n_fail" = 0 ]; then
			result "tap/$name (exit $rc)" 1
		fi
	done
}

# Under IDEM_VALGRIND=1: every error memcheck reported in a server process
check_valgrind() {
	local logs=() n
	shopt -s nullglob
	logs=("$IDEM_WORK"/valgrind/*.log)
	shopt -u nullglob
	if [ ${#logs[@]} -eq 0 ]; then
		result "valgrind (no logs: did the server run under it?)" 1
		return
	fi
	n=$(cat "${logs[@]}" | grep -cE '^==[0-9]+== [A-Z]' || true)
	echo "== valgrind: $n errors reported by ${#logs[@]} server processes"
	if [ "$n" -gt 0 ]; then
		grep -hE -A24 '^==[0-9]+== [A-Z]' "${logs[@]}" | head -300
	fi
	result "valgrind" "$([ "$n" = 0 ] && echo 0 || echo 1)"
}

only=${IDEM_ONLY:-all}
if [ "$only" = all ] || [ "$only" = regress ]; then
	run_regress regress "$PGXS_TEST/regress/pg_regress" "$IDEM_SRC/test" 'sql/*.sql'
fi
if [ "$only" = all ] || [ "$only" = isolation ]; then
	run_regress isolation "$PGXS_TEST/isolation/pg_isolation_regress" "$IDEM_SRC/test" 'specs/*.spec'
fi
if [ "$only" = all ] || [ "$only" = scripts ]; then
	run_scripts
fi
if [ "$only" = all ] || [ "$only" = tap ]; then
	run_tap
fi

if [ "${IDEM_VALGRIND:-0}" = 1 ]; then
	check_valgrind
fi

if [ ${#FAILED_NAMES[@]} -gt 0 ]; then
	echo "failed: ${FAILED_NAMES[*]}"
	IDEM_KEEP=${IDEM_KEEP:-0}
fi
echo "$PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ] && [ "$PASSED" -gt 0 ]
