#!/usr/bin/env bash
# clients/java/demo/start.sh ARGS...: build the Java demo (a Spring Boot
# executable jar) if its sources changed, then exec it in the foreground
# with ARGS (--port N, --port-file F, --max-seconds S, --bench).  It connects
# to JDBC_URL, or without it to 127.0.0.1:$PGPORT/$PGDATABASE as $PGUSER.
# The build uses Maven's repository under
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/maven (offline when it is
# warm) and keeps the jar in .../java-demo/<hash of the sources>, so the tree
# may be read-only and two trees sharing the cache each run their own.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
cache=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}
if ! mkdir -p "$cache/java-demo" "$cache/maven" 2>/dev/null || ! [ -w "$cache/java-demo" ] || ! [ -w "$cache/maven" ]; then
	cache=${TMPDIR:-/tmp}/idempotency-cache-$(id -u)
	mkdir -p "$cache/java-demo" "$cache/maven"
fi
hash=$(cd "$root" && find . -name target -prune -o -type f \
	\( -name '*.java' -o -name pom.xml -o -name '*.imports' -o -name '*.properties' \) -print0 |
	sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
out=$cache/java-demo/$hash
jar=$out/idempotency-demo.jar
mkdir -p "$out"

if ! [ -s "$jar" ]; then
	exec 9>"$out/build.lock"
	flock 9
	if ! [ -s "$jar" ]; then
		src=$(mktemp -d "${TMPDIR:-/tmp}/idem-java-demo.XXXXXX")
		trap 'rm -rf "$src"' EXIT
		cp -r "$root/pom.xml" "$root/idempotency-core" "$root/idempotency-servlet" \
			"$root/idempotency-spring-boot-starter" "$root/demo" "$src/"
		find "$src" -name target -type d -prune -exec rm -rf {} +
		mvn=(nice -n 10 mvn -B -q -ntp "-Dmaven.repo.local=$cache/maven/repository" -Dmaven.test.skip=true
			-Dmaven.javadoc.skip=true -f "$src/pom.xml" -pl demo -am package)
		"${mvn[@]}" -o >"$src/build.log" 2>&1 || "${mvn[@]}" >"$src/build.log" 2>&1 || {
			tail -30 "$src/build.log" >&2
			echo "start.sh: could not build the Java demo" >&2
			exit 1
		}
		cp "$src/demo/target/idempotency-demo.jar" "$jar.tmp"
		mv "$jar.tmp" "$jar"
		rm -rf "$src"
		trap - EXIT
	fi
	exec 9>&-
fi

# shellcheck disable=SC2086
exec java ${JAVA_OPTS:-} -jar "$jar" "$@"
