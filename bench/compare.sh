#!/usr/bin/env bash
# This tree against an earlier commit, side by side in one run:
#   bash bench/compare.sh [BASE]        (BASE: a commit, default BENCH_BASE)
#
# Builds both into two private copies of Debian's PostgreSQL 15 (OLD_PG,
# NEW_PG: made from /usr/lib/postgresql/15 when absent), starts one cluster
# for each (the library preloaded, fsync on, the settings of bench/run.sh),
# and runs the same bench/core scripts of this tree against both: (e) one
# server call, (f) a replay, with synchronous_commit off and on.  Each round
# runs every variant on both clusters, old and new in alternating order,
# each from bench/core/reset.sql.  Prints median TPS and new/old ratios,
# then the in-session time of a replay and of a reserve + complete on each
# (a PL/pgSQL loop of BENCH_CALLS calls, the fastest of 5 runs).
#
# Environment: BENCH_SECONDS (per pgbench run, default 15), BENCH_ROUNDS
# (default 3), BENCH_CLIENTS (4), BENCH_JOBS (2), BENCH_CALLS (10000),
# BENCH_MODE (simple, the default: pgbench with the simple protocol; or
# prepared: the suites' load generator, bench/loadgen.c, with prepared
# statements as drivers send them, the same scripts), BENCH_VARIANTS (the bench/core scripts to run,
# default "e_ext_server f_replay"; a_bare_insert among them adds each
# variant's ratio to it on the same build).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=${1:-${BENCH_BASE:-973c05dc67b0c0dc51171e880f5ac0319ca3b998}}
OLD_PG=${OLD_PG:-/opt/pg-bench-old}
NEW_PG=${NEW_PG:-/opt/pg-bench-new}
BENCH_SECONDS=${BENCH_SECONDS:-15}
BENCH_ROUNDS=${BENCH_ROUNDS:-3}
BENCH_CLIENTS=${BENCH_CLIENTS:-4}
BENCH_JOBS=${BENCH_JOBS:-2}
BENCH_CALLS=${BENCH_CALLS:-10000}
BENCH_MODE=${BENCH_MODE:-simple}
BENCH_VARIANTS=${BENCH_VARIANTS:-e_ext_server f_replay}
BIN=usr/lib/postgresql/15/bin
USER_=postgres
[ "$(id -u)" = 0 ] || USER_=$(id -un)

as_user() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# A relocatable copy of Debian's PostgreSQL 15, to install one build into
pg_copy() {
	local dest=$1
	[ -x "$dest/$BIN/postgres" ] && return 0
	mkdir -p "$dest/usr/lib/postgresql" "$dest/usr/share/postgresql" "$dest/usr/include"
	cp -a /usr/lib/postgresql/15 "$dest/usr/lib/postgresql/"
	cp -a /usr/share/postgresql/15 "$dest/usr/share/postgresql/"
	cp -a /usr/include/postgresql "$dest/usr/include/"
}

WORK=$(mktemp -d /tmp/idem-compare.XXXXXX)
chmod 755 "$WORK"
cleanup() {
	local side
	for side in old new; do
		[ -f "$WORK/$side/data/postmaster.pid" ] &&
			as_user "$(pg_of $side)/$BIN/pg_ctl" -D "$WORK/$side/data" -m fast -w stop >/dev/null 2>&1
	done
	rm -rf "$WORK"
}
trap cleanup EXIT
pg_of() { if [ "$1" = old ]; then echo "$OLD_PG"; else echo "$NEW_PG"; fi; }
port_of() { if [ "$1" = old ]; then echo 55611; else echo 55612; fi; }

echo "== building $BASE (old) and this tree (new)" >&2
mkdir -p "$WORK/old/src" "$WORK/new/src" "$WORK/sock"
git -C "$ROOT" archive "$BASE" | tar -x -C "$WORK/old/src"
rsync -a --exclude .git --exclude '*.o' --exclude '*.so' --exclude '*.bc' "$ROOT/" "$WORK/new/src/"
for side in old new; do
	pg_copy "$(pg_of $side)"
	make -C "$WORK/$side/src" -s PG_CONFIG="$(pg_of $side)/$BIN/pg_config" >/dev/null
	make -C "$WORK/$side/src" -s PG_CONFIG="$(pg_of $side)/$BIN/pg_config" install >/dev/null
done
if [ "$BENCH_MODE" = prepared ]; then
	gcc -O2 -Wall -Wextra -Werror -o "$WORK/loadgen" "$ROOT/bench/loadgen.c" \
		-I"$("$NEW_PG/$BIN/pg_config" --includedir)" -lpq -lhiredis -lpthread
fi
[ "$(id -u)" = 0 ] && chown -R postgres: "$WORK"

