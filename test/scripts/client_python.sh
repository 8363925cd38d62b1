#!/usr/bin/env bash
# clients/python (PyPI pg-idempotency): the package's own tests
# (clients/python/test.sh: the integrations through their frameworks' test
# clients, mypy, the wheel in a clean environment), then its demo app
# (FastAPI, clients/python/demo) through the HTTP contract of doc/clients.md
# (test/scripts/lib/http_contract.sh), and again on a read-only database.
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
hc_setup python
hc_package_tests python
hc_start python
hc_contract
hc_stop
hc_read_only
hc_shallow_stack
ex_finish
