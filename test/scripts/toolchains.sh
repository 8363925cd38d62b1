#!/usr/bin/env bash
# test/toolchains.sh on a machine whose node is Debian 12's Node.js 18: a
# node on PATH that says v18 makes idem_node_toolchain install Node.js 20
# from the npm registry into the cache and put it first on PATH; one that
# says v20 is kept.  (The real check ran before this script: test/run.sh.)
set -euo pipefail
source test/scripts/lib/examples.sh
IDEM_ROOT=$PWD
source test/toolchains.sh
as_test_user() { "$@"; }
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
real=$(command -v node)

# A node 18: the version it reports is 18, the rest is the real node's
printf '#!/bin/sh\n[ "$1" = --version ] && { echo v18.19.0; exit 0; }\nexec %s "$@"\n' "$real" >"$fake/node"
chmod +x "$fake/node"
out=$(PATH=$fake:$PATH; idem_node_toolchain && echo "node=$(command -v node) $(node --version)")
echo "$out"
ex_check "node 18 on PATH: Node.js 20 or later from the cache" \
	"$(sed -n 's|^node=.*/node20/node_modules/node/bin/node v\([0-9]*\)\..*|\1|p' <<<"$out" | awk '$1 >= 20 {print "yes"}')" yes

# A node 20 on PATH is used as it is
out=$(PATH=$(dirname "$real"):$PATH; idem_node_toolchain && echo "node=$(command -v node)")
ex_check "node 20 on PATH: used as it is" "$(sed -n 's/^node=//p' <<<"$out")" "$real"
ex_finish
