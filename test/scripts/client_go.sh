#!/usr/bin/env bash
# examples/http/go: the Idempotency-Key service in Go (pgx v4), checked
# against the HTTP contract (test/scripts/lib/http_contract.sh).  Built
# offline from Debian's golang-github-jackc-pgx-v4-dev.
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
hc_setup go
hc_start_go
hc_contract
hc_stop
hc_read_only hc_start_go
ex_finish
