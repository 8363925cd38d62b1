# No contention (issue 18): every request a new key, BENCH_CLIENTS
# connections, all driven by one C client (bench/loadgen.c) that runs
# bench/core's scripts, so that every variant pays the same client costs:
#   (a) a bare INSERT of the payment        (g) the floor: payment + bare key row
#   (c) the seed's PL/pgSQL, ON CONFLICT    (e) the extension, one server call
#   idem_call with a handler that inserts the payment
#   (h) the seed's Redis pattern: SET NX, INSERT, SET, against redis-server
#   (b) the seed's SQL as client statements, (d) the extension's client
#       statements (BEGIN; idem_reserve; INSERT; idem_complete; COMMIT)
#   (f) a replay of a completed key, (j) a bare primary-key SELECT of the
#       same record's response (what a replay is measured against)
# Prepared statements (as drivers send them) with synchronous_commit off
# and on; the simple protocol (sync off) beside them.  Server CPU per request
# is the utime + stime of the server's processes over the run (and of
# redis-server for (h)), from /proc, divided by the requests; WAL bytes per
# request are pg_current_wal_lsn()'s advance over the run, divided likewise.
#
# LOAD_SECONDS (default 3) per run, LOAD_ROUNDS (default 3) interleaved
# rounds; every run starts from bench/core/reset.sql's tables and an empty
# Redis.  The tables show medians.

LOAD_SECONDS=${LOAD_SECONDS:-3}
LOAD_ROUNDS=${LOAD_ROUNDS:-3}
bench_loadgen_build
bench_redis_start

NC_DB=idem_bench_nc
bench_core_db "$NC_DB"

NC_VARIANTS="a_bare_insert g_floor c_seed_plpgsql e_ext_server i_ext_call h_seed_redis b_seed_client d_ext_client f_replay j_select_response"
for round in $(seq 1 "$LOAD_ROUNDS"); do
	for mode in off on simple; do
		sync=$mode protocol=prepared
		[ "$mode" = simple ] && sync=off protocol=simple
		for v in $NC_VARIANTS; do
			BENCH_DB=$NC_DB bench_sql "$IDEM_SRC/bench/core/reset.sql" >/dev/null
			as_test_user redis-cli -s "$REDIS_SOCK" flushall >/dev/null
			bench_load "nc/$v/$mode/$round" "$IDEM_SRC/bench/core/$v.sql" \
				"$NC_DB options='-c synchronous_commit=$sync'" \
				-c "$BENCH_CLIENTS" -T "$LOAD_SECONDS" -M "$protocol" \
				--redis "$REDIS_SOCK" --server-pid "$(bench_postmaster_pid)" \
				--redis-pid "$REDIS_PID" --wal
		done
	done
done
as_test_user dropdb "$NC_DB"

# median of a field: nc_m VARIANT MODE FIELD
nc_m() { load_median "nc/$1/$2" "$3"; }
# a / b with two decimals
nc_div() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
nc_cpu() {
	local cpu redis
	cpu=$(nc_m "$1" "$2" server_cpu_us)
	if [ "$1" = h_seed_redis ]; then
		redis=$(nc_m "$1" "$2" redis_cpu_us)
		printf '%.0f + %.0f in Redis' "$cpu" "$redis"
	else
		printf '%.0f' "$cpu"
	fi
}
nc_row() {
	local v=$2 base=${3:-a_bare_insert} mode cells=""
	for mode in off on simple; do
		cells="$cells | $(printf '%.0f' "$(nc_m "$v" "$mode" rps)") | $(nc_div "$(nc_m "$v" "$mode" rps)" "$(nc_m "$base" "$mode" rps)") | $(nc_cpu "$v" "$mode")"
	done
	echo "| $1$cells | $(printf '%.0f' "$(nc_m "$v" off wal_bytes)") |"
}

# the chart (bench/charts.gp): new-key variants, req/s and ratio to (a),
# sync off and on; | breaks a label's line
bench_chart_row nocontention variant label off_rps off_ratio on_rps on_ratio
for v in "a_bare_insert|(a) bare INSERT|of the payment" "g_floor|(g) floor: payment|+ bare key row" \
	"c_seed_plpgsql|(c) hand-written|PL/pgSQL" "e_ext_server|(e) extension,|one server call" \
	"i_ext_call|idem_call" "h_seed_redis|(h) Redis pattern|SET NX, INSERT, SET" \
	"b_seed_client|(b) hand-written|client statements" "d_ext_client|(d) extension,|client statements"; do
	bench_chart_row nocontention "${v%%|*}" "${v#*|}" \
		"$(nc_m "${v%%|*}" off rps)" "$(nc_div "$(nc_m "${v%%|*}" off rps)" "$(nc_m a_bare_insert off rps)")" \
		"$(nc_m "${v%%|*}" on rps)" "$(nc_div "$(nc_m "${v%%|*}" on rps)" "$(nc_m a_bare_insert on rps)")"
