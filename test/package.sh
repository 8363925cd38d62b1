#!/usr/bin/env bash
# The Debian package, built and installed as Debian does it (as root):
#
#   bash test/package.sh
#
# 1. In a fresh Debian 12 root (test/debroot.sh), from a `git archive` of
#    HEAD: `apt-get build-dep` of debian/control, `pg_buildext
#    updatecontrol` (debian/control lists every version debian/pgversions
#    allows; Debian 12 ships 15 only, and the build refuses a debian/control
#    that does not match the suite), then `dpkg-buildpackage -us -uc -b`,
#    which builds postgresql-15-idempotency with pg_buildext and runs its
#    `make installcheck` (dh_pgxs_test).
# 2. In another fresh Debian 12 root: `apt-get install` of the built .deb
#    (which pulls postgresql-15), the package's autopkgtest
#    (debian/tests/installcheck: installcheck on a stock server and on a
#    preloading one), then Debian's own cluster 15/main with
#    shared_preload_libraries = 'idempotency', CREATE EXTENSION, the payments
#    demo (examples/payments), its effects counted in the database, and the
#    background worker seen running.
#
# Prints each step and ends with "package: ok" or "package: FAILED"; exits
# non-zero on any failure.  IDEM_KEEP_DEBS=DIR keeps the built .deb files
# in DIR; IDEM_DEBS=DIR skips step 1 and installs the .deb files in DIR.
# Roots are cached by test/debroot.sh (IDEM_ROOTS).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/test/debroot.sh"
if [ "$(id -u)" != 0 ]; then
	echo "package: must run as root (debootstrap, mount, chroot)" >&2
	exit 1
fi

tmp=$(mktemp -d /tmp/idempotency-package.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src/idempotency" "$tmp/debs"
git -C "$here" archive HEAD | tar -x -C "$tmp/src/idempotency"

if [ -n "${IDEM_DEBS:-}" ]; then
	cp "$IDEM_DEBS"/*.deb "$tmp/debs/"
else
	echo "== package: building in a fresh bookworm root ($(git -C "$here" rev-parse --short HEAD))"
	# The build's output goes to stderr; stdout carries the .deb files out as tar
	debroot_run bookworm --copy "$tmp/src:/build" -- bash -c '
		set -euo pipefail
		exec 3>&1 1>&2
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends build-essential >/dev/null
		apt-get build-dep -y -qq /build/idempotency >/dev/null
		cd /build/idempotency
		pg_buildext updatecontrol
		grep "^Package:" debian/control
		dpkg-buildpackage -us -uc -b
		cd /build
		ls -l *.deb
		tar -cf - *.deb >&3
	' >"$tmp/debs.tar"
	tar -x -C "$tmp/debs" -f "$tmp/debs.tar"
	ls "$tmp/debs"/postgresql-15-idempotency_*.deb >/dev/null
fi
if [ -n "${IDEM_KEEP_DEBS:-}" ]; then
	mkdir -p "$IDEM_KEEP_DEBS"
	cp "$tmp"/debs/*.deb "$IDEM_KEEP_DEBS/"
fi

echo "== package: installing $(cd "$tmp/debs" && ls postgresql-15-idempotency_*.deb) in a fresh bookworm root"
rc=0
debroot_run bookworm --copy "$tmp/debs:/debs" --copy "$tmp/src:/src" -- bash -c '
	set -euo pipefail
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends /debs/postgresql-15-idempotency_*.deb >/dev/null
	dpkg -L postgresql-15-idempotency | grep -E "\.so$|\.control$|--.*\.sql$"

	echo "== autopkgtest: debian/tests/installcheck (as its Depends install it)"
	apt-get install -y -qq --no-install-recommends make postgresql-server-dev-all >/dev/null
	cd /src/idempotency
	debian/tests/installcheck

	echo "== Debian cluster 15/main with the library preloaded"
	pg_lsclusters
	pg_conftool 15 main set shared_preload_libraries idempotency
	pg_conftool 15 main set idempotency.sweep_interval 1s
	pg_ctlcluster 15 main restart
	cp -r /src/idempotency/examples /tmp/examples
	psql_() { runuser -u postgres -- psql -X -v ON_ERROR_STOP=1 "$@"; }
	psql_ -q -c "CREATE DATABASE shop"
	psql_ -q -d shop -c "CREATE EXTENSION idempotency"
	psql_ -At -d shop -c "SELECT extversion FROM pg_extension WHERE extname = '\''idempotency'\''"
	psql_ -q -d shop -f /tmp/examples/payments/payments.sql
	psql_ -d shop -f /tmp/examples/payments/demo.sql
	check() {
		local got
		got=$(psql_ -At -d shop -c "$2")
		if [ "$got" = "$3" ]; then echo "ok: $1 ($got)"; else echo "FAIL: $1: $got, want $3"; return 1; fi
	}
	check "payments for order-842 (two accounts, one payment each)" \
		"SELECT count(*) FROM payments WHERE order_id = '\''order-842'\''" 2
	check "payments for the declined order-900" \
		"SELECT count(*) FROM payments WHERE order_id = '\''order-900'\''" 0
	check "payments for order-901 (rolled back once, then paid)" \
		"SELECT count(*) FROM payments WHERE order_id = '\''order-901'\''" 1
	check "the statistics count the calls (the library is preloaded)" \
		"SELECT sum(reserves) > 0 FROM idem_stats" t
	for i in $(seq 60); do
		[ "$(psql_ -At -d shop -c "SELECT passes > 0 FROM idem_worker_status WHERE datname = '\''shop'\''")" = t ] && break
		sleep 1
	done
	check "the background worker made its passes over database shop" \
		"SELECT passes > 0 FROM idem_worker_status WHERE datname = '\''shop'\''" t
	pg_ctlcluster 15 main stop
' || rc=$?
if [ "$rc" = 0 ]; then
	echo "package: ok"
else
	echo "package: FAILED (exit $rc)"
fi
exit "$rc"
