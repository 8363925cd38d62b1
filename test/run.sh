#!/usr/bin/env bash
# The whole test suite: `bash test/run.sh` (as root or a user with sudo).
#
# A thin wrapper around PGXS's own targets.  It installs what is missing
# (apt-get), builds with -Werror, installs, and starts a throwaway cluster,
# first WITHOUT the library preloaded, as packagers run `make installcheck`
# (pg_buildext installcheck, PGXN testers):
#   stock/regress     make installcheck ISOLATION=   (sql/, expected/; the
#                     tests that need preloading print "skipped: why" and
#                     count as skipped)
#   stock/isolation   make installcheck REGRESS=     (specs/, expected/)
# then the preloaded pass, `make installcheck-preloaded` (a temporary
# instance of the server's own, with test/preload.conf: the library
# preloaded and the worker running, as pg_cron's Makefile tests):
#   regress           the same tests, where a test that skips itself fails
#   isolation         the same
# and restarts the suite's cluster with shared_preload_libraries =
# 'idempotency' for:
#   script/NAME       test/scripts/NAME.sh against that cluster (storms,
#                     cross-checks, examples); exit 77 means skipped, the
#                     script's last line saying why
#   tap               make prove_installcheck (test/t/*.pl; each file starts
#                     servers of its own)
#
# It goes by each target's exit status and reads the output only to count:
# pg_regress and pg_isolation_regress lines of every version ("test x ... ok"
# up to 15, "ok 1 - x  12 ms" / "not ok" from 16 on), TAP assertions ("ok N",
# "not ok N", "# skip"), TAP files that skip as a whole ("1..0 # SKIP why").
# A group whose target fails without a counted failure, a group that ran no
# test, and a regress group that reported fewer tests than it has files all
# count as failed.  Skipped tests are listed with their reason and never
# count as passed.  The last line is "N passed, N failed, N skipped"; the
# exit status is non-zero on any failure and when nothing passed.
#
# Environment:
#   PGVER=15            the Debian PostgreSQL major version to use (15, 17, 18, 19)
#   IDEM_PG_CONFIG=...  build and run against another server build (e.g. one
#                       configured with --enable-cassert) instead of PGVER's
#   IDEM_ONLY=regress|isolation|scripts|clients|tap   run one group (regress
#                       and isolation run on the stock and the preloaded
#                       cluster; clients is the scripts that test the client
#                       libraries: client_*, clients_*, consumer_*, pgbouncer)
#   IDEM_SCRIPTS=PATTERN   only the test/scripts/*.sh whose name (without .sh)
#                       matches the extended regular expression PATTERN
#   IDEM_KEEP=1         keep the temp directory (logs, diffs, results)
#   IDEM_VALGRIND=1     run the suite's server under valgrind's memcheck
#                       (test/valgrind.supp) and fail on any error it reports
#                       (the preloaded pass then runs on the suite's cluster,
#                       restarted under valgrind, not on a temporary instance);
#                       use it with IDEM_ONLY=regress or isolation (the TAP
#                       tests start servers of their own, and the storms get slow)

source "$(dirname "$0")/lib.sh"

IDEM_PACKAGES+=(libipc-run-perl nodejs curl python3 python3-psycopg git)
# The client libraries (clients/*/test.sh; their demos in client_*.sh,
# clients_cross.sh, pgbouncer.sh): their dependencies come from PyPI, npm,
# the Go module proxy and Maven Central into caches; socat relays TCP for
# JDBC where the cluster has a unix socket only; npm comes with some nodejs
# builds.  Go: any installed go (this image's /usr/local/go) is used, Go 1.21
# and later fetching the toolchain clients/go/go.mod names themselves; with
# none, Debian's golang-go (1.19, too old for pgx v5) only downloads that
# toolchain through the module proxy (test/scripts/lib/go_toolchain.sh).
IDEM_PACKAGES+=(python3-venv default-jdk-headless maven socat pgbouncer)
command -v npm >/dev/null || IDEM_PACKAGES+=(npm)
command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || IDEM_PACKAGES+=(golang-go)
# The postgres_exporter queries file's check (test/scripts/monitoring_queries.sh)
IDEM_PACKAGES+=(python3-yaml)
# The throwaway RabbitMQ node of the consumer tests (test/scripts/lib/rabbitmq.sh)
IDEM_PACKAGES+=(rabbitmq-server)

