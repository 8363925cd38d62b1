#!/usr/bin/env bash
# The Citus check anyone can repeat (doc/citus.md, "How it is tested"):
#
#   bash test/citus_check.sh CITUS_SRC [PG_CONFIG]
#
# CITUS_SRC is a Citus source tree: a checkout of
# https://github.com/citusdata/citus (for example its tag v13.2.2, from
# `git clone --branch v13.2.2 --depth 1`); it is read, never changed, and
# never belongs in this repository.  PG_CONFIG is the PostgreSQL to build
# against (default: $IDEM_PG_CONFIG, else Debian's postgresql-15).  Debian
# does not package Citus, so the script
#   1. copies that PostgreSQL installation (programs, libraries, headers,
#      share) into a private prefix, $IDEM_CITUS_ROOT (default
#      /tmp/idem-citus-check), keeping its layout under that root: the
#      programs find their files relative to where they are, so the copy
#      is a PostgreSQL of its own and nothing shared is written;
#   2. applies the local patch the PostgreSQL minor release needs, if any
#      (see citus_patch below), to a copy of CITUS_SRC, then configures,
#      builds and installs Citus into the private prefix;
#   3. builds this extension with -Werror and installs it there;
#   4. runs test/scripts/citus.sh against it (as the "postgres" user when
#      run as root: PostgreSQL refuses to run as root).
# It installs the build dependencies it lacks with apt-get when run as root
# (or with sudo), and otherwise names them and stops.  The last line is
# "citus check: passed|FAILED (Citus X, PostgreSQL Y)"; the exit status is
# that of test/scripts/citus.sh, or 1 when a step before it failed.
#
# Environment: IDEM_CITUS_ROOT (the private prefix, rebuilt on each run),
# IDEM_CITUS_RUNS=N (run test/scripts/citus.sh N times in a row, default 1:
# "N of N passed"), IDEM_MAKE_JOBS (default 2).
set -euo pipefail

root_dir=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 1 ] || [ ! -f "$1/configure" ] || [ ! -d "$1/src/backend/distributed" ]; then
	echo "usage: bash test/citus_check.sh CITUS_SRC [PG_CONFIG]" >&2
	echo "  CITUS_SRC: a checkout of https://github.com/citusdata/citus (e.g. its tag v13.2.2)" >&2
	exit 2
fi
citus_src=$(cd "$1" && pwd)
pg_config_src=${2:-${IDEM_PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}}
prefix_root=${IDEM_CITUS_ROOT:-/tmp/idem-citus-check}
runs=${IDEM_CITUS_RUNS:-1}
jobs=${IDEM_MAKE_JOBS:-2}

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Build dependencies: Citus links libcurl (its statistics collector), lz4
# and zstd (columnar compression); both need the PostgreSQL server headers
# of the chosen installation (with Debian's, postgresql-server-dev-15).
packages=(make gcc libc6-dev rsync libcurl4-openssl-dev liblz4-dev libzstd-dev libssl-dev libkrb5-dev)
[ "$pg_config_src" = /usr/lib/postgresql/15/bin/pg_config ] &&
	packages+=(postgresql-15 postgresql-server-dev-15)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then
		echo "== installing: ${missing[*]}"
		as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends "${missing[@]}" >/dev/null
	else
		echo "missing packages (install them, or run as root): ${missing[*]}" >&2
		exit 1
	fi
fi
if [ ! -x "$pg_config_src" ]; then
	echo "no pg_config at $pg_config_src" >&2
	exit 1
fi
pg_version=$("$pg_config_src" --version | awk '{ print $2 }')
citus_version=$(sed -n 's/^PACKAGE_VERSION=.\([^'"'"']*\).$/\1/p' "$citus_src/configure")

# The local patch a PostgreSQL release needs for Citus to build, applied to
# the copy of the Citus tree ($build) with its reason printed.
#   have_createdb_privilege: Citus (13.2.2 and before) defines its own
#   static copy for PostgreSQL 15 in src/include/pg_version_compat.h, as
#   15.18 and older keep the function to dbcommands.c; 15.20 declares it
#   in commands/dbcommands.h, and the build fails with "static declaration
#   of 'have_createdb_privilege' follows non-static declaration".  Where
#   the server's header declares it, the copy is removed and Citus calls
#   PostgreSQL's own (the same code).  Found by what the headers say, not
#   by version numbers.
citus_patch() {
	local compat=$build/src/include/pg_version_compat.h
	local dbcommands
	dbcommands=$("$pg_config" --includedir-server)/commands/dbcommands.h
	if grep -q 'have_createdb_privilege' "$dbcommands" 2>/dev/null &&
		grep -q '^have_createdb_privilege(void)' "$compat"; then
		echo "== patch: PostgreSQL $pg_version declares have_createdb_privilege (commands/dbcommands.h): removing Citus's own copy from pg_version_compat.h"
		as_root perl -0pi -e 's/static inline bool\nhave_createdb_privilege\(void\)\n\{.*?\n\}\n//s' "$compat"
		if grep -q '^have_createdb_privilege(void)' "$compat"; then
			echo "the patch did not apply to $compat" >&2
			exit 1
		fi
	fi
}

