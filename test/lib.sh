# Shared set-up for the demo, the test suite and the benchmarks.
#
# Sourced by test/run.sh, test/demo.sh and bench/run.sh.  On a fresh Debian 12
# machine (as root, or a user with sudo) it installs what is missing with
# apt-get, builds the extension with -Werror, installs it, and runs a
# throwaway cluster as a non-root user on a unix socket in a temp directory.
# PostgreSQL refuses to run as root: as root the server and every test client
# run as the "postgres" user that Debian's packages create.

set -euo pipefail

IDEM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PGVER=${PGVER:-15}
# IDEM_PG_CONFIG=/path/to/pg_config runs everything against another server
# build (an assert-enabled one, say) instead of Debian's postgresql-$PGVER
if [ -n "${IDEM_PG_CONFIG:-}" ]; then
	PG_CONFIG=$IDEM_PG_CONFIG
	PGBIN=$("$PG_CONFIG" --bindir)
	PGXS_TEST=$(dirname "$("$PG_CONFIG" --pgxs)")/../test
else
	PGBIN=/usr/lib/postgresql/$PGVER/bin
	PG_CONFIG=$PGBIN/pg_config
	PGXS_TEST=/usr/lib/postgresql/$PGVER/lib/pgxs/src/test
fi

# Packages every command needs; callers may add their own before idem_setup.
IDEM_PACKAGES=(make gcc libc6-dev rsync procps
	"postgresql-$PGVER" "postgresql-server-dev-$PGVER" "postgresql-contrib")

# Run a command as root (directly, or through sudo)
as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# Install the Debian packages that are not installed yet
idem_install_packages() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
			missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	echo "== installing: ${missing[*]}"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends "${missing[@]}" >/dev/null
}

# Install those of the given packages that this suite's archive has, and
# name the others (the tests that need them skip with a reason)
idem_install_optional() {
	local p
	for p in "$@"; do
		idem_install_packages "$p" 2>/dev/null ||
			echo "== not available, the tests that need it will be skipped: $p"
	done
}

# Build with every warning fatal and install into the server's directories
idem_build_install() {
	echo "== building and installing idempotency"
	make -C "$IDEM_ROOT" -s PG_CONFIG="$PG_CONFIG" WERROR=1 clean >/dev/null
	make -C "$IDEM_ROOT" -s PG_CONFIG="$PG_CONFIG" WERROR=1
	as_root make -C "$IDEM_ROOT" -s PG_CONFIG="$PG_CONFIG" install >/dev/null
}

# The OS user that runs the server and the clients
idem_test_user() {
	if [ "$(id -u)" = 0 ]; then echo postgres; else id -un; fi
}

# Run a command as the test user, with the cluster's environment
as_test_user() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- env HOME="$IDEM_WORK" PATH="$PGBIN:$PATH" \
			PGHOST="$PGHOST" PGPORT="$PGPORT" PGDATABASE="${PGDATABASE:-postgres}" \
			IDEM_WORK="$IDEM_WORK" IDEM_SRC="$IDEM_SRC" PGBIN="$PGBIN" PGVER="$PGVER" \
			PGXS_TEST="$PGXS_TEST" "$@"
	else
		env PATH="$PGBIN:$PATH" PGDATABASE="${PGDATABASE:-postgres}" "$@"
	fi
}

# Make a temp work area holding a copy of the tree the test user can write to
idem_make_work() {
	IDEM_WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency.XXXXXX")
	chmod 755 "$IDEM_WORK"
	IDEM_SRC=$IDEM_WORK/src
	rsync -a --exclude .git --exclude '*.o' --exclude '*.so' "$IDEM_ROOT/" "$IDEM_SRC/"
	mkdir -p "$IDEM_WORK/sock"
	chmod 700 "$IDEM_WORK/sock"
	if [ "$(id -u)" = 0 ]; then chown -R postgres: "$IDEM_WORK"; fi
	export IDEM_WORK IDEM_SRC
	export PGHOST=$IDEM_WORK/sock
	export PGPORT=${PGPORT:-55432}
	trap idem_cleanup EXIT
}

