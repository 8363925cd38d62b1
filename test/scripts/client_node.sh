#!/usr/bin/env bash
# examples/http/node: the Idempotency-Key service in Node.js
# (node-postgres), checked against the HTTP contract
# (test/scripts/lib/http_contract.sh).  Its dependencies come from its
# package-lock.json (npm ci).
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
hc_setup node
hc_start_node
hc_contract
hc_stop
hc_read_only hc_start_node
ex_finish
