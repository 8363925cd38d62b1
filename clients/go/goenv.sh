# Sourced by test.sh and demo/start.sh (with GO_MODULE_DIR set): finds a Go
# toolchain at least as new as go.mod's go directive ($GO, else go on PATH,
# else /usr/local/go/bin/go: the first that is new enough), and keeps every
# Go cache under ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go. Never
# downloads a toolchain (GOTOOLCHAIN=local).

GO_NEED=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$GO_MODULE_DIR/go.mod")
GO_BIN=
go_found=
for candidate in ${GO:-} "$(command -v go || true)" /usr/local/go/bin/go; do
	[ -n "$candidate" ] && [ -x "$candidate" ] || continue
	have=$(GOTOOLCHAIN=local "$candidate" env GOVERSION 2>/dev/null | sed 's/^go//')
	go_found="$go_found $candidate (${have:-unknown version})"
	if [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$GO_NEED" "$have" | sort -V | head -n1)" = "$GO_NEED" ]; then
		GO_BIN=$candidate
		break
	fi
done
if [ -z "$GO_BIN" ]; then
	echo "clients/go: needs Go $GO_NEED or later (go.mod's go directive); found:${go_found:- no go at all (\$GO, PATH, /usr/local/go/bin/go)}" >&2
	exit 1
fi
unset go_found candidate have

GO_CACHE_ROOT=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go
if ! mkdir -p "$GO_CACHE_ROOT" || ! [ -w "$GO_CACHE_ROOT" ]; then
	echo "clients/go: cannot write the Go caches' directory $GO_CACHE_ROOT as $(id -un); set IDEM_CLIENT_CACHE to a writable directory" >&2
	exit 1
fi
export GOPATH=$GO_CACHE_ROOT/gopath
export GOMODCACHE=$GO_CACHE_ROOT/mod
export GOCACHE=$GO_CACHE_ROOT/build
export GOTOOLCHAIN=local
export GOFLAGS="-modcacherw -mod=readonly"