for side in old new; do
	as_user "$(pg_of $side)/$BIN/initdb" -D "$WORK/$side/data" --auth=trust \
		--encoding=UTF8 --locale=C >/dev/null
	cat >>"$WORK/$side/data/postgresql.conf" <<-EOF
		listen_addresses = ''
		unix_socket_directories = '$WORK/sock'
		port = $(port_of $side)
		shared_preload_libraries = 'idempotency'
		shared_buffers = '512MB'
		max_wal_size = '4GB'
		checkpoint_timeout = '30min'
		autovacuum_naptime = '10s'
	EOF
	as_user "$(pg_of $side)/$BIN/pg_ctl" -D "$WORK/$side/data" -l "$WORK/$side/server.log" -w start >/dev/null
	as_user "$(pg_of $side)/$BIN/createdb" -h "$WORK/sock" -p "$(port_of $side)" bench
	as_user "$(pg_of $side)/$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK/sock" \
		-p "$(port_of $side)" -d bench -f "$ROOT/bench/core/setup.sql" >/dev/null
done

psql_on() {
	local side=$1
	shift
	as_user "$(pg_of $side)/$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$WORK/sock" \
		-p "$(port_of $side)" -d bench "$@"
}

declare -A RUNS
tps_run() {
	local side=$1 variant=$2 sync=$3 label=${4:-} out tps
	psql_on "$side" -c "ALTER DATABASE bench SET synchronous_commit = $sync" >/dev/null
	psql_on "$side" -f "$ROOT/bench/core/reset.sql" >/dev/null
	if [ "$BENCH_MODE" = prepared ]; then
		out=$(as_user "$WORK/loadgen" -d "host=$WORK/sock port=$(port_of $side) dbname=bench" \
			-c "$BENCH_CLIENTS" -T "$BENCH_SECONDS" -f "$ROOT/bench/core/$variant.sql" 2>&1)
		tps=$(sed -n 's/.*\brps=\([0-9.]*\).*/\1/p' <<<"$out")
	else
		out=$(as_user "$(pg_of $side)/$BIN/pgbench" -n -h "$WORK/sock" -p "$(port_of $side)" \
			-c "$BENCH_CLIENTS" -j "$BENCH_JOBS" -T "$BENCH_SECONDS" \
			-f "$ROOT/bench/core/$variant.sql" bench 2>&1)
		tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' <<<"$out")
	fi
	[ -n "$tps" ] || { echo "$out" >&2; exit 1; }
	RUNS[$side/$variant/$sync$label]="${RUNS[$side/$variant/$sync$label]:-} $tps"
	printf '  round %d %-4s %-14s sync %-3s %-8s %8.0f tps\n' "$round" "$side" "$variant" "$sync" "$label" "$tps" >&2
}

