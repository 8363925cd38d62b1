#!/usr/bin/env bash
# The suite against an assert-enabled PostgreSQL: `bash test/assert.sh` (as root).
#
# In a fresh Debian 12 root (test/debroot.sh) it fetches Debian's source
# package of postgresql-15 with `apt-get source` (the deb-src line is
# written into the root's own apt sources, never this machine's), builds it
# with --enable-cassert --enable-debug --enable-tap-tests into a prefix,
# builds pg_cron from Debian's source package (pg-cron) against it, and
# then runs the README's test command, `bash test/run.sh`, on a clean `git
# archive` of HEAD with IDEM_PG_CONFIG pointing at that build.  An assertion
# failure in the server or the extension fails the suite (the server
# crashes, the test that caused it fails).
#
# The build is kept in IDEM_ROOTS/assert-pg15 (mounted into the root while
# it runs) and made again only when Debian's source version changes; the
# first run takes 20 to 30 minutes more on 2 cores.  Exits with the suite's status.
#
# Environment: IDEM_ROOTS, IDEM_MIRROR as for test/debroot.sh;
# IDEM_ASSERT_REV (the commit to test, default HEAD); IDEM_ASSERT_REBUILD=1
# builds PostgreSQL again.

set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/debroot.sh"

debroot_need_root assert

repo=$(cd "$here/.." && pwd)
rev=$(git -C "$repo" rev-parse --verify "${IDEM_ASSERT_REV:-HEAD}^{commit}")
cache=$IDEM_ROOTS/assert-pg15
mkdir -p "$cache"
[ "${IDEM_ASSERT_REBUILD:-0}" = 1 ] && rm -rf "${cache:?}"/*
src=$(mktemp -d /tmp/idempotency-assert-src.XXXXXX)
trap 'rm -rf "$src"' EXIT
git -C "$repo" archive "$rev" | tar -x -C "$src"

echo "== assert-enabled PostgreSQL 15, suite of $(git -C "$repo" log -1 --format='%h %s' "$rev")"

# Runs inside the bookworm root: /build is the cache, /root/idempotency the tree
inner=$(
	cat <<'EOF'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
# A prefix with "postgres" in it: Debian's patches otherwise put the
# libraries and pgxs in /usr/lib/postgresql/15/lib, over the packaged server
prefix=/build/postgresql-15
sed 's/^Types: deb$/Types: deb deb-src/' -i /etc/apt/sources.list.d/debian.sources
apt-get update -qq
# What the build needs; test/run.sh installs the rest itself
apt-get install -y -qq --no-install-recommends dpkg-dev gcc make bison flex perl \
	libipc-run-perl libssl-dev zlib1g-dev libreadline-dev pkg-config >/dev/null
version=$(apt-cache showsrc postgresql-15 | sed -n 's/^Version: //p' | sort -V | tail -n 1)
if [ "$(cat /build/version 2>/dev/null)" != "$version" ]; then
	echo "== building postgresql-15 $version from Debian's source package"
	rm -rf /build/*
	mkdir -p /build/src
	cd /build/src
	apt-get source -qq "postgresql-15=$version" >/dev/null
	cd postgresql-15-*/
	# Debian's own patches (dpkg-source applied them) are kept: the server is
	# Debian's, with assertions on
	./configure --prefix="$prefix" --enable-cassert --enable-debug \
		--enable-tap-tests --with-openssl CFLAGS="-O1 -g" >/build/configure.log
	make -s -j"$(nproc)" >/build/make.log 2>&1 || { tail -n 40 /build/make.log; exit 1; }
	make -s -C contrib -j"$(nproc)" >>/build/make.log 2>&1 || { tail -n 40 /build/make.log; exit 1; }
	make -s install >/dev/null
	make -s -C contrib install >/dev/null
	cd /build
	rm -rf /build/src
	echo "$version" >/build/version
fi
# pg_cron from Debian's source package, where the mirror has it (the TAP test
# of pg_cron is skipped, with its reason, where it is not installed)
if [ ! -e "$("$prefix/bin/pg_config" --sharedir)/extension/pg_cron.control" ] && [ ! -e /build/no-pg-cron ]; then
	mkdir -p /build/cron && cd /build/cron
	if apt-get source -qq pg-cron >/dev/null 2>&1; then
		echo "== building pg_cron from Debian's source package against it"
		make -s -C pg-cron-*/ PG_CONFIG="$prefix/bin/pg_config" >/dev/null
		make -s -C pg-cron-*/ PG_CONFIG="$prefix/bin/pg_config" install >/dev/null
	else
		echo "== pg_cron: its source package is not on the mirror; the pg_cron test will be skipped"
		touch /build/no-pg-cron
	fi
	cd /build
	rm -rf /build/cron
fi
"$prefix/bin/pg_config" --configure | grep -q -- '--enable-cassert'
echo "== $("$prefix/bin/postgres" --version), assertions on: $("$prefix/bin/pg_config" --configure | grep -o -- "--enable-cassert")"
cd /root/idempotency
IDEM_PG_CONFIG="$prefix/bin/pg_config" bash test/run.sh
EOF
)

debroot_run bookworm --copy "$src:/root/idempotency" --bind "$cache:/build" -- \
	bash -c "$inner"
