#!/usr/bin/env bash
# examples/http/python: the Idempotency-Key service in Python (psycopg 3),
# checked against the HTTP contract (test/scripts/lib/http_contract.sh).
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
hc_setup python
PGUSER=idem_example_http_app hc_start /usr/bin/python3 examples/http/python/server.py
hc_contract
hc_stop
ex_finish
