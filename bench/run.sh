#!/usr/bin/env bash
# All benchmarks, side by side in one run: `bash bench/run.sh`.
#
# Same set-up as the test suite (packages, -Werror build, install, throwaway
# cluster as a non-root user), but with fsync on.  Then every bench/suites/*.sh
# is sourced in name order; each prints a Markdown table of TPS or rows/s and
# the ratios its issue names.  Not a timed test: numbers vary by machine.
#
# Environment: BENCH_SECONDS (per pgbench run, default 6), BENCH_ROUNDS
# (rounds of the core and patterns suites, whose tables show medians;
# default 3), BENCH_CLIENTS (default 4), BENCH_ONLY=glob to run some suites
# only, BENCH_CHARTS (where the charts go: bench/ of this tree by default,
# empty for none).

source "$(dirname "$0")/../test/lib.sh"
source "$IDEM_ROOT/bench/lib.sh"

# the load generator's libraries, the Redis variants' server, the charts
IDEM_PACKAGES+=(libpq-dev libhiredis-dev redis-server gnuplot-nox)
idem_setup "max_wal_size = '4GB'" "checkpoint_timeout = '30min'" \
	"shared_buffers = '1GB'" "autovacuum_naptime = '10s'"

# stop redis-server (if a suite started one) before the cluster goes
trap 'bench_rc=$?; set +e; bench_redis_stop; (exit $bench_rc); idem_cleanup' EXIT

echo "# idempotency benchmarks"
echo
echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'), $(nproc) cores," \
	"$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)," \
	"pgbench -c $BENCH_CLIENTS -j $BENCH_JOBS -T $BENCH_SECONDS per run," \
	"$BENCH_ROUNDS rounds of the core and patterns suites."
for suite in "$IDEM_SRC"/bench/suites/${BENCH_ONLY:-*}.sh; do
	[ -e "$suite" ] || continue
	echo
	source "$suite"
done
# 80_nocontention's and 85_storm's results as SVG charts (bench/charts.gp)
bench_charts
# a suite that found a broken guarantee (90_faults) names it here
if [ -n "${BENCH_FAIL:-}" ]; then
	echo
	echo "FAIL: $BENCH_FAIL"
	exit 1
fi
