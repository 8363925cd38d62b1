#!/usr/bin/env bash
# Server instructions per request, counted by callgrind (repeatable on a
# shared machine, unlike TPS):
#   bash bench/profile.sh [VARIANT...]     (default: a e i d f)
#
# Builds this tree into a private copy of Debian's PostgreSQL 15 (PROFILE_PG,
# made from /usr/lib/postgresql/15 when absent), sets up bench/core on a
# throwaway cluster (synchronous_commit off, autovacuum off), and for each
# variant: resets the tables (bench/core/reset.sql), restarts the server
# under valgrind --tool=callgrind --trace-children=yes and runs the
# variant's bench/core script with one connection of the suites' load
# generator (bench/loadgen.c; prepared statements, PROFILE_MODE=simple for
# the simple protocol), twice: for PROFILE_FEW and then PROFILE_MANY
# seconds, each in a connection of its own.  Instructions per request are
# the difference of the two backends' totals over the difference of their
# request counts, so the connection's start and end cancel out.  Prints one Markdown row per
# variant; with PROFILE_KEEP=DIR, keeps each variant's callgrind files there
# (NAME.few.callgrind, NAME.callgrind and NAME.requests, the difference in
# requests; bench/cgdiff.py prints what one request costs, function by
# function, from them).  PROFILE_SQL runs after each reset (diagnostics:
# PROFILE_SQL='DROP INDEX idem_keys_processing_idx' shows what an index
# costs).
#
# Variants: the bench/core scripts by their letter (a bare INSERT, b the
# seed's client SQL, c its PL/pgSQL, d the extension's client statements, e
# one server call, f a replay, g the floor, i idem_call, j a bare
# primary-key SELECT of the response that f replays, k the two-phase form:
# reserve, payment and complete each in a transaction of its own), or any other
# script of bench/core by its name (x4_floor_plpgsql: the floor as a
# PL/pgSQL function; x5_floor_record_plpgsql: the floor of the one-write
# design, doc/write-path.md; x6_ext_select_plpgsql: (e) with SELECT * INTO
# from idem_reserve in FROM, the form most PL/pgSQL callers write).  Another
# server: PROFILE_PG=/opt/idem-pg/NAME (a tree with usr/lib/postgresql/15).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROFILE_PG=${PROFILE_PG:-/opt/pg-bench-new}
PROFILE_FEW=${PROFILE_FEW:-4}
PROFILE_MANY=${PROFILE_MANY:-20}
PROFILE_MODE=${PROFILE_MODE:-prepared}
BIN=usr/lib/postgresql/15/bin
VARIANTS=${*:-a e i d f}
# valgrind, and the load generator's libraries, installed when missing as
# the suites install theirs (test/lib.sh)
source "$ROOT/test/lib.sh"
idem_install_packages "${IDEM_PACKAGES[@]}" valgrind libpq-dev libhiredis-dev

as_user() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ ! -x "$PROFILE_PG/$BIN/postgres" ]; then
	mkdir -p "$PROFILE_PG/usr/lib/postgresql" "$PROFILE_PG/usr/share/postgresql" "$PROFILE_PG/usr/include"
	cp -a /usr/lib/postgresql/15 "$PROFILE_PG/usr/lib/postgresql/"
	cp -a /usr/share/postgresql/15 "$PROFILE_PG/usr/share/postgresql/"
	cp -a /usr/include/postgresql "$PROFILE_PG/usr/include/"
fi

WORK=$(mktemp -d /tmp/idem-profile.XXXXXX)
chmod 755 "$WORK"
stop() {
	[ -f "$WORK/data/postmaster.pid" ] &&
		as_user "$PROFILE_PG/$BIN/pg_ctl" -D "$WORK/data" -m fast -w -t 300 stop >/dev/null 2>&1
	return 0
}
cleanup() {
	stop
	rm -rf "$WORK"
}
trap cleanup EXIT

echo "== building this tree into $PROFILE_PG" >&2
rsync -a --exclude .git --exclude '*.o' --exclude '*.so' --exclude '*.bc' "$ROOT/" "$WORK/src/"
make -C "$WORK/src" -s PG_CONFIG="$PROFILE_PG/$BIN/pg_config" >/dev/null
make -C "$WORK/src" -s PG_CONFIG="$PROFILE_PG/$BIN/pg_config" install >/dev/null
mkdir -p "$WORK/cg"
gcc -O2 -Wall -Wextra -Werror -o "$WORK/loadgen" "$ROOT/bench/loadgen.c" \
	-I"$("$PROFILE_PG/$BIN/pg_config" --includedir)" -lpq -lhiredis -lpthread
[ "$(id -u)" = 0 ] && chown -R postgres: "$WORK"