median() {
	tr ' ' '\n' <<<"$1" | sed '/^$/d' | sort -g |
		awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# Where (e)'s time goes on the new build, synchronous_commit off: the same
# run without the install script's CHECK on status (every write evaluates
# it), and without the expires_at index (a completion is then a HOT update
# again).  Diagnostics only: the extension needs both.
parts_run() {
	psql_on new -c "ALTER TABLE idem_keys DROP CONSTRAINT idem_keys_status_check" >/dev/null
	tps_run new e_ext_server off "no_check"
	psql_on new -c "ALTER TABLE idem_keys ADD CONSTRAINT idem_keys_status_check CHECK (status IN ('processing', 'completed', 'stuck'))" >/dev/null
	psql_on new -c "DROP INDEX idem_keys_expires_at_idx" >/dev/null
	tps_run new e_ext_server off "hot"
	psql_on new -c "CREATE INDEX idem_keys_expires_at_idx ON idem_keys (expires_at)" >/dev/null
}

for round in $(seq 1 "$BENCH_ROUNDS"); do
	if [ $((round % 2)) = 1 ]; then order="old new"; else order="new old"; fi
	for sync in off on; do
		for variant in $BENCH_VARIANTS; do
			for side in $order; do
				tps_run "$side" "$variant" "$sync"
			done
		done
	done
	[ "${BENCH_PARTS:-1}" = 1 ] && parts_run
done

# In-session time: the fastest of 5 loops of BENCH_CALLS calls, in µs per call
in_session() {
	local side=$1
	psql_on "$side" -f "$ROOT/bench/core/reset.sql" >/dev/null
	psql_on "$side" -At -v calls="$BENCH_CALLS" <<-'EOF'
		CREATE FUNCTION pg_temp.loop(what text, calls int, run int) RETURNS float8
		LANGUAGE plpgsql AS $$
		DECLARE
			t0 timestamptz := clock_timestamp();
			r record;
			req jsonb;
		BEGIN
			FOR i IN 1..calls LOOP
				IF what = 'replay' THEN
					r := idem_reserve('create-payment', 'replay-' || (i % 10000 + 1),
									  jsonb_build_object('order_id', 'o-' || (i % 10000 + 1), 'amount', 100),
									  'acct-1');
				ELSIF what = 'reserve_complete' THEN
					r := idem_reserve('create-payment', 'loop-' || run || '-' || i,
									  jsonb_build_object('order_id', 'o-' || i, 'amount', 100),
									  'acct-1');
					PERFORM idem_complete('create-payment', 'loop-' || run || '-' || i,
										  '{"status": "paid"}', 201, i::text, 'acct-1');
				ELSE
					req := jsonb_build_object('order_id', 'o-' || i, 'amount', 100);
				END IF;
			END LOOP;
			RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / calls;
		END
		$$;
		SELECT w, round(min(pg_temp.loop(w, :calls, run))::numeric, 2)
		FROM unnest(ARRAY['floor', 'replay', 'reserve_complete']) w, generate_series(1, 5) run
		GROUP BY w ORDER BY w;
	EOF
}

echo "## bench/core, $BASE (old) against this tree (new)"
echo
if [ "$BENCH_ROUNDS" -gt 0 ]; then
if [ "$BENCH_MODE" = prepared ]; then
	echo "bench/loadgen.c (prepared statements) -c $BENCH_CLIENTS -T $BENCH_SECONDS per run, median of $BENCH_ROUNDS rounds;"
else
	echo "pgbench -c $BENCH_CLIENTS -j $BENCH_JOBS -T $BENCH_SECONDS per run, median of $BENCH_ROUNDS rounds;"
fi
echo "each round runs every variant on both builds, in alternating order."
echo
echo "new/old is the ratio of the medians; per round, the median of each round's own ratio"
echo "(the two builds ran back to back), which load from outside the run disturbs less."
echo
echo "| variant | synchronous_commit | old TPS | new TPS | new/old | per round | old/(a) | new/(a) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
for variant in $BENCH_VARIANTS; do
	for sync in off on; do
		o=$(median "${RUNS[old/$variant/$sync]}")
		n=$(median "${RUNS[new/$variant/$sync]}")
		r=$(median "$(paste -d' ' <(tr ' ' '\n' <<<"${RUNS[old/$variant/$sync]}" | sed '/^$/d') \
			<(tr ' ' '\n' <<<"${RUNS[new/$variant/$sync]}" | sed '/^$/d') | awk '{ print $2 / $1 }')")
		ao=$(median "${RUNS[old/a_bare_insert/$sync]:-}")
		an=$(median "${RUNS[new/a_bare_insert/$sync]:-}")
		awk -v v="$variant" -v s="$sync" -v o="$o" -v n="$n" -v r="$r" -v ao="${ao:-0}" -v an="${an:-0}" \
			'BEGIN { ro = (ao > 0) ? sprintf("%.2f", o / ao) : ""; rn = (an > 0) ? sprintf("%.2f", n / an) : ""
				printf "| %s | %s | %.0f | %.0f | %.2f | %.2f | %s | %s |\n", v, s, o, n, n / o, r, ro, rn }'
	done
done
if [ "${BENCH_PARTS:-1}" = 1 ]; then
	echo
	echo "Where (e)'s time goes on the new build, synchronous_commit off (median TPS):"
	echo
	echo "| new build | TPS | vs new (e) |"
	echo "|---|---:|---:|"
	e=$(median "${RUNS[new/e_ext_server/off]}")
	for label in no_check hot; do
		t=$(median "${RUNS[new/e_ext_server/off$label]}")
		case $label in
			no_check) what="without the status CHECK (not evaluated)" ;;
			hot) what="without the expires_at index (completion HOT)" ;;
		esac
		awk -v w="$what" -v t="$t" -v e="$e" 'BEGIN { printf "| %s | %.0f | %.2f |\n", w, t, t / e }'
	done
fi
echo
echo "Runs (TPS): "
for key in $(printf '%s\n' "${!RUNS[@]}" | sort); do
	echo "- $key:${RUNS[$key]}"
done
echo
fi
echo "In-session µs per call (fastest of 5 loops of $BENCH_CALLS in PL/pgSQL; floor: the loop"
echo "building the request only):"
echo
echo "| call | old µs | new µs |"
echo "|---|---:|---:|"
declare -A US
for side in old new; do
	while IFS='|' read -r what us; do
		US[$side/$what]=$us
	done < <(in_session "$side")
done
for what in floor replay reserve_complete; do
	echo "| $what | ${US[old/$what]} | ${US[new/$what]} |"
done