echo "== Citus $citus_version (from $citus_src) against PostgreSQL $pg_version ($pg_config_src)"

# 1. The private prefix: a copy of the installation, same layout under it.
# Only a directory this script made (its marker file) is emptied.
if [ -e "$prefix_root" ] && [ ! -e "$prefix_root/.idem-citus-check" ] &&
	[ -n "$(ls -A "$prefix_root" 2>/dev/null)" ]; then
	echo "$prefix_root exists and was not made by this script: choose another IDEM_CITUS_ROOT" >&2
	exit 1
fi
as_root rm -rf "$prefix_root"
as_root mkdir -p "$prefix_root"
as_root touch "$prefix_root/.idem-citus-check"
for opt in --bindir --libdir --pkglibdir --sharedir --includedir --pkgincludedir --includedir-server; do
	d=$("$pg_config_src" "$opt")
	[ -d "$d" ] || continue
	as_root mkdir -p "$prefix_root$d"
	# libdir holds other software's libraries on Debian (/usr/lib/x86_64-linux-gnu):
	# only PostgreSQL's own
	if [ "$opt" = --libdir ]; then
		as_root rsync -a --include='libpq*' --include='libpgport*' --include='libpgcommon*' \
			--include='libecpg*' --include='libpgtypes*' --exclude='*' "$d/" "$prefix_root$d/"
	else
		as_root rsync -a "$d/" "$prefix_root$d/"
	fi
done
pg_config=$prefix_root$("$pg_config_src" --bindir)/pg_config
if [ "$("$pg_config" --pkglibdir)" != "$prefix_root$("$pg_config_src" --pkglibdir)" ]; then
	echo "the copy of PostgreSQL in $prefix_root does not find its own files (pg_config --pkglibdir says $("$pg_config" --pkglibdir))" >&2
	exit 1
fi
pgbin=$("$pg_config" --bindir)

# 2. Citus, built in a copy of its tree
build=$prefix_root/citus-build
as_root rsync -a --exclude .git "$citus_src/" "$build/"
citus_patch
echo "== building Citus (log: $build/build.log)"
if ! (cd "$build" &&
	as_root ./configure PG_CONFIG="$pg_config" &&
	as_root nice -n 19 make -j"$jobs" &&
	as_root make install) >"$build/build.log" 2>&1; then
	tail -30 "$build/build.log"
	echo "citus check: FAILED (building Citus $citus_version on PostgreSQL $pg_version)"
	exit 1
fi

# 3. This extension, from a copy of this tree
ext=$prefix_root/idempotency
as_root rsync -a --exclude .git --exclude '*.o' --exclude '*.so' --exclude '*.bc' "$root_dir/" "$ext/"
echo "== building idempotency"
if ! (as_root make -C "$ext" -s PG_CONFIG="$pg_config" WERROR=1 clean &&
	as_root nice -n 19 make -C "$ext" -s PG_CONFIG="$pg_config" WERROR=1 &&
	as_root make -C "$ext" -s PG_CONFIG="$pg_config" install) >"$ext/build.log" 2>&1; then
	tail -30 "$ext/build.log"
	echo "citus check: FAILED (building idempotency on PostgreSQL $pg_version)"
	exit 1
fi

# 4. The test, as a user PostgreSQL runs as
run_test() {
	if [ "$(id -u)" = 0 ]; then
		local home
		home=$(mktemp -d /tmp/idem-citus-run.XXXXXX)
		chown postgres: "$home"
		runuser -u postgres -- env HOME="$home" PGBIN="$pgbin" PATH="$pgbin:$PATH" \
			IDEM_WORK="$home" nice -n 19 bash "$ext/test/scripts/citus.sh"
		local rc=$?
		rm -rf "$home"
		return "$rc"
	fi
	PGBIN="$pgbin" PATH="$pgbin:$PATH" nice -n 19 bash "$ext/test/scripts/citus.sh"
}
passed=0
rc=0
for i in $(seq 1 "$runs"); do
	echo "== test/scripts/citus.sh, run $i of $runs"
	if run_test >"$prefix_root/citus-run$i.log" 2>&1; then
		passed=$((passed + 1))
		echo "  $(grep -c '  ok: ' "$prefix_root/citus-run$i.log" || true) checks passed"
	else
		rc=$?
		grep -E 'FAILED|skipped' "$prefix_root/citus-run$i.log" | head -20 || true
		tail -3 "$prefix_root/citus-run$i.log"
		echo "  (whole output: $prefix_root/citus-run$i.log)"
	fi
done
echo "$passed of $runs runs passed"
if [ "$passed" = "$runs" ]; then
	echo "citus check: passed (Citus $citus_version, PostgreSQL $pg_version)"
	exit 0
fi
echo "citus check: FAILED (Citus $citus_version, PostgreSQL $pg_version)"
exit "${rc:-1}"
