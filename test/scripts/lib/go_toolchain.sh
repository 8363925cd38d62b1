# A Go new enough for clients/go/go.mod, first on PATH.  Sourced by the
# scripts that build the Go package or its demo.
#
# Go 1.21 and later read go.mod's "go" line and, with GOTOOLCHAIN=auto (the
# default), fetch a newer toolchain themselves from the Go module proxy.
# Debian 12's golang-go is Go 1.19, which does not: it is used only to
# download the golang.org/toolchain module of that version through the
# proxy (checked against the checksum database, like any module) into
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go-toolchain, and that
# toolchain is used.

# go_toolchain DIR: DIR holds the go.mod to satisfy
go_toolchain() {
	local gomod=$1/go.mod go have want cache arch dir
	go=$(command -v go || true)
	for dir in /usr/local/go/bin /usr/lib/go/bin; do
		[ -n "$go" ] || ! [ -x "$dir/go" ] || go=$dir/go
	done
	if [ -z "$go" ]; then
		echo "FAIL: no go on PATH, in /usr/local/go/bin or in /usr/lib/go/bin (Debian: golang-go)"
		return 1
	fi
	have=$("$go" env GOVERSION)
	export PATH=$(dirname "$go"):$PATH
	if [ "$(printf '%s\n' go1.21 "$have" | sort -V | head -1)" = go1.21 ]; then
		export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
		echo "go: $have ($go), GOTOOLCHAIN=$GOTOOLCHAIN"
		return 0
	fi
	want=$(sed -n 's/^go \([0-9][0-9.]*\).*/\1/p' "$gomod")
	[ "$(tr -cd . <<<"$want")" = . ] && want=$want.0
	cache=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go-toolchain
	arch=$("$go" env GOARCH)
	dir=$cache/mod/golang.org/toolchain@v0.0.1-go$want.linux-$arch
	if ! [ -x "$dir/bin/go" ]; then
		echo "go: $have ($go) is older than 1.21; fetching go$want from the Go module proxy"
		mkdir -p "$cache"
		GOPATH=$cache GOMODCACHE=$cache/mod GOCACHE=$cache/build GOFLAGS=-modcacherw GO111MODULE=on \
			"$go" mod download "golang.org/toolchain@v0.0.1-go$want.linux-$arch" || return 1
		# Module zips keep no file modes
		chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
	fi
	export PATH=$dir/bin:$PATH GOTOOLCHAIN=local
	echo "go: $(go env GOVERSION) ($dir/bin/go)"
}