# The worker stays paused on the suite's cluster: the SQL tests create expired
# and overdue records on purpose and look at them.  The worker's own tests
# (test/t/02*) start clusters of their own with it running.
idem_setup "idempotency.enabled = off" "shared_preload_libraries = ''"
# Not every suite has every package (no postgresql-19-cron in experimental)
idem_install_optional "postgresql-$PGVER-cron"
# The client libraries' caches (PyPI, npm, the Go module proxy, Maven
# Central), kept between runs on one machine, belong to the user the
# scripts run as, whoever made them first
as_root mkdir -p /var/tmp/idempotency-cache
as_root chown -R "$(idem_test_user)" /var/tmp/idempotency-cache

source "$(dirname "$0")/count.sh"

# make TARGET in the work copy as the test user; output to the terminal and LOG
run_make() {
	local log=$1
	shift
	set +e
	as_test_user make -C "$IDEM_SRC" --no-print-directory PG_CONFIG="$PG_CONFIG" "$@" \
		2>&1 | tee "$log"
	local rc=${PIPESTATUS[0]}
	set -e
	return "$rc"
}

# The tests of the last regress run that skipped themselves: a line
# "skipped NAME: why" each, from the "skipped: why" line of their results
regress_skips() {
	local f
	shopt -s nullglob
	for f in "$IDEM_SRC"/results/*.out; do
		sed -n "s/^skipped: \(.*\)$/skipped $(basename "$f" .out): \1/p" "$f" | head -n 1
	done
	shopt -u nullglob
}

# make TARGET (installcheck over the running cluster, or
# installcheck-preloaded on a temporary instance) for one kind of test.
# With skips=fail (a preloading server) a test that skipped itself fails.
run_regress() {
	local group=$1 files=$2 diffs=$3 skips=$4 target=$5 rc=0 line
	shift 5
	echo "== $group: make $target $* ($(date -u '+%H:%M:%S'))"
	local log=$IDEM_WORK/${group//\//-}.log
	as_test_user rm -rf "$IDEM_SRC/results"
	run_make "$log" "$target" "$@" || rc=$?
	while IFS= read -r line; do
		[ -n "$line" ] || continue
		if [ "$skips" = fail ]; then
			echo "$line (on a server that preloads the library)"
			result "$group/${line#skipped }" 1
		else
			echo "$line" | tee -a "$log"
		fi
	done < <(regress_skips)
	count_regress "$group" "$log" "$rc" "$files"
	if [ -s "$IDEM_SRC/$diffs" ]; then
		echo "== $group: $diffs"
		cat "$IDEM_SRC/$diffs"
		as_test_user cp "$IDEM_SRC/$diffs" "$IDEM_WORK/${group//\//-}.diffs"
		as_test_user rm -f "$IDEM_SRC/$diffs"
	fi
}

# Both installcheck groups with make TARGET; skips says what a test that
# skips itself counts as (skip, or fail)
run_installcheck() {
	local prefix=$1 skips=$2 target=$3 n_sql n_spec
	n_sql=$(find "$IDEM_SRC/sql" -maxdepth 1 -name '*.sql' | wc -l)
	n_spec=$(find "$IDEM_SRC/specs" -maxdepth 1 -name '*.spec' | wc -l)
	if [ "$only" = all ] || [ "$only" = regress ]; then
		run_regress "${prefix}regress" "$n_sql" regression.diffs "$skips" "$target" ISOLATION=
	fi
	if [ "$only" = all ] || [ "$only" = isolation ]; then
		run_regress "${prefix}isolation" "$n_spec" output_iso/regression.diffs \
			"$skips" "$target" REGRESS=
	fi
}

# The scripts that test the client libraries (IDEM_ONLY=clients)
client_script() {
	[[ $1 =~ ^(client_|clients_|consumer_|pgbouncer$) ]]
}

# Run each test/scripts/*.sh against the running cluster (with
# IDEM_ONLY=clients only the client libraries' scripts)
run_scripts() {
	local f name rc log
	for f in "$IDEM_SRC"/test/scripts/*.sh; do
		[ -e "$f" ] || continue
		name=$(basename "$f" .sh)
		if [ "$only" = clients ] && ! client_script "$name"; then continue; fi
		if [ -n "${IDEM_SCRIPTS:-}" ] && ! [[ $name =~ $IDEM_SCRIPTS ]]; then continue; fi
		log=$IDEM_WORK/script-$name.log
		echo "== script $name ($(date -u '+%H:%M:%S'))"
		set +e
		(cd "$IDEM_SRC" && as_test_user bash "$f") >"$log" 2>&1
		rc=$?
		set -e
		sed 's/^/   /' "$log" || true
		case "$rc" in
			0) echo "script $name ... ok" ;;
			77) echo "script $name ... skipped" ;;
			*) echo "script $name ... FAILED (exit $rc)" ;;
		esac
		if [ "$rc" = 77 ]; then
			result "script/$name" skip "$(tail -n 1 "$log")"
		else
			result "script/$name" "$rc"
		fi
	done
}

# make prove_installcheck, all of test/t/*.pl in one prove run
run_tap() {
	local log=$IDEM_WORK/tap.log rc=0 files
	files=$(find "$IDEM_SRC/test/t" -maxdepth 1 -name '*.pl' | wc -l)
	echo "== tap: make prove_installcheck ($(date -u '+%H:%M:%S'))"
	run_make "$log" prove_installcheck PROVE_FLAGS=-v >/dev/null || rc=$?
	sed 's/^/   /' "$log" || true
	count_tap tap "$log" "$rc" "$files"
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
case "$only" in
	all | regress | isolation | scripts | clients | tap) ;;
	*)
		echo "IDEM_ONLY must be regress, isolation, scripts, clients or tap, not \"$only\"" >&2
		exit 2
		;;
esac

# The client libraries' toolchains (test/toolchains.sh), checked before any
# test runs where the scripts will need them
if [ "$only" = all ] || [ "$only" = scripts ] || [ "$only" = clients ]; then
	source "$(dirname "$0")/toolchains.sh"
	echo "== toolchains ($(date -u '+%H:%M:%S'))"
	if ! idem_toolchains; then
		echo "== a toolchain the client libraries need is missing (above); nothing was run" >&2
		exit 1
	fi
fi

# As packagers run it: the library is not preloaded, and the tests that
# need it skip themselves
run_installcheck stock/ skip installcheck
# Preloaded, with the worker running: every test runs, and a server that
# lost the setting fails them.  On a temporary instance of its own (make
# installcheck-preloaded), but under valgrind on the suite's cluster.
if [ "${IDEM_VALGRIND:-0}" = 1 ]; then
	idem_restart_cluster "shared_preload_libraries = 'idempotency'"
	run_installcheck "" fail installcheck
else
	run_installcheck "" fail installcheck-preloaded
fi
if [ "$only" = all ] || [ "$only" = scripts ] || [ "$only" = clients ]; then
	[ "${IDEM_VALGRIND:-0}" = 1 ] ||
		idem_restart_cluster "shared_preload_libraries = 'idempotency'"
	run_scripts
fi
if [ "$only" = all ] || [ "$only" = tap ]; then
	run_tap
fi

if [ "${IDEM_VALGRIND:-0}" = 1 ]; then
	check_valgrind
fi

echo "== done ($(date -u '+%H:%M:%S'))"
print_counts
