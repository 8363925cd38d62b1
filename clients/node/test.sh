#!/usr/bin/env bash
# clients/node/test.sh: the pg-idempotency npm package's checks.
#
# Needs libpq's environment (PGHOST a unix socket directory, PGPORT, PGUSER
# a superuser, PGDATABASE) naming a server that has the extension
# installed; the tests create (and drop) databases of their own.  Runs as
# any user: the package is copied to a temporary directory and built there,
# with npm's cache in ${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}/npm.
#
# Steps: npm ci, tsc --noEmit, the build (ESM and CommonJS), the tests
# (node --test; none run is a failure), npm pack, and the tarball installed
# into a clean project where it is both imported and required.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
base=${IDEM_CLIENT_CACHE:-/var/tmp/idempotency-cache}
cache=$base/npm
mkdir -p "$cache" 2>/dev/null || true
if [ ! -w "$cache" ]; then
	cache=${TMPDIR:-/tmp}/idempotency-cache-$(id -u)/npm
	mkdir -p "$cache"
fi
export npm_config_cache=$cache npm_config_update_notifier=false \
	npm_config_fund=false npm_config_audit=false npm_config_loglevel=warn

work=$(mktemp -d "${TMPDIR:-/tmp}/pg-idempotency-node.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/pkg" "$work/consumer"
tar -C "$here" --exclude=./node_modules --exclude=./dist --exclude=./build \
	--exclude='./*.tgz' -cf - . | tar -C "$work/pkg" -xf -
cd "$work/pkg"

step() { echo "== node: $*"; }

step "npm ci"
nice -n 10 npm ci --prefer-offline
step "tsc --noEmit"
nice -n 10 npx --no-install tsc --noEmit -p tsconfig.json
step "build"
nice -n 10 npm run --silent build
step "tests"
status=0
nice -n 10 node scripts/test.mjs | tee "$work/tests.log" || status=$?
summary=$(grep -E '^node: [0-9]+ passed, [0-9]+ failed' "$work/tests.log" | tail -1 || true)
if [ "$status" -ne 0 ]; then
	echo "node: tests failed" >&2
	exit 1
fi

step "npm pack, and the tarball in a clean project"
tarball=$(npm pack --silent --pack-destination "$work" | tail -1)
tar -tzf "$work/$tarball" | sort > "$work/files"
for f in package/dist/esm/index.js package/dist/esm/index.d.ts package/dist/cjs/index.js \
	package/dist/cjs/index.d.ts package/dist/cjs/express.js package/dist/esm/fastify.js \
	package/README.md package/LICENSE package/CHANGELOG.md; do
	grep -qx "$f" "$work/files" || { echo "node: $f is missing from $tarball" >&2; exit 1; }
done
if grep -E '^package/(src|test|demo|build)/' "$work/files"; then
	echo "node: $tarball ships sources or tests" >&2
	exit 1
fi
cd "$work/consumer"
npm init -y >/dev/null
nice -n 10 npm install --prefer-offline --no-save "$work/$tarball" \
	"pg@$(node -p "require('$work/pkg/node_modules/pg/package.json').version")" \
	"express@$(node -p "require('$work/pkg/node_modules/express/package.json').version")" \
	"fastify@$(node -p "require('$work/pkg/node_modules/fastify/package.json').version")" >/dev/null
cat > esm.mjs <<'JS'
import { parseIdempotencyKey, Idempotency, MINIMUM_EXTENSION_VERSION } from 'pg-idempotency';
import { idempotency } from 'pg-idempotency/express';
import fastifyIdempotency, { fastifyIdempotency as named } from 'pg-idempotency/fastify';
import assert from 'node:assert/strict';
assert.deepEqual(parseIdempotencyKey(['"a"']), { kind: 'key', key: 'a' });
assert.equal(typeof Idempotency.create, 'function');
assert.equal(typeof idempotency, 'function');
assert.equal(fastifyIdempotency, named);
assert.equal(MINIMUM_EXTENSION_VERSION, '0.2.0');
console.log('node: import works');
JS
cat > cjs.cjs <<'JS'
const { parseIdempotencyKey, Idempotency } = require('pg-idempotency');
const { idempotency } = require('pg-idempotency/express');
const fastify = require('pg-idempotency/fastify');
const assert = require('node:assert/strict');
assert.deepEqual(parseIdempotencyKey(['b']), { kind: 'key', key: 'b' });
assert.equal(typeof Idempotency.create, 'function');
assert.equal(typeof idempotency, 'function');
assert.equal(fastify.default, fastify.fastifyIdempotency);
assert.equal(typeof fastify.default, 'function');
console.log('node: require works');
JS
node esm.mjs
node cjs.cjs
# the shipped types, as an ESM and as a CommonJS consumer resolve them
cat > types.mts <<'TS'
import { parseIdempotencyKey, type KeyParse, type IdempotencyOptions } from 'pg-idempotency';
import { idempotency, type IdempotencyMiddleware } from 'pg-idempotency/express';
import fastifyIdempotency from 'pg-idempotency/fastify';
const parsed: KeyParse = parseIdempotencyKey(['"a"']);
const make: (o: IdempotencyOptions<never>) => unknown = idempotency as never;
export const all: [KeyParse, unknown, unknown, IdempotencyMiddleware | undefined] = [parsed, make, fastifyIdempotency, undefined];
TS
cat > types.cts <<'TS'
import core = require('pg-idempotency');
import express = require('pg-idempotency/express');
export const parsed: core.KeyParse = core.parseIdempotencyKey(['a']);
export const mw: typeof express.idempotency = express.idempotency;
TS
nice -n 10 node "$work/pkg/node_modules/typescript/bin/tsc" --noEmit --strict --module nodenext \
	--moduleResolution nodenext --skipLibCheck --types node --typeRoots "$work/pkg/node_modules/@types" \
	types.mts types.cts
echo "node: the tarball's types check as ESM and CommonJS"

echo "$summary"
