# The retry storm (issue 18): STORM_CLIENTS (default 16) connections take
# attempts from one queue in which every request appears STORM_COPIES
# (default 4) times in a row, so that each request goes out that many times
# at once; the effect (the payment INSERT) takes STORM_EFFECT_MS (default
# 10) ms (pg_sleep in a trigger, bench/core/effect_delay.sql).  Variants:
# the extension's one server call (e) and idem_call, the seed's PL/pgSQL (c)
# and the seed's Redis pattern (h), the same bench/core scripts as
# 80_nocontention with the keys the load generator gives them.
#
# Measured: the latency of the duplicates (every attempt but the one that
# ran the effect, which the trigger's notice marks), p50 and p99; completed
# requests per second; backends waiting on a lock (pg_stat_activity
# wait_event_type = 'Lock', sampled every 20 ms) and active; effects per
# request, counted in the database (payments per order id).  An in-progress answer raised as an
# ERROR (idem_call's ID003, the PL/pgSQL's P0409) is an answer, as an
# HTTP 409 would be.  The tables start as bench/core/reset.sql leaves them;
# each variant has keys of its own.  STORM_SECONDS (default 8) per variant, synchronous_commit on.

STORM_CLIENTS=${STORM_CLIENTS:-16}
STORM_COPIES=${STORM_COPIES:-4}
STORM_EFFECT_MS=${STORM_EFFECT_MS:-10}
STORM_SECONDS=${STORM_SECONDS:-8}
declare -A STORM_EFFECTS
bench_loadgen_build
bench_redis_start

STORM_DB=idem_bench_storm
bench_core_db "$STORM_DB" "$STORM_EFFECT_MS"

STORM_VARIANTS="e_ext_server i_ext_call c_seed_plpgsql h_seed_redis"
for v in $STORM_VARIANTS; do
	as_test_user redis-cli -s "$REDIS_SOCK" flushall >/dev/null
	bench_load "storm/$v" "$IDEM_SRC/bench/core/$v.sql" "$STORM_DB" \
		-c "$STORM_CLIENTS" --copies "$STORM_COPIES" -T "$STORM_SECONDS" \
		--key-var k --key-shape seq --key-prefix "storm-$v" \
		--answer-sqlstates ID003,P0409 --redis "$REDIS_SOCK" --sample
	STORM_EFFECTS[$v]=$(BENCH_DB=$STORM_DB bench_value \
		"SELECT round(count(*)::numeric / nullif(count(DISTINCT order_id), 0), 3)
		 FROM bench_payments WHERE order_id LIKE 'o-storm-$v-%'")
done
as_test_user dropdb "$STORM_DB"

echo "## The retry storm (85_storm)"
echo
echo "$STORM_CLIENTS connections, each request sent $STORM_COPIES times at once, a $STORM_EFFECT_MS ms effect," \
	"${STORM_SECONDS} s per variant, synchronous_commit on, prepared statements."
echo "Backends: the mean of 20 ms samples of pg_stat_activity over the run."
echo
echo "| variant | duplicate latency p50 ms | p99 ms | completed requests/s | backends waiting on a lock | backends active | effects per request (in the database) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
storm_row() {
	local v=$2
	printf '| %s | %s | %s | %.0f | %s | %s | %s |\n' "$1" \
		"$(load_get "storm/$v" dup_p50_ms)" "$(load_get "storm/$v" dup_p99_ms)" \
		"$(load_get "storm/$v" rps)" "$(load_get "storm/$v" lock_waiting)" \
		"$(load_get "storm/$v" active)" \
		"${STORM_EFFECTS[$v]}"
}
storm_row "(e) the extension, one server call" e_ext_server
storm_row "idem_call" i_ext_call
storm_row "(c) the seed's PL/pgSQL with ON CONFLICT" c_seed_plpgsql
storm_row "(h) the seed's Redis pattern" h_seed_redis

# the chart (bench/charts.gp): duplicate latency per variant against the
# effect's duration; | breaks a label's line
bench_chart_row storm variant label dup_p50_ms dup_p99_ms rps effect_ms
for v in "e_ext_server|(e) extension,|one server call" "i_ext_call|idem_call" \
	"c_seed_plpgsql|(c) hand-written|PL/pgSQL, ON CONFLICT" "h_seed_redis|(h) Redis pattern|SET NX, INSERT, SET"; do
	bench_chart_row storm "${v%%|*}" "${v#*|}" "$(load_get "storm/${v%%|*}" dup_p50_ms)" \
		"$(load_get "storm/${v%%|*}" dup_p99_ms)" "$(load_get "storm/${v%%|*}" rps)" "$STORM_EFFECT_MS"
done
