#!/usr/bin/env bash
# clients/java (Maven io.github.pgidempotency:idempotency-*): the package's
# own tests (clients/java/test.sh: the servlet Filter and the Spring Boot
# starter through MockMvc, mvn verify), then its demo app (Spring Boot,
# clients/java/demo) through the HTTP contract of doc/clients.md
# (test/scripts/lib/http_contract.sh), and again on a read-only database.
# JDBC speaks TCP only: hc_tcp gives the cluster a loopback address.
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
hc_setup java
hc_tcp
hc_package_tests java
hc_start java
hc_contract
hc_stop
hc_read_only
hc_shallow_stack
ex_finish