done

echo "## No contention: one request per transaction, every variant from one client (80_nocontention)"
echo
echo "bench/loadgen.c, $BENCH_CLIENTS connections, median of $LOAD_ROUNDS rounds of ${LOAD_SECONDS} s runs;"
echo "each round runs every variant once per column, each from bench/core/reset.sql's tables."
echo "Ratios are to (a) in the same column unless the row says otherwise. Server CPU is µs"
echo "of utime + stime of every server process per request; WAL bytes per request are"
echo "from the sync off, prepared runs."
echo
echo "| per request | sync off, prepared: req/s | ratio | server CPU µs | sync on, prepared: req/s | ratio | server CPU µs | sync off, simple protocol: req/s | ratio | server CPU µs | WAL bytes |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
nc_row "(a) bare INSERT of the payment" a_bare_insert
nc_row "(g) floor: payment + bare key row, one statement" g_floor
nc_row "(c) the seed's PL/pgSQL with ON CONFLICT" c_seed_plpgsql
nc_row "(e) the extension, one server call" e_ext_server
nc_row "idem_call, the handler inserts the payment" i_ext_call
nc_row "(h) the seed's Redis pattern (SET NX, INSERT, SET)" h_seed_redis
nc_row "(b) the seed's SQL as client statements" b_seed_client
nc_row "(d) the extension's client statements" d_ext_client
nc_row "(d) against (b)" d_ext_client b_seed_client
nc_row "(f) replay of a completed key" f_replay
nc_row "(j) bare primary-key SELECT of the same record's response" j_select_response
nc_row "(f) against (j)" f_replay j_select_response
echo
echo "Targets (issue 18, item 2), from the table above:"
echo
echo "| target | wanted | measured | |"
echo "|---|---:|---:|---|"
target_row "(e) one server call / (a), sync off" "$(nc_div "$(nc_m e_ext_server off rps)" "$(nc_m a_bare_insert off rps)")" ">=" 0.70
target_row "idem_call / (a), sync off" "$(nc_div "$(nc_m i_ext_call off rps)" "$(nc_m a_bare_insert off rps)")" ">=" 0.70
target_row "(d) client statements / (b) hand-written, prepared, sync off" "$(nc_div "$(nc_m d_ext_client off rps)" "$(nc_m b_seed_client off rps)")" ">=" 1.0
target_row "(f) replay / (a), sync off" "$(nc_div "$(nc_m f_replay off rps)" "$(nc_m a_bare_insert off rps)")" ">=" 1.3
target_row "server CPU per request, (e) / (a), sync off" "$(nc_div "$(nc_m e_ext_server off server_cpu_us)" "$(nc_m a_bare_insert off server_cpu_us)")" "<=" 2.0
target_row "server CPU per request, idem_call / (a), sync off" "$(nc_div "$(nc_m i_ext_call off server_cpu_us)" "$(nc_m a_bare_insert off server_cpu_us)")" "<=" 2.0
target_row "(e) one server call / (a), sync on" "$(nc_div "$(nc_m e_ext_server on rps)" "$(nc_m a_bare_insert on rps)")" ">=" 0.85
target_row "idem_call / (a), sync on" "$(nc_div "$(nc_m i_ext_call on rps)" "$(nc_m a_bare_insert on rps)")" ">=" 0.85
echo
echo "Targets (issue 25, item 2), from the table above:"
echo
echo "| target | wanted | measured | |"
echo "|---|---:|---:|---|"
for v in e_ext_server i_ext_call; do
	label=$([ $v = e_ext_server ] && echo "(e) one server call" || echo "idem_call")
	target_row "$label / (c) PL/pgSQL, sync off" "$(nc_div "$(nc_m $v off rps)" "$(nc_m c_seed_plpgsql off rps)")" ">=" 1.3
	target_row "$label / (a), sync off" "$(nc_div "$(nc_m $v off rps)" "$(nc_m a_bare_insert off rps)")" ">=" 0.60
	target_row "$label / (c) PL/pgSQL, sync on" "$(nc_div "$(nc_m $v on rps)" "$(nc_m c_seed_plpgsql on rps)")" ">=" 1.1
	target_row "$label / (a), sync on" "$(nc_div "$(nc_m $v on rps)" "$(nc_m a_bare_insert on rps)")" ">=" 0.85
	target_row "$label: WAL bytes per request / the floor (g)'s" "$(nc_div "$(nc_m $v off wal_bytes)" "$(nc_m g_floor off wal_bytes)")" "<=" 1.5
done
echo
echo "The floor a missed target is measured against: (g) / (a), sync off, is $(nc_div "$(nc_m g_floor off rps)" "$(nc_m a_bare_insert off rps)");"
echo "its server CPU over (a)'s is $(nc_div "$(nc_m g_floor off server_cpu_us)" "$(nc_m a_bare_insert off server_cpu_us)")."
