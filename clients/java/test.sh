#!/usr/bin/env bash
# clients/java/test.sh: the Java client's tests and packaging checks, against
# the server of libpq's environment (PGHOST a socket directory, PGPORT, PGUSER
# a superuser), which has the idempotency extension installed (not created).
# JDBC speaks TCP only: the server must also listen on 127.0.0.1:$PGPORT.
#
# It creates the databases idem_java_test (the extension), idem_java_test_noext
# (none), idem_java_test_old (version 0.1.0) and idem_java_test_demo (the
# extension and clients/demo/schema.sql, for the demo's tests), fetches
# Maven's plugins and dependencies into
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/maven (once per set of
# POMs), then
# runs `mvn -o verify` (compile with -Werror, JUnit 5 tests, javadoc jars, the
# demo's executable jar) on a copy of the sources, so that the tree may be
# read-only.  Exits non-zero on any failure and when no test ran.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${PGPORT:?PGPORT must be set}" "${PGUSER:?PGUSER must be set}"

cache=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/maven
if ! mkdir -p "$cache" 2>/dev/null || ! [ -w "$cache" ]; then
	echo "test.sh: $cache is not writable; using a cache of this user's" >&2
	cache=${TMPDIR:-/tmp}/idempotency-cache-$(id -u)/maven
	mkdir -p "$cache"
fi
repo=$cache/repository

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-java-test.XXXXXX")
dbs=(idem_java_test idem_java_test_noext idem_java_test_old idem_java_test_demo)
psql_() { psql -X -q -v ON_ERROR_STOP=1 -d "${PGDATABASE:-postgres}" "$@"; }
# the test databases go with the run, so that no grant outlives it
cleanup() {
	local rc=$? db
	cd /
	rm -rf "$work"
	for db in "${dbs[@]}"; do psql_ -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true; done
	exit $rc
}
trap cleanup EXIT

for db in "${dbs[@]}"; do
	psql_ -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
done
psql -X -q -v ON_ERROR_STOP=1 -d idem_java_test -c "CREATE EXTENSION idempotency"
psql -X -q -v ON_ERROR_STOP=1 -d idem_java_test_old -c "CREATE EXTENSION idempotency VERSION '0.1.0'"
psql -X -q -v ON_ERROR_STOP=1 -d idem_java_test_demo -c "CREATE EXTENSION idempotency" \
	-f "$here/../demo/schema.sql" >/dev/null
if ! psql -X -q -h 127.0.0.1 -d idem_java_test -c "SELECT 1" >/dev/null; then
	echo "FAIL: the server does not accept TCP connections on 127.0.0.1:$PGPORT (JDBC needs them)"
	exit 1
fi

url="jdbc:postgresql://127.0.0.1:$PGPORT/idem_java_test?user=$PGUSER"
[ -n "${PGPASSWORD:-}" ] && url="$url&password=$PGPASSWORD"

cp -r "$here/pom.xml" "$here/LICENSE" "$here/idempotency-core" "$here/idempotency-servlet" \
	"$here/idempotency-spring-boot-starter" "$here/demo" "$work/"
find "$work" -name target -type d -prune -exec rm -rf {} +
cd "$work"

mvn=(nice -n 10 mvn -B -ntp "-Dmaven.repo.local=$repo" "-Didempotency.test.url=$url")

# Online: every plugin and dependency from Maven Central into the cache, the
# test runner's included (Surefire resolves it only when a test runs: the
# key parser's unit tests, which need no database).  Skipped when the cache
# was filled for these very POMs; the offline run fetches again if it finds
# something missing all the same.
fetch() {
	"${mvn[@]}" -q -Dtest=IdempotencyKeysTest -Dmaven.test.failure.ignore=true \
		-Dsurefire.failIfNoSpecifiedTests=false -Didempotency.failIfNoTests=false verify >"$work/fetch.log" 2>&1 || {
		tail -40 "$work/fetch.log"
		echo "FAIL: fetching and building the Java packages"
		exit 1
	}
	echo "$poms" >"$cache/fetched-poms.sha256"
}
poms=$(cat pom.xml ./*/pom.xml | sha256sum | cut -d' ' -f1)
[ "$(cat "$cache/fetched-poms.sha256" 2>/dev/null)" = "$poms" ] || fetch

# Offline: the real run
verify() {
	status=0
	"${mvn[@]}" -o -fae verify >"$work/verify.log" 2>&1 || status=1
}
verify
if [ "$status" != 0 ] && grep -q "in offline mode" "$work/verify.log"; then
	fetch
	verify
fi
grep -E "Tests run:|FAIL|BUILD|Building idem" "$work/verify.log" || true

# The totals of every module's "Results:" block
read -r run failed errors skipped < <(awk '
	/^\[(INFO|WARNING|ERROR)\] Results:/ { results = 1; next }
	results && match($0, /Tests run: [0-9]+, Failures: [0-9]+, Errors: [0-9]+, Skipped: [0-9]+/) {
		s = substr($0, RSTART, RLENGTH); gsub(/[^0-9,]/, "", s); split(s, v, ",")
		r += v[1]; f += v[2]; e += v[3]; k += v[4]; results = 0
	}
	END { print r + 0, f + 0, e + 0, k + 0 }' "$work/verify.log")
for jar in idempotency-core idempotency-servlet idempotency-spring-boot-starter; do
	if ! [ -s "$jar/target/$jar-0.1.0-javadoc.jar" ]; then
		echo "FAIL: no javadoc jar for $jar"
		status=1
	fi
done
if ! [ -s demo/target/idempotency-demo.jar ]; then
	echo "FAIL: no executable demo jar"
	status=1
fi
if [ "$run" = 0 ]; then
	echo "FAIL: no test ran"
	status=1
fi
[ "$status" = 0 ] || tail -60 "$work/verify.log"
echo "java: $((run - failed - errors - skipped)) passed, $((failed + errors)) failed, $skipped skipped"
exit "$status"
