# A Citus cluster on loopback: a coordinator and two workers with the
# extension preloaded, for test/scripts/citus.sh and bench/citus.sh.
# Sourced, with PGBIN set; it sets:
#   work          a temp directory holding the data directories and logs
#   ports, names  the port and the name of node 0 (coordinator), 1 and 2
#                 (workers), and 3 (a worker that citus_node_start 3 starts)
#   q N ARGS...   psql on node N, database idem
#   citus_cluster_start [CONF...]
#                 initdb, configure (plus each CONF line), start the three
#                 nodes, CREATE DATABASE idem and EXTENSION citus on each,
#                 register the workers with the coordinator
#   citus_node_start N [CONF...]
#                 the same for one node N (3: a node to add later, with
#                 citus_add_node), without registering it
#   citus_attempt_script OPERATION KEYS [rollbacks] [SCOPE]
#                 print a pgbench script: one attempt of a random key of
#                 1..KEYS in scope t(key % 16), or in SCOPE: reserve, the
#                 payment, complete, commit (with "rollbacks", one in five
#                 rolled back); constants only, so that Citus delegates
#                 each call
# and stops every server under $work and removes it on exit.  Exits 77 (skipped) when
# the server installation has no citus.so: Citus is not in Debian's
# archive, build it from its source to run this.

libdir=$("$PGBIN/pg_config" --pkglibdir)
if [ ! -e "$libdir/citus.so" ]; then
	echo "skipped: Citus is not installed ($libdir/citus.so is absent; it is not in Debian's archive, build it from source)"
	exit 77
fi

work=$(mktemp -d "${IDEM_WORK:-${TMPDIR:-/tmp}}/citus.XXXXXX")
port0=$((40000 + ($$ % 4000) * 3))
ports=("$port0" $((port0 + 1)) $((port0 + 2)) $((52000 + $$ % 4000)))
names=(coordinator worker1 worker2 worker3)

# Stop every server whose data directory is in $work, and remove it
citus_cluster_stop() {
	local d
	for d in "$work"/*/; do
		[ -f "$d/postmaster.pid" ] &&
			"$PGBIN/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
trap citus_cluster_stop EXIT

q() {
	local n=$1
	shift
	"$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "${ports[$n]}" -d idem "$@"
}

citus_node_start() {
	local i=$1 line
	shift
	"$PGBIN/initdb" -D "$work/n$i" --auth=trust -E UTF8 --locale=C >"$work/initdb$i.log" 2>&1 ||
		{ cat "$work/initdb$i.log"; exit 1; }
	cat >>"$work/n$i/postgresql.conf" <<CONF
port = ${ports[$i]}
listen_addresses = '127.0.0.1'
unix_socket_directories = '$work'
shared_preload_libraries = 'citus,idempotency'
max_prepared_transactions = 50
max_connections = 60
CONF
	for line in "$@"; do echo "$line" >>"$work/n$i/postgresql.conf"; done
	"$PGBIN/pg_ctl" -D "$work/n$i" -l "$work/n$i.log" -w start >/dev/null ||
		{ tail -5 "$work/n$i.log"; exit 1; }
	"$PGBIN/psql" -X -q -h 127.0.0.1 -p "${ports[$i]}" -d postgres -c 'CREATE DATABASE idem'
	q "$i" -c 'CREATE EXTENSION citus'
}

citus_cluster_start() {
	local i
	for i in 0 1 2; do
		citus_node_start "$i" "$@"
	done
	q 0 <<SQL >/dev/null
SELECT pg_catalog.citus_set_coordinator_host('127.0.0.1', ${ports[0]});
SELECT pg_catalog.citus_add_node('127.0.0.1', ${ports[1]});
SELECT pg_catalog.citus_add_node('127.0.0.1', ${ports[2]});
SQL
}

citus_attempt_script() {
	local op=$1 keys=$2 rollbacks=${3:-} scope=${4:-t:t}
	cat <<PGB
\\set k random(1, $keys)
\\set t :k % 16
\\set rb random(0, 4)
BEGIN;
SELECT (outcome = 'new') AS is_new FROM idem_reserve('$op', 'key-:k', '{"k": :k}', '$scope') \\gset
\\if :is_new
INSERT INTO payments (tenant, key, amount) VALUES ('$scope', 'key-:k', :k);
SELECT idem_complete('$op', 'key-:k', '{"charged": :k}', 201, NULL, '$scope');
\\endif
PGB
	if [ "$rollbacks" = rollbacks ]; then
		printf '%s\n' '\if :rb = 0' 'ROLLBACK;' '\else' 'COMMIT;' '\endif'
	else
		echo 'COMMIT;'
	fi
}
