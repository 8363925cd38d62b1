#!/usr/bin/env bash
# Builds the Go demo app (doc/clients.md, "The demo app") if needed and runs
# it in the foreground: start.sh [--port N] [--port-file F] [--max-seconds S]
# [--bench], with libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE).
# The binary (one per set of sources, so that two trees sharing the cache
# each run their own) and the Go caches live under
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go. Works from any cwd.
set -euo pipefail
GO_MODULE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$GO_MODULE_DIR/goenv.sh"
hash=$(cd "$GO_MODULE_DIR" && find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -print0 |
	sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
bin=$GO_CACHE_ROOT/bin/idempotency-demo-$hash
mkdir -p "$GO_CACHE_ROOT/bin"
# the lock keeps two starts from building over each other
if ! [ -x "$bin" ]; then
	(cd "$GO_MODULE_DIR" && flock "$GO_CACHE_ROOT/bin/.lock" nice -n 10 "$GO_BIN" build -o "$bin.tmp" ./demo &&
		mv "$bin.tmp" "$bin")
fi
exec "$bin" "$@"
