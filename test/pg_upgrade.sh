#!/usr/bin/env bash
# A major-version upgrade keeps every record: `bash test/pg_upgrade.sh OLD NEW`
# (as root, on a Debian machine whose apt has PostgreSQL OLD and NEW;
# test/matrix.sh runs it in a throwaway root where both can be installed
# side by side: sid's 18 and experimental's 19).
#
# It installs both majors, builds and installs the extension for each, and
# makes a cluster of OLD with the library preloaded, the extension installed
# and records of every status: a completed key, a processing one, one
# flagged stuck, one stuck whose operation has a reconciler registered, and
# an idem_consume message.  Then it upgrades that cluster to NEW two ways:
#   pg_upgrade             pg_upgrade --check passes, then pg_upgrade
#   pg_upgradecluster      Debian's wrapper, -m upgrade (pg_upgrade) and
#                          -m dump (pg_dump and restore), on the packaged
#                          cluster OLD/main
# and checks on NEW that the extension is the same version, that the
# completed key replays its response, a different request for it is a
# mismatch, the processing key answers in_progress, the stuck key is stuck,
# the consumed message is a duplicate, and that the background worker runs
# the registered reconciler, which settles its stuck key.  One line "ok" or
# "not ok" per check; the last line counts them, and the exit status is
# non-zero on any failure.
set -euo pipefail

old=${1:?usage: pg_upgrade.sh OLD NEW}
new=${2:?usage: pg_upgrade.sh OLD NEW}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive

[ "$(id -u)" = 0 ] || { echo "pg_upgrade.sh: must run as root" >&2; exit 1; }

echo "== installing PostgreSQL $old and $new"
apt-get update -qq
apt-get install -y -qq --no-install-recommends make gcc libc6-dev procps \
	"postgresql-$old" "postgresql-server-dev-$old" \
	"postgresql-$new" "postgresql-server-dev-$new" >/dev/null

for v in "$old" "$new"; do
	echo "== building idempotency for PostgreSQL $v"
	rm -rf "/tmp/idem-build-$v"
	cp -a "$src" "/tmp/idem-build-$v"
	make -C "/tmp/idem-build-$v" -s WERROR=1 PG_CONFIG="/usr/lib/postgresql/$v/bin/pg_config" clean all
	make -C "/tmp/idem-build-$v" -s PG_CONFIG="/usr/lib/postgresql/$v/bin/pg_config" install >/dev/null
done

passed=0
failed=0
check() {
	local name=$1 got=$2 want=$3
	if [ "$got" = "$want" ]; then
		echo "ok - $name"
		passed=$((passed + 1))
	else
		echo "not ok - $name"
		echo "#   got:  $got"
		echo "#   want: $want"
		failed=$((failed + 1))
	fi
}

as_pg() { runuser -u postgres -- "$@"; }

# psql on the cluster at host $1 port $2, database app
q() {
	local host=$1 port=$2
	shift 2
	as_pg "/usr/lib/postgresql/$new/bin/psql" -X -q -At -v ON_ERROR_STOP=1 \
		-h "$host" -p "$port" -d app "$@"
}

