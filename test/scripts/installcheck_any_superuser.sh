#!/usr/bin/env bash
# `make installcheck` passes on a server whose bootstrap superuser is not
# called postgres, with the library preloaded and the worker running, as on
# a packager's or a user's own cluster: no expected output may print the
# superuser's name.  A cluster of its own (initdb -U regress_bootstrap), on
# a unix socket in a temp directory; the pg_regress tests and the isolation
# specs, in a copy of the tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${PGBIN:-$(dirname "$(command -v pg_ctl)")}
tmp=$(mktemp -d)
port=$((56400 + $$ % 500))
cleanup() {
	local rc=$?
	"$bin/pg_ctl" -D "$tmp/data" -m immediate stop >/dev/null 2>&1 || true
	rm -rf "$tmp"
	exit $rc
}
trap cleanup EXIT

"$bin/initdb" -U regress_bootstrap -D "$tmp/data" >"$tmp/initdb.log" 2>&1 ||
	{ cat "$tmp/initdb.log"; exit 1; }
cat >>"$tmp/data/postgresql.conf" <<EOF
shared_preload_libraries = 'idempotency'
listen_addresses = ''
unix_socket_directories = '$tmp'
port = $port
EOF
"$bin/pg_ctl" -D "$tmp/data" -l "$tmp/server.log" -w start >/dev/null
mkdir "$tmp/src"
cp -r Makefile idempotency.control sql specs expected "$tmp/src/"
status=0
make -C "$tmp/src" --no-print-directory PG_CONFIG="$bin/pg_config" \
	PGHOST="$tmp" PGPORT="$port" PGUSER=regress_bootstrap \
	installcheck >"$tmp/installcheck.log" 2>&1 || status=$?
cat "$tmp/installcheck.log"
if [ "$status" != 0 ]; then
	cat "$tmp/src/regression.diffs" "$tmp/src/output_iso/regression.diffs" 2>/dev/null || true
	echo "FAIL: make installcheck with bootstrap superuser regress_bootstrap (exit $status)"
	exit 1
fi
[ "$(grep -c "tests passed" "$tmp/installcheck.log")" = 2 ] ||
	{ echo "FAIL: pg_regress and pg_isolation_regress did not both report their tests passed"; exit 1; }
echo "ok: make installcheck passes with bootstrap superuser regress_bootstrap and the worker running"
