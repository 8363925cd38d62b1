# A Go new enough for clients/go/go.mod, first on PATH.  Sourced by the
# scripts that build the Go package or its demo (clients/go/goenv.sh then
# takes the go on PATH, with GOTOOLCHAIN=local).
#
# The go found (on PATH, /usr/local/go/bin, Debian's /usr/lib/go/bin) is
# used when it is at least go.mod's "go" version.  An older one (Debian
# 12's golang-go is Go 1.19, too old for pgx v5) only downloads the
# golang.org/toolchain module of that version through the Go module proxy
# (checked against the checksum database like any module) into
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go-toolchain, and that
# toolchain is used: what Go 1.21+ does itself with GOTOOLCHAIN=auto.

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
	have=$(GOTOOLCHAIN=local "$go" env GOVERSION | sed 's/^go//')
	want=$(sed -n 's/^go \([0-9][0-9.]*\).*/\1/p' "$gomod")
	[ "$(tr -cd . <<<"$want")" = . ] && want=$want.0
	if [ "$(printf '%s\n' "$want" "$have" | sort -V | head -1)" = "$want" ]; then
		export PATH=$(dirname "$go"):$PATH
		echo "go: $have ($go)"
		return 0
	fi
	cache=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/go-toolchain
	arch=$(GOTOOLCHAIN=local "$go" env GOARCH)
	dir=$cache/mod/golang.org/toolchain@v0.0.1-go$want.linux-$arch
	if ! [ -x "$dir/bin/go" ]; then
		echo "go: $have ($go) is older than go.mod's $want; fetching go$want from the Go module proxy"
		mkdir -p "$cache"
		GOPATH=$cache GOMODCACHE=$cache/mod GOCACHE=$cache/build GOFLAGS=-modcacherw \
			GO111MODULE=on GOTOOLCHAIN=local \
			"$go" mod download "golang.org/toolchain@v0.0.1-go$want.linux-$arch" || return 1
		# Module zips keep no file modes
		chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/*
	fi
	export PATH=$dir/bin:$PATH
	echo "go: $(GOTOOLCHAIN=local go env GOVERSION) ($dir/bin/go)"
}
