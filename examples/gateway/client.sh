#!/usr/bin/env bash
# A client of the gateway example: pay for an order in two phases.
#
#   client.sh KEY ORDER_ID AMOUNT [CRASH_POINT]
#
# Prints the HTTP status and body an API would answer.  With CRASH_POINT
# (before-gateway, after-gateway or after-checkpoint) the client kills itself
# with SIGKILL at that point, as a process that dies between phases.  Uses
# the libpq environment (PGHOST, PGPORT, PGDATABASE) to reach the database.
set -euo pipefail

key=$1 order_id=$2 amount=$3 crash=${4:-}
request=$(printf '{"order_id": "%s", "amount": %d}' "$order_id" "$amount")

# Run SQL from stdin with psql variables key, request, order_id, amount, charge
sql() {
	psql -X -q -t -A -F ' ' -v ON_ERROR_STOP=1 -v key="$key" -v request="$request" \
		-v order_id="$order_id" -v amount="$amount" -v charge="${charge:-}"
}

crash_point() {
	if [ "$crash" = "$1" ]; then
		echo "client: killed $1" >&2
		kill -KILL $$
	fi
}

# Phase 1: reserve and record the intent; committed when psql returns
read -r outcome status rest < <(sql <<'SQL'
SELECT outcome, coalesce(http_status, 0),
       coalesce(response,
                jsonb_strip_nulls(jsonb_build_object('error', outcome,
                                                     'recovery_point', recovery_point)))
FROM charge_begin(:'key', :'request')
SQL
)
case $outcome in
	new) ;;
	mismatch) echo "422 $rest"; exit 0 ;;
	*) echo "$status $rest"; exit 0 ;;	# replay, in_progress, stuck
esac
crash_point before-gateway

# The external call, outside our transactions
charge=$(sql <<'SQL'
SELECT gateway.charge(:'key', :'order_id', :'amount')
SQL
)
crash_point after-gateway

# Phase 1b: remember the charge
sql >/dev/null <<'SQL'
SELECT charge_charged(:'key', :'charge')
SQL
crash_point after-checkpoint

# Phase 2: the payment row and the completion, in one transaction
body=$(sql <<'SQL'
SELECT charge_finish(:'key', :'request', :'charge')
SQL
)
echo "201 $body"
