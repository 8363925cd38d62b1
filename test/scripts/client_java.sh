#!/usr/bin/env bash
# examples/http/java: the Idempotency-Key service in Java (JDBC, Debian's
# libpostgresql-jdbc-java; the JDK's com.sun.net.httpserver), checked
# against the HTTP contract (test/scripts/lib/http_contract.sh).  JDBC
# speaks TCP only and the suite's server listens on a unix socket alone:
# socat relays a loopback port to it.
source test/scripts/lib/examples.sh
source test/scripts/lib/http_contract.sh
hc_setup java
relay=$(hc_free_port)
socat "TCP-LISTEN:$relay,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:$PGHOST/.s.PGSQL.$PGPORT" &
EX_PIDS+=($!)
url="jdbc:postgresql://127.0.0.1:$relay/$PGDATABASE?user=idem_example_http_app"
hc_start_java "$url"
hc_contract
hc_stop
hc_read_only hc_start_java "$url"
ex_finish
