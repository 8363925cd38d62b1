# Foundation (issue 2): a payment with an idempotency key, side by side with
# its baselines on the same schema and data, synchronous_commit off and on.
#   (a) a bare INSERT of the payment row
#   (b) the seed's hand-written SQL pattern, as client statements
#   (c) the same logic as one PL/pgSQL function
#   (d) the extension as client statements: BEGIN; reserve; insert; complete; COMMIT
#   (e) the extension in one server-side call (PL/pgSQL around reserve/complete)
#   (f) the replay path: idem_reserve of a completed key
#   (g) the floor: the payment row plus one bare key row in a unique index,
#       in one statement, with no check; no idempotency design writes less
# Targets: e/a >= 0.80, e/c >= 1.3, d/b >= 1.0, f/a >= 1.0.
#
# Then, with synchronous_commit off only, where (e)'s time goes: the same
# flow with its fingerprint or its completion left out (x2, x3, against x1,
# which has both), and the floor's two rows written from PL/pgSQL (x4).
#
# BENCH_ROUNDS rounds (default 3) each run every variant once; the table
# shows the median TPS of each.
#
# Every run starts from the same tables (bench/core/reset.sql): 50,000 rows
# each, 10,000 of idem_keys' being completed keys for (f) to replay.
#
# Keys and order ids are literals ('k-:k': pgbench substitutes inside the
# string), as an application sends them; 'k-' || :k would make every
# variant plan an inlined SQL function per concatenation.

BENCH_DB=idem_bench_core
bench_core_db "$BENCH_DB"

CORE_VARIANTS="a_bare_insert b_seed_client c_seed_plpgsql d_ext_client e_ext_server f_replay g_floor"
PARTS_VARIANTS="x1_parts_all x2_parts_no_fingerprint x3_parts_no_complete x4_floor_plpgsql"
for round in $(seq 1 "$BENCH_ROUNDS"); do
	for sync in off on; do
		as_test_user psql -X -q -d "$BENCH_DB" -c "ALTER DATABASE $BENCH_DB SET synchronous_commit = $sync"
		variants=$CORE_VARIANTS
		[ "$sync" = off ] && variants="$variants $PARTS_VARIANTS"
		for v in $variants; do
			bench_sql "$IDEM_SRC/bench/core/reset.sql" >/dev/null
			bench_tps "$v/$sync" "$IDEM_SRC/bench/core/$v.sql"
		done
	done
done

echo "## Core: one payment per transaction (TPS; ratio to the row's baseline)"
echo
echo "Median TPS of $BENCH_ROUNDS rounds; each round runs every variant once, in order."
echo
echo "| variant | TPS sync off | ratio | TPS sync on | ratio | target |"
echo "|---|---:|---:|---:|---:|---|"
row() {
	printf '| %s | %.0f | %s | %.0f | %s | %s |\n' "$1" \
		"${TPS[$2/off]}" "$(ratio "$2/off" "$3/off")" \
		"${TPS[$2/on]}" "$(ratio "$2/on" "$3/on")" "$4"
}
row "(a) bare INSERT" a_bare_insert a_bare_insert "baseline"
row "(b) seed's SQL, client statements" b_seed_client a_bare_insert "vs (a)"
row "(c) seed's SQL, one PL/pgSQL call" c_seed_plpgsql a_bare_insert "vs (a)"
row "(d) extension, client statements, vs (b)" d_ext_client b_seed_client "≥ 1.0"
row "(e) extension, one server call, vs (a)" e_ext_server a_bare_insert "≥ 0.80"
row "(e) extension, one server call, vs (c)" e_ext_server c_seed_plpgsql "≥ 1.3"
row "(f) replay of a completed key, vs (a)" f_replay a_bare_insert "≥ 1.0"
row "(g) floor: payment + bare key row, vs (a)" g_floor a_bare_insert "the most (e) could reach"
row "(e) extension, one server call, vs (g)" e_ext_server g_floor ""
echo
echo "Runs (TPS, lowest to highest):"
echo
for sync in off on; do
	for v in $CORE_VARIANTS; do
		echo "- $v, synchronous_commit $sync: $(tps_spread "$v/$sync")"
	done
done
echo
echo "## Core: where (e)'s time goes (synchronous_commit off)"
echo
echo "Median TPS of $BENCH_ROUNDS rounds. x1 is (e) with two switches that x2 and x3"
echo "turn off; x4 is the floor (g) written as a PL/pgSQL function like (e)."
echo
echo "| variant | TPS | ratio |"
echo "|---|---:|---:|"
bench_row "x1 (e) with both parts, vs (a)" x1_parts_all/off a_bare_insert/off
bench_row "x2 without a fingerprint (request NULL), vs x1" x2_parts_no_fingerprint/off x1_parts_all/off
bench_row "x3 without idem_complete (left processing), vs x1" x3_parts_no_complete/off x1_parts_all/off
bench_row "x4 the floor as a PL/pgSQL function, vs (g)" x4_floor_plpgsql/off g_floor/off
bench_row "x1 (e) with both parts, vs x4" x1_parts_all/off x4_floor_plpgsql/off
echo
echo "Runs (TPS, lowest to highest):"
echo
for v in $PARTS_VARIANTS; do
	echo "- $v: $(tps_spread "$v/off")"
done
