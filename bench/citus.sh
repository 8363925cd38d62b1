#!/usr/bin/env bash
# Citus against one plain server (doc/citus.md, "Cost"): a coordinator and
# two workers (test/citus_cluster.sh) and one plain server, all on this
# machine with fsync on (the default), pgbench with CITUS_CLIENTS clients
# for CITUS_SECONDS seconds per run:
#   new            a new key: reserve, insert the payment, complete,
#                  commit; through the coordinator, 16 scopes
#   new_worker     the same on the worker that holds the scope's shard,
#                  one scope
#   replay         idem_reserve of a completed key; through the
#                  coordinator, 16 scopes
#   replay_worker  the same on the worker that holds the scope's shard
# each against the same script on the plain server, Citus and plain runs
# alternating, CITUS_ROUNDS rounds; prints the median TPS of each, the
# ratios and the load average.  Needs a server build with citus.so and
# this extension installed (make install); as root it runs as postgres.
#
#   IDEM_PG_CONFIG=/path/to/pg_config bash bench/citus.sh
#   CITUS_SECONDS=15 CITUS_ROUNDS=3 CITUS_CLIENTS=4 CITUS_FSYNC=on
set -euo pipefail

if [ "$(id -u)" = 0 ]; then
	exec runuser -u postgres -- env PATH="$PATH" IDEM_PG_CONFIG="${IDEM_PG_CONFIG:-}" \
		CITUS_SECONDS="${CITUS_SECONDS:-}" CITUS_ROUNDS="${CITUS_ROUNDS:-}" \
		CITUS_CLIENTS="${CITUS_CLIENTS:-}" CITUS_FSYNC="${CITUS_FSYNC:-}" \
		bash "$(realpath "$0")"
fi
seconds=${CITUS_SECONDS:-15}
rounds=${CITUS_ROUNDS:-3}
clients=${CITUS_CLIENTS:-4}
fsync=${CITUS_FSYNC:-on}
PGBIN=$("${IDEM_PG_CONFIG:-pg_config}" --bindir)
source "$(dirname "$0")/../test/citus_cluster.sh"

# The Citus cluster, and the plain server as node 3
citus_cluster_start "fsync = $fsync"
ports+=($((36000 + $$ % 4000)))
names+=(plain)
"$PGBIN/initdb" -D "$work/plain" --auth=trust -E UTF8 --locale=C >"$work/initdb3.log" 2>&1
cat >>"$work/plain/postgresql.conf" <<CONF
port = ${ports[3]}
listen_addresses = '127.0.0.1'
unix_socket_directories = '$work'
shared_preload_libraries = 'idempotency'
max_connections = 60
fsync = $fsync
CONF
"$PGBIN/pg_ctl" -D "$work/plain" -l "$work/plain.log" -w start >/dev/null
"$PGBIN/psql" -X -q -h 127.0.0.1 -p "${ports[3]}" -d postgres -c 'CREATE DATABASE idem'

setup='CREATE EXTENSION idempotency;
CREATE TABLE payments (tenant text COLLATE "C" NOT NULL, key text NOT NULL, amount int);'
q 0 -c "$setup" -c "SELECT create_distributed_table('payments', 'tenant')" \
	-c "SELECT idem_distribute('payments')" >/dev/null
