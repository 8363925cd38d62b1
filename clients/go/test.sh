#!/usr/bin/env bash
# The Go package's tests and packaging checks (CLIENTS.md): run as any user
# with libpq's environment (PGHOST, PGPORT, PGUSER a superuser, PGDATABASE)
# pointing at a server that has the extension installed. The tests create
# their own databases (idem_go_test*, idem_go_demo_test) and the extension
# in them. Dependencies come from the Go module proxy into
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go. Prints go test's
# results and "go: N passed, N failed, N skipped"; exits non-zero on any
# failure and when no test ran.
set -euo pipefail
GO_MODULE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$GO_MODULE_DIR/goenv.sh"
cd "$GO_MODULE_DIR"
export PGDATABASE=${PGDATABASE:-postgres}
echo "clients/go: $("$GO_BIN" version), caches in $GO_CACHE_ROOT"

fail=0
step() {
	echo "== $*"
	if ! nice -n 10 "$@"; then
		echo "FAIL: $*"
		fail=1
	fi
}

step "$GO_BIN" mod download
step "$GO_BIN" mod verify
step "$GO_BIN" mod tidy -diff
echo "== gofmt -l ."
if ! unformatted=$("$("$GO_BIN" env GOROOT)/bin/gofmt" -l . 2>&1) || [ -n "$unformatted" ]; then
	echo "FAIL: not gofmt-formatted: $unformatted"
	fail=1
fi
step "$GO_BIN" vet ./...
step "$GO_BIN" build -o "$GO_CACHE_ROOT/bin/idempotency-demo-check" ./demo

echo "== $GO_BIN test -count=1 -v ./..."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
nice -n 10 "$GO_BIN" test -count=1 -v ./... >"$log" 2>&1
rc=$?
set -e
# the failures in full, and go test's per-package lines
grep -v -E '^\s*(=== (RUN|PAUSE|CONT)|--- PASS|--- SKIP)' "$log" | grep -v -E '^\s*$' | sed -n '1,400p'
passed=$(grep -c -E '^--- PASS' "$log" || true)
failed=$(grep -c -E '^--- FAIL' "$log" || true)
skipped=$(grep -c -E '^--- SKIP' "$log" || true)
if [ "$rc" -ne 0 ]; then
	fail=1
	[ "$failed" -gt 0 ] || failed=1 # a build error or a TestMain failure
fi
if [ "$passed" -eq 0 ]; then
	echo "FAIL: no test ran"
	fail=1
fi
echo "go: $passed passed, $failed failed, $skipped skipped"
exit $fail
