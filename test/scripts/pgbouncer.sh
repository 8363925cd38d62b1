#!/usr/bin/env bash
# The four demo apps (clients/<language>/demo) behind PgBouncer (Debian's
# pgbouncer) in transaction pooling mode, each with its driver's setting of
# doc/http.md (psycopg: no server-side prepares; node-postgres: as is; pgx:
# cache_describe, the Go demo's default; JDBC: prepareThreshold=0),
# through the HTTP contract's checks (test/scripts/lib/http_contract.sh) and
# a storm of its own.  The pool has two server connections for the demo's
# many, so server connections are shared between the clients' transactions;
# payments are counted in the database.  Then statement pooling: idem_call,
# one statement, works under a storm of its own; a transaction block is
# refused.  And session pooling: LISTEN idem_stuck gets the worker's
# notifications.
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
source test/scripts/lib/go_toolchain.sh
hc_setup pgbouncer
ex_sql <<'SQL'
CREATE FUNCTION pgbouncer_pay(request jsonb) RETURNS jsonb
LANGUAGE sql AS $$
	SELECT pg_sleep(0.3);
	INSERT INTO payments (account, order_id, amount, currency, status)
	VALUES ('statement', request->>'order_id', (request->>'amount')::bigint, 'EUR', 'paid')
	RETURNING jsonb_build_object('id', id, 'status', 'paid');
$$;
GRANT EXECUTE ON FUNCTION pgbouncer_pay(jsonb),
	idem_call(text, text, jsonb, regprocedure, text, interval) TO idem_demo_app;
SQL

BDIR=$HC_TMP/pgbouncer
BPORT=$(hc_free_port)
ADMIN=$(id -un)
mkdir -p "$BDIR"
printf '"%s" ""\n' idem_demo_app "$ADMIN" >"$BDIR/userlist.txt"
cat >"$BDIR/pgbouncer.ini" <<EOF
[databases]
$PGDATABASE = host=$PGHOST port=$PGPORT dbname=$PGDATABASE pool_size=2
statement_pool = host=$PGHOST port=$PGPORT dbname=$PGDATABASE pool_size=2 pool_mode=statement
session_pool = host=$PGHOST port=$PGPORT dbname=$PGDATABASE pool_size=2 pool_mode=session

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BPORT
unix_socket_dir = $BDIR
auth_type = trust
auth_file = $BDIR/userlist.txt
admin_users = $ADMIN
pool_mode = transaction
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = $BDIR/pgbouncer.log
pidfile = $BDIR/pgbouncer.pid
EOF
pgbouncer "$BDIR/pgbouncer.ini" 2>"$BDIR/stderr" &
EX_PIDS+=($!)
for i in $(seq 1 100); do [ -S "$BDIR/.s.PGSQL.$BPORT" ] && break; sleep 0.1; done
if ! [ -S "$BDIR/.s.PGSQL.$BPORT" ]; then
	echo "FAIL: pgbouncer did not start"
	cat "$BDIR/stderr" "$BDIR/pgbouncer.log"
	exit 1
fi
echo "pgbouncer $(pgbouncer --version | head -1) on 127.0.0.1:$BPORT and $BDIR"

# bouncer_pool COLUMN: a column of SHOW POOLS for the service's pool
bouncer_pool() {
	psql -X -q -h "$BDIR" -p "$BPORT" -U "$ADMIN" -d pgbouncer -c 'SHOW POOLS' -A -F ' ' |
		awk -v db="$PGDATABASE" -v col="$1" '
			NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
			$1 == db && $2 == "idem_demo_app" { print $c[col] }'
}
# Client connections the service has open to pgbouncer
bouncer_clients() {
	psql -X -q -h "$BDIR" -p "$BPORT" -U "$ADMIN" -d pgbouncer -c 'SHOW CLIENTS' -A -F ' ' |
		awk -v db="$PGDATABASE" '
			NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
			$c["user"] == "idem_demo_app" && $c["database"] == db { n++ }
			END { print n + 0 }'
}

