# A throwaway RabbitMQ node for a test script (issue 37's consumer tests),
# from Debian's rabbitmq-server package, run as the script's own user (the
# suite's postgres) with nothing of the system's: a node directory under a
# temp dir (RABBITMQ_MNESIA_BASE, RABBITMQ_LOG_BASE, its configuration and
# its Erlang cookie, through HOME), a unique node name, free loopback ports
# for AMQP and Erlang distribution, and an epmd of its own on a free port
# (ERL_EPMD_PORT), so neither a system node, a leftover epmd on 4369 nor a
# second test's node gets in the way.  No management plugin.
#
#   source test/scripts/lib/rabbitmq.sh
#   rmq_start                         # sets RMQ_URL, RMQ_PORT; ready when it returns
#   trap rmq_stop EXIT                # or call rmq_stop from the caller's trap
#   rmq_declare_queue orders 3        # quorum queue orders, x-delivery-limit 3,
#                                     # dead-lettered to orders.dlx -> orders.dead
#   rmq_count orders messages         # 0
#   rmq_stop                          # stops the node and its epmd, removes its files
#
# Quorum queues (RabbitMQ 3.10 in Debian 12) count deliveries: a message
# returned more than x-delivery-limit times (nack or reject with requeue, or
# a consumer that died with it unacked) is dead-lettered, so it is handled at
# most limit + 1 times.  rmq_py_venv gives a Python with pika for helpers.

RMQ_BIN=${RMQ_BIN:-/usr/lib/rabbitmq/bin}
RMQ_DIR=
RMQ_PID=
RMQ_EPMD_PID=
RMQ_ENV=()

# rmq_check: fail, saying why, when Debian's rabbitmq-server is missing
rmq_check() {
	if [ ! -x "$RMQ_BIN/rabbitmq-server" ] || ! command -v epmd >/dev/null; then
		echo "FAIL: RabbitMQ is not installed: Debian's rabbitmq-server package" \
			"(test/run.sh installs it through IDEM_PACKAGES; by hand: apt-get install rabbitmq-server)" >&2
		return 1
	fi
}

# rmq_ctl ARG...: rabbitmqctl against this node
rmq_ctl() {
	env "${RMQ_ENV[@]}" "$RMQ_BIN/rabbitmqctl" "$@"
}

# Three free loopback ports (AMQP, distribution, epmd), in one line: at
# random below the kernel's ephemeral range, where no outgoing connection
# can take one between this check and the node's bind
rmq_free_ports() {
	"${IDEM_PYTHON:-/usr/bin/python3}" -c '
import random, socket
with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    low = int(f.read().split()[0])
ports = []
while len(ports) < 3:
    port = random.randrange(10000, low)
    if port in ports:
        continue
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    ports.append(port)
print(*ports)'
}

# The node's environment, in RMQ_ENV, from RMQ_DIR, RMQ_NODE and the ports
rmq_env() {
	RMQ_ENV=(HOME="$RMQ_DIR"
		RABBITMQ_CONF_ENV_FILE="$RMQ_DIR/rabbitmq-env.conf"
		RABBITMQ_CONFIG_FILE="$RMQ_DIR/rabbitmq"
		RABBITMQ_ADVANCED_CONFIG_FILE="$RMQ_DIR/advanced.config"
		RABBITMQ_ENABLED_PLUGINS_FILE="$RMQ_DIR/enabled_plugins"
		RABBITMQ_MNESIA_BASE="$RMQ_DIR/mnesia"
		RABBITMQ_LOG_BASE="$RMQ_DIR/log"
		RABBITMQ_PID_FILE="$RMQ_DIR/rabbitmq.pid"
		RABBITMQ_NODENAME="$RMQ_NODE"
		RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
		RABBITMQ_NODE_PORT="$RMQ_PORT"
		RABBITMQ_DIST_PORT="$RMQ_DIST_PORT"
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
		RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
		ERL_EPMD_PORT="$RMQ_EPMD_PORT"
		ERL_EPMD_ADDRESS=127.0.0.1
		ERL_CRASH_DUMP="$RMQ_DIR/erl_crash.dump")
}

