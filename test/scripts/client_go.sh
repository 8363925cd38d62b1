#!/usr/bin/env bash
# clients/go (pgx v5, net/http middleware): the package's own tests
# (clients/go/test.sh: httptest, go vet), then its demo app (chi,
# clients/go/demo) through the HTTP contract of doc/clients.md
# (test/scripts/lib/http_contract.sh), and again on a read-only database.
# The Go toolchain: test/scripts/lib/go_toolchain.sh.
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
source test/scripts/lib/go_toolchain.sh
hc_setup go
go_toolchain "$(hc_client_dir go)"
hc_package_tests go
hc_start go
hc_contract
hc_stop
hc_read_only
hc_shallow_stack
ex_finish
