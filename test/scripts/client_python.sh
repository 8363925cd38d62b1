#!/usr/bin/env bash
# examples/http/python: the Idempotency-Key service in Python (psycopg 3),
# checked against the HTTP contract (test/scripts/lib/http_contract.sh).
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
hc_setup python
hc_start_python
hc_contract
hc_stop
hc_read_only hc_start_python
ex_finish