# The records of every status and a reconciler, in database app of the
# cluster at host $1 port $2 (the worker is off there: nothing changes them)
write_records() {
	local host=$1 port=$2
	as_pg "/usr/lib/postgresql/$old/bin/createdb" -h "$host" -p "$port" app
	as_pg "/usr/lib/postgresql/$old/bin/psql" -X -q -v ON_ERROR_STOP=1 -h "$host" -p "$port" -d app \
		>/dev/null <<'SQL'
CREATE EXTENSION idempotency;
CREATE TABLE charges (key text PRIMARY KEY);
INSERT INTO charges VALUES ('k-recon');
CREATE FUNCTION reconcile_charge(r idem_keys) RETURNS void
LANGUAGE plpgsql SET search_path = public AS $$
BEGIN
	IF EXISTS (SELECT FROM charges WHERE key = r.key) THEN
		PERFORM idem_complete(r.operation, r.key, '{"by": "reconciler"}', 201, r.key, r.scope);
	END IF;
END $$;
SELECT idem_set_reconciler('pay', 'reconcile_charge(idem_keys)');

BEGIN;
SELECT outcome FROM idem_reserve('pay', 'k-done', '{"amount": 10}');
SELECT idem_complete('pay', 'k-done', '{"id": 1}', 201, 'r-1');
COMMIT;
SELECT outcome FROM idem_reserve('pay', 'k-open', '{"amount": 20}');
SELECT idem_checkpoint('pay', 'k-open', 'sent');
SELECT outcome FROM idem_reserve('pay', 'k-recon', '{"amount": 30}');
SELECT outcome FROM idem_reserve('manual', 'k-stuck', '{"amount": 40}');
SELECT idem_checkpoint('manual', 'k-stuck', 'half-way');
UPDATE idem_keys SET updated_at = now() - interval '2 hours'
WHERE key IN ('k-recon', 'k-stuck');
SELECT idem_flag_stuck();
SELECT idem_consume('inbox', 'm-1');
SQL
}

# What the records say on NEW, at host $1 port $2; $3 names the way
check_records() {
	local host=$1 port=$2 how=$3 i
	check "$how: the extension is the same version" \
		"$(q "$host" "$port" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'")" \
		"$version"
	check "$how: the server is PostgreSQL $new" \
		"$(q "$host" "$port" -c "SELECT current_setting('server_version_num')::int / 10000")" "$new"
	check "$how: a completed key replays its response" \
		"$(q "$host" "$port" -c "SELECT outcome || ' ' || http_status || ' ' || response::text || ' ' || resource_id FROM idem_reserve('pay', 'k-done', '{\"amount\": 10}')")" \
		'replay 201 {"id": 1} r-1'
	check "$how: a different request for it is a mismatch" \
		"$(q "$host" "$port" -c "SELECT outcome FROM idem_reserve('pay', 'k-done', '{\"amount\": 11}')")" \
		'mismatch'
	check "$how: a processing key answers in_progress" \
		"$(q "$host" "$port" -c "SELECT outcome || ' ' || http_status FROM idem_reserve('pay', 'k-open', '{\"amount\": 20}')")" \
		'in_progress 409'
	check "$how: a stuck key is stuck, with its recovery point" \
		"$(q "$host" "$port" -c "SELECT outcome || ' ' || recovery_point FROM idem_reserve('manual', 'k-stuck', '{\"amount\": 40}')")" \
		'stuck half-way'
	check "$how: a consumed message is a duplicate" \
		"$(q "$host" "$port" -c "SELECT idem_consume('inbox', 'm-1')")" 'f'
	# The worker, preloaded on NEW, runs the reconciler registered on OLD
	for i in $(seq 1 60); do
		[ "$(q "$host" "$port" -c "SELECT status FROM idem_keys WHERE key = 'k-recon'")" = completed ] && break
		sleep 1
	done
	check "$how: the worker ran the reconciler, which settled its stuck key" \
		"$(q "$host" "$port" -c "SELECT outcome || ' ' || response::text FROM idem_reserve('pay', 'k-recon', '{\"amount\": 30}')")" \
		'replay {"by": "reconciler"}'
	check "$how: the worker left the other keys as they were" \
		"$(q "$host" "$port" -c "SELECT string_agg(key || ' ' || status, ', ' ORDER BY key) FROM idem_keys WHERE scope = ''")" \
		'k-done completed, k-open processing, k-recon completed, k-stuck stuck'
}

conf_lines() {
	printf '%s\n' "shared_preload_libraries = 'idempotency'" \
		"idempotency.processing_timeout = '1h'" \
		"idempotency.sweep_interval = '200ms'" \
		"idempotency.enabled = $1"
}

version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$src/idempotency.control")

