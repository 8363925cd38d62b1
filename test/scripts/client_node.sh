#!/usr/bin/env bash
# clients/node (npm pg-idempotency): the package's own tests
# (clients/node/test.sh: Express through supertest, Fastify through inject,
# tsc --noEmit, the npm tarball in a clean project), then its demo app
# (Express, clients/node/demo) through the HTTP contract of doc/clients.md
# (test/scripts/lib/http_contract.sh), and again on a read-only database.
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
hc_setup node
hc_package_tests node
hc_start node
hc_contract
hc_stop
hc_read_only
hc_shallow_stack
ex_finish
