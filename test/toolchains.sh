# The toolchains the client libraries' tests need, checked before any test
# runs.  Sourced by test/run.sh after idem_setup (Debian's packages are
# installed by then); idem_toolchains prints one line per toolchain and
# fails with a message that says what to install where one is missing or
# too old, instead of a failure deep in a dependency later.
#
#   Node.js 20 or later: Fastify 5 and its dependencies require() ES
#     modules, which Node.js 18 (Debian 12's nodejs) cannot.  An older node
#     is not an error: Node.js 20 comes from the npm registry as the "node"
#     package (the official build, shipped inside the registry package) into
#     ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/node20, first on PATH
#     for the rest of the run.
#   Go: go.mod's version; an older go fetches that toolchain itself
#     (test/scripts/lib/go_toolchain.sh), so here it is only stated.
#   JDK 17 or later and Maven (Debian 12: default-jdk-headless, maven).
#   Python 3.10 or later with venv (Debian 12: python3, python3-venv).

IDEM_NODE_MAJOR=20
IDEM_JDK_MAJOR=17
IDEM_PYTHON_MIN=3.10

# The major version of the node on PATH, or 0
idem_node_major() {
	local v
	v=$(node --version 2>/dev/null) || { echo 0; return; }
	v=${v#v}
	echo "${v%%.*}"
}

# Node.js $IDEM_NODE_MAJOR or later first on PATH (exported)
idem_node_toolchain() {
	local have dir
	have=$(idem_node_major)
	if [ "$have" -ge "$IDEM_NODE_MAJOR" ]; then
		echo "toolchain node: $(node --version) ($(command -v node)); needs $IDEM_NODE_MAJOR or later"
		return 0
	fi
	dir=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/node$IDEM_NODE_MAJOR
	if ! [ -x "$dir/node_modules/node/bin/node" ]; then
		echo "toolchain node: ${have/#0/none} is older than $IDEM_NODE_MAJOR; installing node@$IDEM_NODE_MAJOR from the npm registry into $dir"
		if ! command -v npm >/dev/null; then
			echo "toolchain node: FAIL: npm is needed to install Node.js $IDEM_NODE_MAJOR (Debian: apt-get install npm)"
			return 1
		fi
		as_test_user mkdir -p "$dir"
		as_test_user npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
			"node@$IDEM_NODE_MAJOR" >/dev/null || {
			echo "toolchain node: FAIL: npm install node@$IDEM_NODE_MAJOR failed"
			return 1
		}
	fi
	export PATH=$dir/node_modules/node/bin:$PATH
	if [ "$(idem_node_major)" -lt "$IDEM_NODE_MAJOR" ]; then
		echo "toolchain node: FAIL: $dir holds no Node.js $IDEM_NODE_MAJOR after npm install node@$IDEM_NODE_MAJOR"
		return 1
	fi
	echo "toolchain node: $(node --version) ($(command -v node)); needs $IDEM_NODE_MAJOR or later"
}

# Every toolchain: a line each, non-zero when one cannot be had
idem_toolchains() {
	local rc=0 v want
	idem_node_toolchain || rc=1
	v=$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null || true)
	want=$(sed -n 's/^go \([0-9][0-9.]*\).*/\1/p' "$IDEM_ROOT/clients/go/go.mod")
	echo "toolchain go: ${v:-none} on PATH; clients/go needs go$want (fetched through the Go module proxy when older)"
	v=$(java -version 2>&1 | sed -n 's/.*version "\([0-9][0-9]*\).*/\1/p' | head -n 1)
	if [ "${v:-0}" -ge "$IDEM_JDK_MAJOR" ] && command -v mvn >/dev/null; then
		echo "toolchain java: JDK $v, $(mvn -B --version 2>/dev/null | head -n 1 | sed "s/\x1b\[[0-9;]*m//g")"
	else
		echo "toolchain java: FAIL: JDK ${v:-none} and Maven $(command -v mvn >/dev/null && echo found || echo missing); clients/java needs JDK $IDEM_JDK_MAJOR or later and Maven (Debian: default-jdk-headless maven)"
		rc=1
	fi
	v=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)
	if [ "$v" != none ] && [ "$(printf '%s\n' "$IDEM_PYTHON_MIN" "$v" | sort -V | head -n 1)" = "$IDEM_PYTHON_MIN" ] &&
		python3 -c 'import venv, ensurepip' 2>/dev/null; then
		echo "toolchain python: $v with venv; needs $IDEM_PYTHON_MIN or later"
	else
		echo "toolchain python: FAIL: python3 $v; clients/python needs Python $IDEM_PYTHON_MIN or later with venv (Debian: python3 python3-venv)"
		rc=1
	fi
	return $rc
}