# 1. pg_upgrade itself
echo "== pg_upgrade from $old to $new"
work=/tmp/idem-pg-upgrade
rm -rf "$work"
mkdir -p "$work"
chown postgres: "$work"
bin_old=/usr/lib/postgresql/$old/bin
bin_new=/usr/lib/postgresql/$new/bin
as_pg "$bin_old/initdb" -D "$work/old" --auth=trust --encoding=UTF8 --locale=C -k >/dev/null
# pg_upgrade needs the same checksum setting on both (initdb's default
# changed in 18): on
as_pg "$bin_new/initdb" -D "$work/new" --auth=trust --encoding=UTF8 --locale=C -k >/dev/null
for d in old new; do
	{ printf '%s\n' "listen_addresses = ''" "unix_socket_directories = '$work'"
	  conf_lines "$([ $d = old ] && echo off || echo on)"; } |
		as_pg tee -a "$work/$d/postgresql.conf" >/dev/null
done
as_pg "$bin_old/pg_ctl" -D "$work/old" -l "$work/old.log" -o "-p 5440" -w start >/dev/null
write_records "$work" 5440
(cd "$work" && as_pg "$bin_new/pg_upgrade" -b "$bin_old" -B "$bin_new" \
	-d "$work/old" -D "$work/new" -p 5440 -P 5441 --check) >"$work/check.log" 2>&1 && rc=0 || rc=$?
check "pg_upgrade: --check passes with the extension installed" "$rc" 0
[ "$rc" = 0 ] || sed 's/^/#   /' "$work/check.log"
as_pg "$bin_old/pg_ctl" -D "$work/old" -w stop >/dev/null
(cd "$work" && as_pg "$bin_new/pg_upgrade" -b "$bin_old" -B "$bin_new" \
	-d "$work/old" -D "$work/new" -p 5440 -P 5441) >"$work/upgrade.log" 2>&1 && rc=0 || rc=$?
check "pg_upgrade: the upgrade succeeds" "$rc" 0
if [ "$rc" = 0 ]; then
	as_pg "$bin_new/pg_ctl" -D "$work/new" -l "$work/new.log" -o "-p 5441" -w start >/dev/null
	check_records "$work" 5441 pg_upgrade
	as_pg "$bin_new/pg_ctl" -D "$work/new" -w stop >/dev/null
else
	tail -n 30 "$work/upgrade.log" | sed 's/^/#   /'
	find "$work/new" -name '*.txt' -path '*pg_upgrade_output*' -exec sed 's/^/#   /' {} + 2>/dev/null || true
fi

# 2. Debian's pg_upgradecluster, both methods, on the packaged cluster OLD/main
for method in upgrade dump; do
	echo "== pg_upgradecluster -m $method from $old to $new"
	pg_dropcluster --stop "$new" main 2>/dev/null || true
	pg_dropcluster --stop "$old" main 2>/dev/null || true
	pg_createcluster "$old" main >/dev/null
	conf_lines off >"/etc/postgresql/$old/main/conf.d/idempotency.conf"
	pg_ctlcluster "$old" main start
	port=$(pg_lsclusters -h | awk -v v="$old" '$1 == v && $2 == "main" {print $3}')
	write_records /var/run/postgresql "$port"
	if pg_upgradecluster -m "$method" "$old" main >"$work/upgradecluster-$method.log" 2>&1; then
		check "pg_upgradecluster -m $method: the upgrade succeeds" 0 0
		# the worker on: the new cluster runs the reconciler
		conf_lines on >"/etc/postgresql/$new/main/conf.d/idempotency.conf"
		pg_ctlcluster "$new" main restart
		port=$(pg_lsclusters -h | awk -v v="$new" '$1 == v && $2 == "main" {print $3}')
		check_records /var/run/postgresql "$port" "pg_upgradecluster -m $method"
	else
		check "pg_upgradecluster -m $method: the upgrade succeeds" 1 0
		tail -n 30 "$work/upgradecluster-$method.log" | sed 's/^/#   /'
	fi
done
pg_dropcluster --stop "$new" main 2>/dev/null || true
pg_dropcluster --stop "$old" main 2>/dev/null || true

echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
