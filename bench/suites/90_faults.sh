# The fault run (issue 18): retries in flight while something fails.
# FAULT_CLIENTS (default 8) connections each send a new request, then the
# requests they sent 20 and 100 requests ago again (retries of requests
# whose answer was lost), for FAULT_SECONDS (default 6); FAULT_AT (default
# 2) seconds in, one fault:
#   (i)   Redis restarted: kill -9 and started again (a crash or an OOM
#         kill); with Debian's default persistence (RDB snapshots, no AOF)
#         the keys written since the last snapshot are gone
#   (ii)  a backend killed with kill -9: PostgreSQL restarts all backends
#   (iii) PostgreSQL restarted with pg_ctl restart -m immediate
# for the seed's Redis pattern (h) and the extension's one server call (e),
# with synchronous_commit off (a crash loses the last commits: the
# extension's record goes with its effect).  The effect takes 2 ms
# (bench/core/effect_delay.sql), so that some are in flight when the fault
# comes.  Duplicate effects are counted in the database: payments per order
# id beyond the first; requests without any effect are counted beside them.
# The extension must have no duplicate: the suite prints
# FAIL and bench/run.sh exits non-zero otherwise.

FAULT_CLIENTS=${FAULT_CLIENTS:-8}
FAULT_SECONDS=${FAULT_SECONDS:-6}
FAULT_AT=${FAULT_AT:-2}
# the script of the extension's column: bench/core/i_ext_call.sql runs
# idem_call; a script with no idempotency at all (a_bare_insert) shows
# that the check fails
FAULT_EXT=${FAULT_EXT:-e_ext_server}
bench_loadgen_build
bench_redis_start

FAULT_DB=idem_bench_faults
bench_core_db "$FAULT_DB" 2

fault_inject() {
	case $1 in
		redis)
			bench_redis_crash
			bench_redis_start
			;;
		backend)
			local pid
			pid=$(BENCH_DB=$FAULT_DB bench_value "SELECT pid FROM pg_stat_activity
				WHERE datname = current_database() AND backend_type = 'client backend'
				  AND pid <> pg_backend_pid() ORDER BY random() LIMIT 1")
			kill -9 "$pid"
			;;
		postgres)
			as_test_user "$PGBIN/pg_ctl" -D "$IDEM_WORK/data" -l "$IDEM_WORK/server.log" \
				-m immediate -w -t 60 restart >/dev/null
			;;
	esac
}

declare -A FAULT_DUPS FAULT_REQS FAULT_LOST
for fault in redis backend postgres; do
	for v in h_seed_redis "$FAULT_EXT"; do
		[ "$fault" = redis ] && [ "$v" = "$FAULT_EXT" ] && continue
		as_test_user redis-cli -s "$REDIS_SOCK" flushall >/dev/null
		prefix=fault-$v-$fault
		out=$IDEM_WORK/fault-$prefix.out
		as_test_user "$LOADGEN" -d "host=$PGHOST port=$PGPORT dbname=$FAULT_DB options='-c synchronous_commit=off'" \
			-f "$IDEM_SRC/bench/core/$v.sql" -c "$FAULT_CLIENTS" -T "$FAULT_SECONDS" \
			--key-var k --key-shape seq --key-prefix "$prefix" --retry-lags 20,100 \
			--answer-sqlstates ID003,P0409 --redis "$REDIS_SOCK" >"$out" &
		loadgen_pid=$!
		sleep "$FAULT_AT"
		fault_inject "$fault"
		wait "$loadgen_pid" || { echo "loadgen failed: $prefix" >&2; exit 1; }
		# a killed backend's crash recovery may outlast the run
		for i in $(seq 1 600); do
			as_test_user "$PGBIN/pg_isready" -q -d "$FAULT_DB" && break
			sleep 0.1
		done
		LOAD[$prefix]=$(cat "$out")
		printf '  %-36s %s\n' "$prefix" "${LOAD[$prefix]}" >&2
		FAULT_REQS[$prefix]=$(load_get "$prefix" requests)
		read -r FAULT_DUPS[$prefix] FAULT_LOST[$prefix] < <(BENCH_DB=$FAULT_DB bench_value "
			SELECT count(*) - count(DISTINCT order_id), ${FAULT_REQS[$prefix]} - count(DISTINCT order_id)
			FROM bench_payments WHERE order_id LIKE 'o-$prefix-%'" | tr '|' ' ')
	done
done
as_test_user dropdb "$FAULT_DB"

echo "## The fault run (90_faults)"
echo
echo "$FAULT_CLIENTS connections, each sending a new request and then, again, the requests it sent 20 and 100"
echo "requests before; the fault ${FAULT_AT} s into a ${FAULT_SECONDS} s run; synchronous_commit off; a 2 ms effect."
echo "Duplicate effects: payments in the database beyond the first for the same request. Without an"
echo "effect: requests sent (and retried) that have no payment at the end: the Redis pattern's key"
echo "left PROCESSING by a failed attempt, or kept as done when the crash lost the payment."
echo
echo "| fault | Redis pattern (h): requests | duplicate effects | without an effect | extension ($FAULT_EXT): requests | duplicate effects | without an effect | |"
echo "|---|---:|---:|---:|---:|---:|---:|---|"
for fault in redis backend postgres; do
	case $fault in
		redis) label="(i) Redis restarted (kill -9, started again)" ;;
		backend) label="(ii) a backend killed (kill -9)" ;;
		postgres) label="(iii) PostgreSQL restarted, immediate shutdown" ;;
	esac
	h=fault-h_seed_redis-$fault e=fault-$FAULT_EXT-$fault
	if [ "$fault" = redis ]; then
		printf '| %s | %s | %s | %s | no Redis | | | |\n' "$label" "${FAULT_REQS[$h]}" \
			"${FAULT_DUPS[$h]}" "${FAULT_LOST[$h]}"
		continue
	fi
	verdict=ok
	if [ "${FAULT_DUPS[$e]}" != 0 ]; then
		verdict=FAIL
		BENCH_FAIL="${BENCH_FAIL:+$BENCH_FAIL; }90_faults: the extension made ${FAULT_DUPS[$e]} duplicate effects ($label)"
	fi
	printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" "${FAULT_REQS[$h]}" \
		"${FAULT_DUPS[$h]}" "${FAULT_LOST[$h]}" "${FAULT_REQS[$e]}" "${FAULT_DUPS[$e]}" \
		"${FAULT_LOST[$e]}" "$verdict"
done