# With IDEM_VALGRIND=1 the server runs under valgrind's memcheck (see
# test/run.sh): pg_ctl starts it through this wrapper, one log per process
idem_valgrind_wrapper() {
	local w=$IDEM_WORK/postgres-valgrind
	as_test_user mkdir -p "$IDEM_WORK/valgrind"
	printf '%s\n' '#!/bin/sh' \
		"exec valgrind --quiet --error-limit=no --num-callers=30 --suppressions=$IDEM_SRC/test/valgrind.supp --log-file=$IDEM_WORK/valgrind/%p.log $PGBIN/postgres \"\$@\"" |
		as_test_user tee "$w" >/dev/null
	chmod 755 "$w"
	echo "$w"
}

# Start the throwaway cluster; extra postgresql.conf lines come as arguments
idem_start_cluster() {
	as_test_user "$PGBIN/initdb" -D "$IDEM_WORK/data" --auth=trust \
		--encoding=UTF8 --locale=C >"$IDEM_WORK/initdb.log" 2>&1 ||
		{ cat "$IDEM_WORK/initdb.log"; return 1; }
	idem_add_conf "listen_addresses = ''" \
		"unix_socket_directories = '$IDEM_WORK/sock'" \
		"port = $PGPORT" \
		"shared_preload_libraries = 'idempotency'" \
		"max_connections = 100" \
		"log_line_prefix = '%m [%p] %b '" \
		"$@"
	idem_pg_ctl start
}

# Add postgresql.conf lines (the last line setting a name wins) and restart
idem_restart_cluster() {
	idem_add_conf "$@"
	idem_pg_ctl restart
}

# Append lines to the cluster's postgresql.conf
idem_add_conf() {
	[ $# -eq 0 ] && return 0
	printf '%s\n' "$@" | as_test_user tee -a "$IDEM_WORK/data/postgresql.conf" >/dev/null
}

# pg_ctl start or restart, under valgrind with IDEM_VALGRIND=1
idem_pg_ctl() {
	local postgres_opt=() timeout=60
	if [ "${IDEM_VALGRIND:-0}" = 1 ]; then
		postgres_opt=(-p "$(idem_valgrind_wrapper)")
		timeout=300
	fi
	as_test_user "$PGBIN/pg_ctl" -D "$IDEM_WORK/data" -l "$IDEM_WORK/server.log" \
		"${postgres_opt[@]}" -w -t "$timeout" "$1" >/dev/null
}

# Stop the cluster and remove the work area (the EXIT trap)
idem_cleanup() {
	local rc=$?
	if [ -n "${IDEM_WORK:-}" ] && [ -d "$IDEM_WORK" ]; then
		if [ -f "$IDEM_WORK/data/postmaster.pid" ]; then
			as_test_user "$PGBIN/pg_ctl" -D "$IDEM_WORK/data" -m immediate -w stop \
				>/dev/null 2>&1 || true
		fi
		if [ "${IDEM_KEEP:-0}" = 1 ]; then
			echo "== kept $IDEM_WORK"
		else
			rm -rf "$IDEM_WORK"
		fi
	fi
	exit $rc
}

# Everything up to a running cluster: packages, build, install, cluster
idem_setup() {
	if [ "${IDEM_VALGRIND:-0}" = 1 ]; then IDEM_PACKAGES+=(valgrind); fi
	# One run at a time per server installation: each run installs the
	# extension into that installation's directories
	local lock
	lock=/tmp/idempotency-run.$(printf '%s' "$PG_CONFIG" | md5sum | cut -c1-12).lock
	exec 9>>"$lock"
	chmod 666 "$lock" 2>/dev/null || true
	if ! flock -n 9; then
		echo "== waiting for another run on $PG_CONFIG to end (lock $lock)"
		flock 9
	fi
	idem_install_packages "${IDEM_PACKAGES[@]}"
	idem_build_install
	idem_make_work
	idem_start_cluster "$@"
}