# Start this node's epmd on a free port (three tries, new ports each) and
# wait until it answers: in the foreground, so that its pid is ours to
# stop, and before the node, which would start an epmd -daemon otherwise
rmq_start_epmd() {
	local try i
	for try in 1 2 3; do
		read -r RMQ_PORT RMQ_DIST_PORT RMQ_EPMD_PORT < <(rmq_free_ports)
		rmq_env
		env "${RMQ_ENV[@]}" epmd -port "$RMQ_EPMD_PORT" >>"$RMQ_DIR/epmd.log" 2>&1 &
		RMQ_EPMD_PID=$!
		for i in $(seq 1 100); do
			env "${RMQ_ENV[@]}" epmd -port "$RMQ_EPMD_PORT" -names >/dev/null 2>&1 && return 0
			kill -0 "$RMQ_EPMD_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill "$RMQ_EPMD_PID" 2>/dev/null || true
		wait "$RMQ_EPMD_PID" 2>/dev/null || true
		echo "rabbitmq: epmd did not start on port $RMQ_EPMD_PORT (try $try)" >&2
	done
	RMQ_EPMD_PID=
	return 1
}

# rmq_start: start the node and wait (at most 90 s) until it runs; prints
# how long that took.  Sets RMQ_URL (amqp://guest:guest@127.0.0.1:PORT/),
# RMQ_PORT (AMQP), RMQ_DIST_PORT, RMQ_EPMD_PORT, RMQ_NODE, RMQ_DIR, and
# RMQ_START_MS (how long it took).  One node per shell: a subshell may
# start another.
rmq_start() {
	local started
	# nothing of a node this shell inherited: rmq_stop stops only this one
	RMQ_DIR= RMQ_PID= RMQ_EPMD_PID=
	rmq_check || return 1
	started=$(date +%s%N)
	RMQ_DIR=$(mktemp -d "${TMPDIR:-/tmp}/idem-rabbitmq.XXXXXX")
	RMQ_NODE=idem-$$-$RANDOM@localhost
	# the default guest user may connect from loopback only, as by default
	printf '%s\n' "log.console = false" "log.file.level = info" >"$RMQ_DIR/rabbitmq.conf"
	# quorum queues update the counts of list_queues every tick: 1 s, not 5
	echo '[{rabbit, [{quorum_tick_interval, 1000}]}].' >"$RMQ_DIR/advanced.config"
	echo '[].' >"$RMQ_DIR/enabled_plugins"
	: >"$RMQ_DIR/rabbitmq-env.conf"
	if ! rmq_start_epmd; then
		echo "FAIL: epmd did not start; its log:" "$(cat "$RMQ_DIR/epmd.log")" >&2
		return 1
	fi
	RMQ_URL=amqp://guest:guest@127.0.0.1:$RMQ_PORT/
	# rabbitmq-server is a shell that runs the node (beam.smp) as its child
	(cd "$RMQ_DIR" && exec env "${RMQ_ENV[@]}" "$RMQ_BIN/rabbitmq-server") >"$RMQ_DIR/server.log" 2>&1 &
	RMQ_PID=$!
	if ! rmq_ctl -q wait "$RMQ_DIR/rabbitmq.pid" --timeout 90 >"$RMQ_DIR/wait.log" 2>&1; then
		echo "FAIL: the RabbitMQ node did not start; its output and log:" >&2
		tail -n 30 "$RMQ_DIR/wait.log" "$RMQ_DIR/server.log" "$RMQ_DIR"/log/*.log >&2 2>/dev/null
		return 1
	fi
	RMQ_START_MS=$((($(date +%s%N) - started) / 1000000))
	echo "rabbitmq: node $RMQ_NODE on 127.0.0.1:$RMQ_PORT started in $((RMQ_START_MS / 1000)).$(printf '%03d' $((RMQ_START_MS % 1000))) s"
}

# rmq_stop: stop the node (rabbitmqctl stop, then kill -9 of the node and
# of its rabbitmq-server shell if either still runs) and its epmd, and
# remove its directory; nothing if it was not started
rmq_stop() {
	local node
	[ -n "$RMQ_DIR" ] || return 0
	node=$(cat "$RMQ_DIR/rabbitmq.pid" 2>/dev/null || true)
	if [ -n "$node" ] && kill -0 "$node" 2>/dev/null; then
		timeout 30 env "${RMQ_ENV[@]}" "$RMQ_BIN/rabbitmqctl" -q stop "$RMQ_DIR/rabbitmq.pid" \
			>/dev/null 2>&1 || true
		kill -0 "$node" 2>/dev/null && kill -KILL "$node" 2>/dev/null
	fi
	if [ -n "$RMQ_PID" ]; then
		kill -0 "$RMQ_PID" 2>/dev/null && kill -KILL "$RMQ_PID" 2>/dev/null
		wait "$RMQ_PID" 2>/dev/null || true
	fi
	if [ -n "$RMQ_EPMD_PID" ]; then
		kill "$RMQ_EPMD_PID" 2>/dev/null || true
		wait "$RMQ_EPMD_PID" 2>/dev/null || true
		# and any epmd the node started on this port of ours after all
		env "${RMQ_ENV[@]}" epmd -port "$RMQ_EPMD_PORT" -kill >/dev/null 2>&1 || true
	fi
	rm -rf "$RMQ_DIR"
	RMQ_DIR= RMQ_PID= RMQ_EPMD_PID=
}

# rmq_declare_queue NAME [DELIVERY_LIMIT]: a durable quorum queue NAME whose
# messages returned more than DELIVERY_LIMIT (default 3) times go to the
# fanout exchange NAME.dlx, bound to the quorum queue NAME.dead.  Clients
# that declare NAME themselves must pass the same arguments (or declare it
# passively).
rmq_declare_queue() {
	local name=$1 limit=${2:-3} i
	cat >"$RMQ_DIR/definitions-$name.json" <<-EOF
		{"exchanges": [{"name": "$name.dlx", "vhost": "/", "type": "fanout", "durable": true,
		                "auto_delete": false, "internal": false, "arguments": {}}],
		 "queues": [{"name": "$name.dead", "vhost": "/", "durable": true, "auto_delete": false,
		             "arguments": {"x-queue-type": "quorum"}},
		            {"name": "$name", "vhost": "/", "durable": true, "auto_delete": false,
		             "arguments": {"x-queue-type": "quorum", "x-delivery-limit": $limit,
		                           "x-dead-letter-exchange": "$name.dlx"}}],
		 "bindings": [{"source": "$name.dlx", "vhost": "/", "destination": "$name.dead",
		               "destination_type": "queue", "routing_key": "", "arguments": {}}]}
	EOF
	rmq_ctl -q import_definitions "$RMQ_DIR/definitions-$name.json" >/dev/null || return 1
	# the import is asynchronous: wait until both queues exist
	for i in $(seq 1 60); do
		[ "$(rmq_ctl -q list_queues name | grep -cxF -e "$name" -e "$name.dead")" = 2 ] && return 0
		sleep 0.5
	done
	echo "FAIL: queue $name was not declared" >&2
	return 1
}

# rmq_count QUEUE FIELD: one of list_queues' columns for a queue (messages,
# messages_ready, messages_unacknowledged, consumers, ...).  The broker
# updates a quorum queue's counts once a tick (a second here), so a count
# taken just after a publish, an ack or a consumer's death may be the one
# before it: wait for the counts you expect with rmq_wait_counts.
rmq_count() {
	rmq_ctl -q list_queues --no-table-headers name "$2" | awk -F'\t' -v q="$1" '$1 == q { print $2; found = 1 } END { if (!found) print "no queue " q }'
}

# rmq_counts: every queue's name, messages, messages_ready and
# messages_unacknowledged, a line each, separated by spaces, sorted by name
rmq_counts() {
	rmq_ctl -q list_queues --no-table-headers name messages messages_ready messages_unacknowledged |
		tr '\t' ' ' | sort
}

# rmq_wait_counts "QUEUE MESSAGES READY UNACKED"...: wait (at most 30 s)
# until rmq_counts shows these lines (all of its lines, in its order), and
# print what it last showed, one line joined by "; ", for ex_check to
# compare with the lines wanted joined the same way
rmq_wait_counts() {
	local want got i
	want=$(printf '%s\n' "$@")
	for i in $(seq 1 30); do
		got=$(rmq_counts)
		[ "$got" = "$want" ] && break
		sleep 1
	done
	printf '%s\n' "$got" | paste -sd ';' | sed 's/;/; /g'
}

# rmq_py_venv: a virtual environment with pika (rabbitmq-requirements.txt
# beside this file) under the suite's cache, made once; prints its path
rmq_py_venv() {
	local req cache tag venv py=${IDEM_PYTHON:-/usr/bin/python3}
	req=$(dirname "${BASH_SOURCE[0]}")/rabbitmq-requirements.txt
	cache=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/python
	mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] || cache=${TMPDIR:-/tmp}/idempotency-cache-$(id -u)/python
	mkdir -p "$cache"
	tag=$({ cat "$req"; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)
	venv=$cache/venv-amqp-$tag
	if [ ! -f "$venv/.complete" ]; then
		(
			flock 9
			if [ ! -f "$venv/.complete" ]; then
				echo "rabbitmq: creating $venv" >&2
				rm -rf "$venv"
				"$py" -m venv "$venv" >&2 &&
					PIP_CACHE_DIR="$cache/pip" "$venv/bin/python" -m pip install --disable-pip-version-check \
						--no-input -q -r "$req" >&2 &&
					chmod -R a+rX "$venv" && touch "$venv/.complete"
			fi
		) 9>"$cache/.lock-amqp-$tag-$(id -u)" || return 1
	fi
	echo "$venv"
}
