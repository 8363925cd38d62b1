# Sourced by test.sh and demo/start.sh: finds a Go toolchain new enough for
# go.mod's go directive and keeps every Go cache under
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go.

GO_NEED=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$GO_MODULE_DIR/go.mod")
GO_BIN=${GO:-$(command -v go || true)}
if [ -z "$GO_BIN" ] && [ -x /usr/local/go/bin/go ]; then
	GO_BIN=/usr/local/go/bin/go
fi
if [ -z "$GO_BIN" ]; then
	echo "clients/go: no Go toolchain found (go on PATH, /usr/local/go/bin/go or \$GO); Go $GO_NEED or later is needed" >&2
	exit 1
fi
GO_HAVE=$(GOTOOLCHAIN=local "$GO_BIN" env GOVERSION 2>/dev/null | sed 's/^go//')
if [ -z "$GO_HAVE" ] || [ "$(printf '%s\n%s\n' "$GO_NEED" "$GO_HAVE" | sort -V | head -n1)" != "$GO_NEED" ]; then
	echo "clients/go: $GO_BIN is Go ${GO_HAVE:-(unknown)}; go.mod needs Go $GO_NEED or later" >&2
	exit 1
fi

GO_CACHE_ROOT=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go
mkdir -p "$GO_CACHE_ROOT"
export GOPATH=$GO_CACHE_ROOT/gopath
export GOMODCACHE=$GO_CACHE_ROOT/mod
export GOCACHE=$GO_CACHE_ROOT/build
export GOTOOLCHAIN=local
export GOFLAGS="-modcacherw -mod=readonly"