q 3 -c "$setup"
# The scope replayed on the worker: the first of w0..w15 whose shard worker1 holds
wscope=$(q 0 -c "SELECT t FROM generate_series(0, 15) g, LATERAL (SELECT 'w' || g AS t) s
	JOIN pg_dist_shard_placement p ON p.shardid = get_shard_id_for_distribution_column('idem_keys', s.t)
	WHERE p.nodeport = ${ports[1]} ORDER BY g LIMIT 1")

# 1,000 completed keys over 16 scopes, and 1,000 in $wscope, one
# transaction each (constants, so that Citus delegates every call)
for k in $(seq 1 1000); do
	for scope in "t$((k % 16))" "$wscope"; do
		echo "SELECT idem_reserve('bench', 'r-$k', '{\"k\": $k}', '$scope');"
		echo "SELECT idem_complete('bench', 'r-$k', '{\"charged\": $k}', 201, NULL, '$scope');"
	done
done >"$work/keys.sql"
q 0 -f "$work/keys.sql" >/dev/null
q 3 -f "$work/keys.sql" >/dev/null

citus_attempt_script bench 1000000000 >"$work/new.sql"
citus_attempt_script bench 1000000000 "" "$wscope" >"$work/new_worker.sql"
cat >"$work/replay.sql" <<'PGB'
\set k random(1, 1000)
\set t :k % 16
SELECT outcome FROM idem_reserve('bench', 'r-:k', '{"k": :k}', 't:t');
PGB
cat >"$work/replay_worker.sql" <<PGB
\\set k random(1, 1000)
SELECT outcome FROM idem_reserve('bench', 'r-:k', '{"k": :k}', '$wscope');
PGB
workloads=(new new_worker replay replay_worker)
for n in 0 3; do
	check=$(q "$n" -c "SELECT outcome FROM idem_reserve('bench', 'r-7', '{\"k\": 7}', 't7')")
	[ "$check" = replay ] || { echo "${names[$n]}: a replay gave \"$check\"" >&2; exit 1; }
done

declare -A runs
# bench NAME NODE SCRIPT: one pgbench run, its TPS kept in runs[NAME]
bench() {
	local out tps
	out=$("$PGBIN/pgbench" -n -h 127.0.0.1 -p "${ports[$2]}" -c "$clients" -j 2 -T "$seconds" \
		-f "$work/$3.sql" idem 2>&1) || { echo "$out" >&2; exit 1; }
	if grep -qE 'number of failed transactions: [1-9]' <<<"$out"; then
		echo "$out" >&2
		exit 1
	fi
	tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' <<<"$out")
	runs[$1]="${runs[$1]:-} $tps"
	echo "  $1: $tps"
}
median() {
	tr ' ' '\n' <<<"${runs[$1]}" | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END { printf "%.0f", v[int((NR + 1) / 2)] }'
}

loads=("$(cut -d' ' -f1-3 /proc/loadavg)")
for r in $(seq 1 "$rounds"); do
	echo "== round $r of $rounds (load average $(cut -d' ' -f1-3 /proc/loadavg))"
	for w in "${workloads[@]}"; do
		node=0
		[ "${w%_worker}" != "$w" ] && node=1
		# alternate which of the two goes first
		if [ $((r % 2)) = 1 ]; then
			bench "citus-$w" "$node" "$w"
			bench "plain-$w" 3 "$w"
		else
			bench "plain-$w" 3 "$w"
			bench "citus-$w" "$node" "$w"
		fi
	done
	loads+=("$(cut -d' ' -f1-3 /proc/loadavg)")
done

echo
echo "fsync = $fsync, $clients clients, $seconds s per run, median of $rounds rounds;" \
	"load average (1, 5, 15 min) before and after each round: $(IFS=';'; echo "${loads[*]}" | sed 's/;/; /g')"
echo "Citus $(q 0 -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'"), $("$PGBIN/postgres" --version)"
echo
echo "| transactions per second | Citus | one plain server | ratio |"
echo "|---|---:|---:|---:|"
declare -A label=(
	[new]="new keys (reserve, insert, complete, commit), through the coordinator"
	[new_worker]="new keys on the worker that holds the scope"
	[replay]="replays, through the coordinator"
	[replay_worker]="replays on the worker that holds the scope")
for w in "${workloads[@]}"; do
	c=$(median "citus-$w")
	p=$(median "plain-$w")
	printf '| %s | %s | %s | %s |\n' "${label[$w]}" "$c" "$p" "$(awk -v c="$c" -v p="$p" 'BEGIN { printf "%.2f", c / p }')"
done
echo
for w in "${workloads[@]}"; do
	echo "runs of $w: Citus${runs[citus-$w]}; plain${runs[plain-$w]}"
done
