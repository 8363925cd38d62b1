#!/usr/bin/env bash
# examples/http/node: the Idempotency-Key service in Node.js
# (node-postgres), checked against the HTTP contract
# (test/scripts/lib/http_contract.sh).  Its dependencies come from its
# package-lock.json (npm ci).
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
if ! [ -d examples/http/node/node_modules/pg ]; then
	(cd examples/http/node && npm ci --no-audit --no-fund --loglevel=error)
fi
hc_setup node
PGUSER=idem_example_http_app hc_start node examples/http/node/server.js
hc_contract
hc_stop
ex_finish
