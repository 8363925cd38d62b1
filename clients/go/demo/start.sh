#!/usr/bin/env bash
# Builds the Go demo app (doc/clients.md, "The demo app") if needed and runs
# it in the foreground: start.sh [--port N] [--port-file F] [--max-seconds S]
# [--bench], with libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE).
# The binary and the Go caches live under
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go. Works from any cwd.
set -euo pipefail
GO_MODULE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$GO_MODULE_DIR/goenv.sh"
bin=$GO_CACHE_ROOT/bin/idempotency-demo
mkdir -p "$GO_CACHE_ROOT/bin"
# go build leaves an up-to-date binary alone; the lock keeps two starts from
# building over each other
(cd "$GO_MODULE_DIR" && flock "$GO_CACHE_ROOT/bin/.lock" nice -n 10 "$GO_BIN" build -o "$bin" ./demo)
exec "$bin" "$@"
