# Patterns: idem_call and idem_consume on their "new" path (every transaction
# uses a fresh key), against a bare INSERT of the same effect row and against
# the same idem_call logic written in PL/pgSQL.  Sourced by bench/run.sh.
#
# Targets (issue 6): idem_call >= 0.80 of a bare INSERT and >= 1.3x the
# PL/pgSQL version; idem_consume >= 0.85 of a bare INSERT of the effect row.
# Each baseline has a floor beside it: the same row plus one bare key row in
# a unique index, in one statement, with no check; no design writes less.
# Every workload runs with synchronous_commit on and off, in BENCH_ROUNDS
# rounds (default 3); the table shows the median TPS of each.

BENCH_PAT_DIR=$IDEM_WORK/bench_pat
as_test_user mkdir -p "$BENCH_PAT_DIR"

# A database of its own, so that every run can start from empty tables
bench_pat_saved_db=${BENCH_DB:-postgres}
as_test_user dropdb --if-exists bench_patterns
as_test_user createdb bench_patterns
BENCH_DB=bench_patterns

bench_sql - <<'SQL'
CREATE EXTENSION idempotency;
DROP TABLE IF EXISTS bench_pat_payments, bench_pat_effects, bench_pat_floor_keys;
CREATE TABLE bench_pat_payments (
	id			bigserial PRIMARY KEY,
	order_id	text NOT NULL,
	amount		int NOT NULL,
	created_at	timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE bench_pat_effects (
	id			bigserial PRIMARY KEY,
	message_id	text NOT NULL,
	amount		int NOT NULL
);
CREATE TABLE bench_pat_floor_keys (
	scope		text COLLATE "C" NOT NULL,
	operation	text COLLATE "C" NOT NULL,
	key			text COLLATE "C" NOT NULL,
	PRIMARY KEY (scope, operation, key)
);

-- The handler: the effect is one payment row
CREATE OR REPLACE FUNCTION bench_pat_pay(request jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	new_id bigint;
BEGIN
	INSERT INTO bench_pat_payments (order_id, amount)
	VALUES (request->>'order', (request->>'amount')::int)
	RETURNING id INTO new_id;
	RETURN jsonb_build_object('payment', new_id);
END
$$;

-- idem_call's logic as a user would write it without idem_call
CREATE OR REPLACE FUNCTION bench_pat_call_plpgsql(operation text, key text,
	request jsonb, handler regprocedure, scope text DEFAULT '',
	ttl interval DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	r record;
	result jsonb;
BEGIN
	SELECT * INTO r FROM idem_reserve(operation, key, request, scope, ttl);
	CASE r.outcome
		WHEN 'new' THEN
			EXECUTE format('SELECT %s($1)', handler::regproc) USING request INTO result;
			PERFORM idem_complete(operation, key, result, 200, NULL, scope);
			RETURN result;
		WHEN 'replay' THEN
			RETURN r.response;
		WHEN 'in_progress' THEN
			RAISE EXCEPTION 'idempotency key "%" is in progress', key USING ERRCODE = 'ID003';
		WHEN 'mismatch' THEN
			RAISE EXCEPTION 'idempotency key "%" was already used with a different request', key USING ERRCODE = 'ID004';
		ELSE
			RAISE EXCEPTION 'idempotency key "%" is stuck', key USING ERRCODE = 'ID005';
	END CASE;
END
$$;
SQL

# One pgbench script per workload; keys are random 40-bit numbers per client
bench_pat_script() {
	as_test_user tee "$BENCH_PAT_DIR/$1.sql" >/dev/null
}
bench_pat_script bare_insert <<'EOF2'
\set k random(1, 1000000000000)
INSERT INTO bench_pat_payments (order_id, amount) VALUES ('o:client_id-:k', 100);
EOF2
bench_pat_script idem_call <<'EOF2'
\set k random(1, 1000000000000)
SELECT idem_call('bench-pat-pay', ':client_id-:k', '{"order": "o:client_id-:k", "amount": 100}', 'bench_pat_pay(jsonb)');
EOF2
bench_pat_script plpgsql_call <<'EOF2'
\set k random(1, 1000000000000)
SELECT bench_pat_call_plpgsql('bench-pat-pay', ':client_id-:k', '{"order": "o:client_id-:k", "amount": 100}', 'bench_pat_pay(jsonb)');
EOF2
bench_pat_script floor_payment <<'EOF2'
\set k random(1, 1000000000000)
WITH key AS (INSERT INTO bench_pat_floor_keys VALUES ('', 'bench-pat-pay', ':client_id-:k'))
INSERT INTO bench_pat_payments (order_id, amount) VALUES ('o:client_id-:k', 100);
EOF2
bench_pat_script floor_effect <<'EOF2'
\set k random(1, 1000000000000)
WITH key AS (INSERT INTO bench_pat_floor_keys VALUES ('idem:consume', 'bench-pat-consumer', 'm:client_id-:k'))
INSERT INTO bench_pat_effects (message_id, amount) VALUES ('m:client_id-:k', 1);
EOF2
bench_pat_script bare_effect <<'EOF2'
\set k random(1, 1000000000000)
INSERT INTO bench_pat_effects (message_id, amount) VALUES ('m:client_id-:k', 1);
EOF2
bench_pat_script idem_consume <<'EOF2'
\set k random(1, 1000000000000)
INSERT INTO bench_pat_effects (message_id, amount)
SELECT 'm:client_id-:k', 1 WHERE idem_consume('bench-pat-consumer', 'm:client_id-:k');
EOF2

# Same starting point for every run: empty tables, checkpointed
bench_pat_reset() {
	bench_sql - >/dev/null <<'SQL'
TRUNCATE bench_pat_payments, bench_pat_effects, bench_pat_floor_keys, idem_keys;
CHECKPOINT;
SQL
}

bench_pat_db=bench_patterns
bench_pat_workloads="bare_insert floor_payment idem_call plpgsql_call bare_effect floor_effect idem_consume"
for bench_pat_round in $(seq 1 "$BENCH_ROUNDS"); do
	for bench_pat_mode in on off; do
		for bench_pat_w in $bench_pat_workloads; do
			bench_pat_reset
			BENCH_DB="dbname=$bench_pat_db options='-c synchronous_commit=$bench_pat_mode'" \
				bench_tps "pat_${bench_pat_w}_$bench_pat_mode" "$BENCH_PAT_DIR/$bench_pat_w.sql"
		done
	done
done
as_test_user dropdb bench_patterns
BENCH_DB=$bench_pat_saved_db

echo "## Patterns: idem_call and idem_consume (50_patterns)"
echo
echo "Every transaction uses a fresh key (the \"new\" path). Median TPS of $BENCH_ROUNDS rounds;"
echo "each round runs every workload once, in order. Ratios are TPS over the baseline."
echo
echo "| workload | TPS, sync commit on | ratio | TPS, sync commit off | ratio | target |"
echo "|---|---:|---:|---:|---:|---|"
bench_pat_row() {
	printf '| %s | %.0f | %s | %.0f | %s | %s |\n' "$1" \
		"${TPS[pat_$2_on]}" "$(ratio "pat_$2_on" "pat_$3_on")" \
		"${TPS[pat_$2_off]}" "$(ratio "pat_$2_off" "pat_$3_off")" "$4"
}
bench_pat_row "bare INSERT of a payment row" bare_insert bare_insert "baseline"
bench_pat_row "floor: payment + bare key row vs bare INSERT" floor_payment bare_insert "the most idem_call could reach"
bench_pat_row "idem_call (handler inserts the payment) vs bare INSERT" idem_call bare_insert ">= 0.80"
bench_pat_row "same logic in PL/pgSQL vs bare INSERT" plpgsql_call bare_insert ""
bench_pat_row "idem_call vs the PL/pgSQL version" idem_call plpgsql_call ">= 1.30"
bench_pat_row "bare INSERT of an effect row" bare_effect bare_effect "baseline"
bench_pat_row "floor: effect + bare key row vs bare INSERT" floor_effect bare_effect "the most idem_consume could reach"
bench_pat_row "idem_consume + effect row vs bare INSERT" idem_consume bare_effect ">= 0.85"
bench_pat_row "idem_call vs its floor" idem_call floor_payment ""
bench_pat_row "idem_consume vs its floor" idem_consume floor_effect ""
echo
echo "Runs (TPS, lowest to highest):"
echo
for bench_pat_mode in on off; do
	for bench_pat_w in $bench_pat_workloads; do
		echo "- $bench_pat_w, synchronous_commit $bench_pat_mode: $(tps_spread "pat_${bench_pat_w}_$bench_pat_mode")"
	done
done