as_user "$PROFILE_PG/$BIN/initdb" -D "$WORK/data" --auth=trust --encoding=UTF8 --locale=C >/dev/null
cat >>"$WORK/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$WORK'
port = 55641
shared_preload_libraries = 'idempotency'
shared_buffers = '256MB'
max_wal_size = '4GB'
checkpoint_timeout = '30min'
autovacuum = off
idempotency.enabled = off
synchronous_commit = off
EOF
pgctl_start() {
	as_user "$PROFILE_PG/$BIN/pg_ctl" -D "$WORK/data" -l "$WORK/server.log" -w -t 600 "$@" start >/dev/null
}
psql_() {
	as_user "$PROFILE_PG/$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK" -p 55641 -d bench "$@"
}
pgctl_start
as_user "$PROFILE_PG/$BIN/createdb" -h "$WORK" -p 55641 bench
psql_ -f "$ROOT/bench/core/setup.sql" >/dev/null
stop

# Every process of the cluster runs under callgrind, each writing its own file
cat >"$WORK/postgres-cg" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --trace-children=yes -q \
	--callgrind-out-file=$WORK/cg/%p.out $PROFILE_PG/$BIN/postgres "\$@"
EOF
chmod 755 "$WORK/postgres-cg"

# The same starting point for every variant (bench/core/reset.sql, run
# without callgrind), then the server under callgrind
start_profiled() {
	pgctl_start
	psql_ -f "$ROOT/bench/core/reset.sql" >/dev/null
	[ -z "${PROFILE_SQL:-}" ] || psql_ -c "$PROFILE_SQL" >/dev/null
	stop
	echo "== $1: the server under callgrind" >&2
	as_user "$PROFILE_PG/$BIN/pg_ctl" -D "$WORK/data" -l "$WORK/server.log" -w -t 600 \
		-p "$WORK/postgres-cg" start >/dev/null
}

# A run of the load generator for n seconds on one connection.  COUNT:
# total instructions of the backend that served it; REQUESTS: how many
# requests it sent; LAST_FILE: the backend's callgrind file
run_count() {
	local script=$1 n=$2 before files file out
	before=$(ls "$WORK/cg")
	out=$(as_user "$WORK/loadgen" -d "host=$WORK port=55641 dbname=bench" -c 1 -T "$n" \
		-M "$PROFILE_MODE" -f "$script") || { echo "profile.sh: loadgen failed on $script" >&2; exit 1; }
	REQUESTS=$(sed -n 's/.*\brequests=\([0-9]*\).*/\1/p' <<<"$out")
	# Each backend writes its file when it exits, after the client is gone:
	# wait until every new file is complete and no other one comes
	for _ in $(seq 1 100); do
		sleep 0.5
		files=$(comm -13 <(echo "$before") <(ls "$WORK/cg"))
		[ -n "$files" ] || continue
		[ "$(cd "$WORK/cg" && grep -l '^totals:' $files | wc -l)" = "$(wc -w <<<"$files")" ] || continue
		[ "$(comm -13 <(echo "$before") <(ls "$WORK/cg"))" = "$files" ] && break
	done
	# The busiest backend is the one that served the requests
	file=$(cd "$WORK/cg" && grep -H '^totals:' $files | sort -t' ' -k2 -g | tail -1 | cut -d: -f1)
	[ -n "$file" ] || { echo "profile.sh: no callgrind file for $script" >&2; exit 1; }
	LAST_FILE=$WORK/cg/$file
	COUNT=$(sed -n 's/^totals: *\([0-9]*\).*/\1/p' "$LAST_FILE")
}

script_of() {
	case $1 in
		a) echo a_bare_insert ;; b) echo b_seed_client ;; c) echo c_seed_plpgsql ;;
		d) echo d_ext_client ;; e) echo e_ext_server ;; f) echo f_replay ;;
		g) echo g_floor ;; i) echo i_ext_call ;; j) echo j_select_response ;;
		k) echo k_ext_two_phase ;;
		*) [ -f "$ROOT/bench/core/$1.sql" ] && echo "$1" && return
			echo "profile.sh: unknown variant $1" >&2; exit 1 ;;
	esac
}

echo "Server instructions per request (callgrind, bench/loadgen.c on one connection,"
echo "-M $PROFILE_MODE, a run of $PROFILE_MANY s less one of $PROFILE_FEW s; synchronous_commit off):"
echo
echo "| variant | instructions per request | vs (a) |"
echo "|---|---:|---:|"
base=
for v in $VARIANTS; do
	s=$(script_of "$v")
	start_profiled "$s"
	run_count "$ROOT/bench/core/$s.sql" "$PROFILE_FEW"
	few=$COUNT
	few_n=$REQUESTS
	few_file=$LAST_FILE
	run_count "$ROOT/bench/core/$s.sql" "$PROFILE_MANY"
	per=$(( (COUNT - few) / (REQUESTS - few_n) ))
	[ "$v" = a ] && base=$per
	if [ -n "${PROFILE_KEEP:-}" ]; then
		mkdir -p "$PROFILE_KEEP"
		cp "$few_file" "$PROFILE_KEEP/$s.few.callgrind"
		cp "$LAST_FILE" "$PROFILE_KEEP/$s.callgrind"
		echo $((REQUESTS - few_n)) >"$PROFILE_KEEP/$s.requests"
	fi
	if [ -n "$base" ]; then
		awk -v s="$s" -v p="$per" -v b="$base" 'BEGIN { printf "| %s | %d | %.2f |\n", s, p, p / b }'
	else
		echo "| $s | $per | |"
	fi
	stop
done