# through LANGUAGE [ARGS...]: the contract through the pooler, the demo
# given the pooler's address (HC_JDBC_URL for Java) and those arguments
through() {
	local lang=$1 clients servers
	shift
	echo "== $lang through transaction pooling"
	ex_sql -c 'DELETE FROM idem_keys' -c 'TRUNCATE payments'
	HC_DEMO_ENV=(PGHOST="$BDIR" PGPORT="$BPORT")
	hc_start "$lang" "$@"
	hc_contract
	echo "== $lang: a storm of its own, to count the connections after it"
	hc_storm 2 8 "pool-$lang-"
	clients=$(bouncer_clients)
	servers=$(ex_value "SELECT count(*) FROM pg_stat_activity WHERE usename = 'idem_demo_app'")
	echo "$lang: $clients client connections to pgbouncer, $servers server connections"
	ex_check "$lang: more client connections than the pool's server connections" \
		"$([ "$clients" -gt 2 ] && echo yes || echo "no ($clients)")" yes
	ex_check "$lang: server connections at most the pool size" \
		"$([ "$servers" -le 2 ] && echo yes || echo "no ($servers)")" yes
	hc_stop
	HC_DEMO_ENV=()
}

through python --no-prepare
through node
go_toolchain "$(hc_client_dir go)"
through go
HC_JDBC_URL="jdbc:postgresql://127.0.0.1:$BPORT/$PGDATABASE?user=idem_demo_app&prepareThreshold=0"
through java
ex_check "clients waiting for a server connection at the end" "$(bouncer_pool cl_waiting)" 0

echo "== statement pooling: idem_call is one statement"
stmt() {
	psql -X -q -A -t -h "$BDIR" -p "$BPORT" -U idem_demo_app -d statement_pool "$@"
}
call="SELECT idem_call('statement-pay', 'stmt-1', '{\"order_id\": \"stmt-1\", \"amount\": 700}', 'pgbouncer_pay(jsonb)')"
pids=()
for i in $(seq 1 8); do
	stmt -v VERBOSITY=sqlstate -c "$call" >"$HC_TMP/stmt-$i" 2>&1 &
	pids+=($!)
done
wait "${pids[@]}" || true
paid=0 busy=0
for i in $(seq 1 8); do
	case "$(cat "$HC_TMP/stmt-$i")" in
		'{"id": '*', "status": "paid"}') paid=$((paid + 1)) ;;
		'ERROR:  ID003') busy=$((busy + 1)) ;;
		*) echo "call $i: $(cat "$HC_TMP/stmt-$i")" ;;
	esac
done
echo "8 concurrent idem_call: $paid answered the payment, $busy got ID003 (in progress)"
ex_check "idem_call answers: the payment or ID003" "$((paid + busy))" 8
ex_check "payments for stmt-1" "$(hc_payments stmt-1)" 1
ex_check "a later idem_call replays" "$(stmt -c "$call")" \
	"$(ex_value "SELECT response FROM idem_keys WHERE key = 'stmt-1'")"
ex_check "payments for stmt-1" "$(hc_payments stmt-1)" 1

echo "== statement pooling: a transaction block is refused"
out=$(printf '%s\n' 'BEGIN;' \
	"SELECT outcome FROM idem_reserve('statement-pay', 'stmt-2', '{}');" 'COMMIT;' |
	stmt 2>&1 || true)
echo "$out"
ex_check "pgbouncer refuses it" \
	"$(grep -c 'transaction blocks not allowed in statement pooling mode' <<<"$out")" 1
ex_check "nothing reserved" "$(ex_value "SELECT count(*) FROM idem_keys WHERE key = 'stmt-2'")" 0

echo "== session pooling: LISTEN idem_stuck"
# The listener keeps its server connection for its whole session; it prints
# the notifications that arrived during pg_sleep when that returns
printf '%s\n' 'LISTEN idem_stuck;' 'SELECT pg_sleep(3);' |
	psql -X -q -A -t -h "$BDIR" -p "$BPORT" -U idem_demo_app -d session_pool \
		>"$HC_TMP/listen" 2>&1 &
listener=$!
ex_wait_for "the listener" "SELECT EXISTS (SELECT FROM pg_stat_activity
	WHERE usename = 'idem_demo_app' AND query LIKE 'SELECT pg_sleep(3)%')" || true
ex_sql -c 'DELETE FROM idem_keys'
ex_sql -c "SELECT outcome FROM idem_reserve('session-pay', 'sess-1', '{}', scope => 'acct-1')" >/dev/null
ex_sql -c "UPDATE idem_keys SET updated_at = updated_at - interval '1 day' WHERE key = 'sess-1'"
ex_check "records flagged stuck" "$(ex_value "SELECT idem_flag_stuck()")" 1
wait "$listener" || true
ex_check "the listener got the notification" \
	"$(grep -c 'Asynchronous notification "idem_stuck" with payload ".*sess-1.*" received' "$HC_TMP/listen")" 1

if [ "$EX_FAILED" != 0 ]; then
	echo "pgbouncer log (the end):"
	tail -40 "$BDIR/pgbouncer.log" | sed 's/^/  /'
fi
ex_finish
