#!/usr/bin/env bash
# clients/node/demo/start.sh ARGS...: builds the Express demo app (with the
# pg-idempotency package it uses) if needed, then runs it in the foreground
# with ARGS (--port N, --port-file F, --max-seconds S, --bench) and libpq's
# environment (PGHOST, PGPORT, PGUSER, PGDATABASE).  Works from any cwd and
# as any user: the build lives in
# ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/node-demo/<hash of the sources>.
set -euo pipefail

pkg=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}
mkdir -p "$base/npm" "$base/node-demo" 2>/dev/null || true
if [ ! -w "$base/npm" ] || [ ! -w "$base/node-demo" ]; then
	base=${TMPDIR:-/tmp}/idempotency-cache-$(id -u)
	mkdir -p "$base/npm" "$base/node-demo"
fi
export npm_config_cache=$base/npm npm_config_update_notifier=false \
	npm_config_fund=false npm_config_audit=false npm_config_loglevel=warn

hash=$(cd "$pkg" && find package.json package-lock.json tsconfig*.json scripts src demo/src \
	-type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
build=$base/node-demo/$hash
if [ ! -f "$build/.built" ]; then
	exec 9>"$build.lock"
	flock 9
	if [ ! -f "$build/.built" ]; then
		rm -rf "$build"
		mkdir -p "$build"
		(cd "$pkg" && tar -cf - package.json package-lock.json tsconfig*.json scripts src demo/src test) \
			| tar -C "$build" -xf -
		(cd "$build" && nice -n 10 npm ci --prefer-offline >&2 && nice -n 10 npm run --silent build >&2)
		touch "$build/.built"
	fi
	exec 9>&-
fi
cd "$build"
exec node build/demo/src/server.js "$@"
