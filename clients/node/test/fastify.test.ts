// The Fastify plugin through fastify.inject, against the real extension:
// every effect is counted in the database.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import { ExtensionVersionError } from '../src/index.js';
import fastifyIdempotency from '../src/fastify.js';
import {
  createDatabase, defaultVersion, holdReservation, postAndHangUp, refusedBodies, refusedSqlStates, sleep, type TestDatabase,
} from './helpers.js';

const users: Record<string, string> = { 'token-a': 'user-a', 'token-b': 'user-b' };
const scope = (request: FastifyRequest) => users[(request.headers.authorization ?? '').replace(/^Bearer /, '')];

let db: TestDatabase;
/** Called by the handler of note 'slow' once it runs. */
let slowStarted: () => void = () => {};
let app: FastifyInstance;
const reported: unknown[] = [];

const post = (url: string, key: string | string[] | null, body: unknown, user = 'token-a', contentType = 'application/json') => {
  const headers: Record<string, string | string[]> = { authorization: `Bearer ${user}`, 'content-type': contentType };
  if (key !== null) headers['idempotency-key'] = key;
  return app.inject({ method: 'POST', url, headers, payload: typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body) });
};
const effects = (note: string) => db.count('SELECT count(*) FROM effects WHERE note = $1', [note]);
const records = (where: string) => db.count(`SELECT count(*) FROM idem_keys WHERE ${where}`);

before(async () => {
  db = await createDatabase('fastify');
  app = Fastify();
  app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
  await app.register(fastifyIdempotency, { pool: db.pool, scope, onError: (e) => reported.push(e) });
  app.post<{ Body: { note?: string } }>('/items', { config: { idempotency: { operation: 'create-item' } } }, async (request, reply) => {
    const { client } = request.idempotency!;
    const note = request.body.note ?? null;
    const { rows } = await client.query('INSERT INTO effects (note) VALUES ($1) RETURNING id', [note]);
    if (note === 'fail') throw new Error('secret internal detail');
    if (note === 'conflict') await client.query("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$");
    if (note?.startsWith('sqlstate-')) await client.query(`DO $$ BEGIN RAISE EXCEPTION 'secret text' USING ERRCODE = '${note.slice(9, 14)}'; END $$`);
    if (note === 'unavailable') return reply.code(503).send({ error: 'try later' });
    if (note === 'declined') return reply.code(402).send({ error: 'declined' });
    if (note === 'teapot') throw Object.assign(new Error('short and stout'), { statusCode: 418 });
    if (note === 'slow') { slowStarted(); await sleep(400); }
    return reply.code(201).header('location', `/items/${rows[0].id}`).header('x-not-stored', 'x').send({ id: Number(rows[0].id), note });
  });
  app.post('/subset', { config: { idempotency: { operation: 'subset', fingerprint: ['/order_id'] } } }, async (request, reply) => {
    await request.idempotency!.client.query("INSERT INTO effects (note) VALUES ('subset')");
    return reply.code(201).send({ ok: true });
  });
  app.post<{ Params: { name: string } }>('/bytes/:name', async (request, reply) => {
    await request.idempotency!.client.query('INSERT INTO effects (note) VALUES ($1)', [request.params.name]);
    return reply.code(200).type('application/octet-stream').send(Buffer.concat([Buffer.from([1, 2]), request.body as Buffer]));
  });
  app.post('/untouched', { config: { idempotency: false } }, async (request) => ({ idempotency: request.idempotency }));
  await app.ready();
});
after(async () => {
  await app.close();
  await db.drop();
});

describe('the Fastify plugin', () => {
  it('decorates the instance, typed', async () => {
    assert.equal(app.idempotency.extension.version, await defaultVersion(db.pool));
    assert.equal(app.idempotency.mapping['in-progress'].status, 409);
  });
  it('takes a quoted and a bare key as one key, replaying the status, body and Location', async () => {
    const first = await post('/items', '"k-1"', { note: 'a' });
    assert.equal(first.statusCode, 201);
    const again = await post('/items', 'k-1', { note: 'a' });
    assert.equal(again.statusCode, 201);
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.equal(again.headers.location, first.headers.location);
    assert.equal(again.headers['x-not-stored'], undefined);
    assert.deepEqual(again.json(), first.json());
    assert.equal(await effects('a'), 1);
  });
  for (const [label, key] of [['two fields', ['x', 'y']], ['a bad escape', '"a\\qb"'], ['a list', '"a", "b"'], ['parameters', '"a";p=1']] as [string, string | string[]][]) {
    it(`answers 400 invalid-key for ${label}`, async () => {
      const r = await post('/items', key, { note: 'bad-key' });
      assert.equal(r.statusCode, 400);
      assert.equal(r.headers['content-type'], 'application/problem+json');
      assert.equal(r.json().code, 'invalid-key');
      assert.equal(await effects('bad-key'), 0);
    });
  }
  it('answers 400 missing-key, 401 unauthenticated', async () => {
    assert.equal((await post('/items', null, { note: 'nk' })).json().code, 'missing-key');
    const anon = await post('/items', 'anon', { note: 'nk' }, 'nobody');
    assert.equal(anon.statusCode, 401);
    assert.equal(anon.json().code, 'unauthenticated');
    assert.equal(await effects('nk'), 0);
  });
  it('keeps user B from replaying user A\'s key', async () => {
    await post('/items', 'shared', { note: 'scoped' }, 'token-a');
    const b = await post('/items', 'shared', { note: 'scoped' }, 'token-b');
    assert.equal(b.statusCode, 201);
    assert.equal(b.headers['idempotent-replayed'], undefined);
    assert.equal(await effects('scoped'), 2);
  });
  it('fingerprints a subset, and refuses a subset on a body that is not JSON', async () => {
    await post('/subset', 's-1', { order_id: 'o', note: 'x' });
    assert.equal((await post('/subset', 's-1', { note: 'y', order_id: 'o' })).headers['idempotent-replayed'], 'true');
    assert.equal((await post('/subset', 's-1', { order_id: 'p' })).statusCode, 422);
    const text = await post('/subset', 's-2', Buffer.from('raw'), 'token-a', 'application/octet-stream');
    assert.equal(text.statusCode, 400);
    assert.equal(text.json().code, 'invalid-request');
    assert.equal(await effects('subset'), 1);
  });
  it('stores a body that is not JSON as base64 and replays its bytes; the default operation is the route template', async () => {
    const first = await post('/bytes/b1', 'b-1', Buffer.from([0, 255]), 'token-a', 'application/octet-stream');
    const again = await post('/bytes/b1', 'b-1', Buffer.from([0, 255]), 'token-a', 'application/octet-stream');
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.deepEqual(again.rawPayload, first.rawPayload);
    assert.deepEqual(again.rawPayload, Buffer.from([1, 2, 0, 255]));
    const { rows } = await db.pool.query("SELECT operation, response FROM idem_keys WHERE key = 'b-1'");
    assert.equal(rows[0].operation, 'POST /bytes/{name}');
    assert.deepEqual(rows[0].response, { v: 1, headers: { 'content-type': 'application/octet-stream' }, body_base64: 'AQIA/w==' });
    assert.equal(await effects('b1'), 1);
  });
  it('answers in_progress, stuck and mismatch from the mapping', async () => {
    await holdReservation(db.pool, 'create-item', 'busy', 'user-a', '{"method":"POST","path":"/items","body":{"note":"busy"}}');
    const busy = await post('/items', 'busy', { note: 'busy' });
    assert.equal(busy.statusCode, 409);
    assert.equal(busy.headers['retry-after'], '1');
    assert.equal(busy.json().code, 'in-progress');
    await db.pool.query("UPDATE idem_keys SET status = 'stuck' WHERE key = 'busy'");
    assert.equal((await post('/items', 'busy', { note: 'busy' })).json().code, 'stuck');
    assert.equal((await post('/items', 'busy', { note: 'other' })).json().code, 'mismatch');
    assert.equal(await effects('busy'), 0);
  });
  it('answers 22023 as 400 invalid-request with the extension\'s message', async () => {
    const r = await post('/items', 'k'.repeat(300), { note: 'long' });
    assert.equal(r.statusCode, 400);
    assert.match(r.json().detail, /too long/);
  });
  it('takes 256 levels of nesting as JSON and hashes a body nested deeper as its bytes', async () => {
    const nested = (levels: number) => `{"note": "deep", "x": ${'['.repeat(levels - 1)}${']'.repeat(levels - 1)}}`;
    const hashed = (key: string, doc: string) => records(`key = '${key}' AND request_hash = idem_hash('${doc}'::jsonb)`);
    assert.equal((await post('/items', 'deep-256', nested(256))).statusCode, 201);
    assert.equal(await hashed('deep-256', `{"method": "POST", "path": "/items", "body": ${nested(256)}}`), 1);
    assert.equal((await post('/items', 'deep-257', nested(257))).statusCode, 201);
    assert.equal(await hashed('deep-257', `{"method": "POST", "path": "/items", "body_base64": "${Buffer.from(nested(257)).toString('base64')}"}`), 1);
    assert.equal(await effects('deep'), 2);
  });
  refusedBodies.forEach(([label, body, message], i) => {
    it(`answers a request the server refuses with 400 invalid-request, reserving nothing: ${label}`, async () => {
      const r = await post('/items', `refused-${i}`, body);
      assert.equal(r.statusCode, 400);
      assert.equal(r.headers['content-type'], 'application/problem+json');
      assert.equal(r.json().code, 'invalid-request');
      assert.match(r.json().detail, message);
      assert.equal(await effects('refused'), 0);
      assert.equal(await records(`key = 'refused-${i}'`), 0);
    });
  });
  it('refuses a number beyond a double in a subset member, rather than write it as null', async () => {
    const r = await post('/subset', 'refused-subset', '{"order_id": 1e400}');
    assert.equal(r.statusCode, 400);
    assert.equal(r.json().code, 'invalid-request');
    assert.match(r.json().detail, /beyond the range of a double/);
    assert.equal(await records("key = 'refused-subset'"), 0);
  });
  for (const state of refusedSqlStates) {
    it(`answers ${state} from the handler's own SQL with 400 invalid-request, rolled back`, async () => {
      const r = await post('/items', `refused-${state}`, { note: `sqlstate-${state}` });
      assert.equal(r.statusCode, 400);
      assert.equal(r.json().code, 'invalid-request');
      assert.equal(r.json().detail, 'secret text');
      assert.equal(await effects(`sqlstate-${state}`), 0);
      assert.equal(await records(`key = 'refused-${state}'`), 0);
    });
  }
  it('rolls back a handler error: 500 internal-error without its text, no effect, no record', async () => {
    const r = await post('/items', 'boom', { note: 'fail' });
    assert.equal(r.statusCode, 500);
    assert.equal(r.json().code, 'internal-error');
    assert.doesNotMatch(r.body, /secret/);
    assert.ok(reported.some((e) => (e as Error).message === 'secret internal detail'), 'the error is reported to onError');
    assert.equal(await effects('fail'), 0);
    assert.equal(await records("key = 'boom'"), 0);
  });
  it('rolls back a 40001 from the handler\'s SQL: 503 retry', async () => {
    const r = await post('/items', 'conflict', { note: 'conflict' });
    assert.equal(r.statusCode, 503);
    assert.equal(r.headers['retry-after'], '1');
    assert.equal(r.json().code, 'retry');
    assert.equal(await effects('conflict'), 0);
  });
  it('rolls back a retryable status, and completes a final failure', async () => {
    assert.equal((await post('/items', 'u-1', { note: 'unavailable' })).statusCode, 503);
    assert.equal(await effects('unavailable'), 0);
    assert.equal(await records("key = 'u-1'"), 0);
    await post('/items', 'd-1', { note: 'declined' });
    const again = await post('/items', 'd-1', { note: 'declined' });
    assert.equal(again.statusCode, 402);
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.equal(await effects('declined'), 1);
  });
  it('rolls back an error with its own 4xx, which Fastify renders as usual', async () => {
    const r = await post('/items', 'tea', { note: 'teapot' });
    assert.equal(r.statusCode, 418);
    assert.equal(r.json().message, 'short and stout');
    assert.equal(await effects('teapot'), 0);
    assert.equal(await records("key = 'tea'"), 0);
  });
  it('answers a body over bodyLimit with 413 payload-too-large, reserving nothing', async () => {
    const small = Fastify();
    await small.register(fastifyIdempotency, { pool: db.pool, scope, bodyLimit: 8 });
    small.post('/s', async () => ({ ok: true }));
    const r = await small.inject({ method: 'POST', url: '/s', headers: { authorization: 'Bearer token-a', 'idempotency-key': 'big', 'content-type': 'application/json' },
      payload: '{"a": "0123456789"}' });
    await small.close();
    assert.equal(r.statusCode, 413);
    assert.equal(r.json().code, 'payload-too-large');
    assert.equal(await records("key = 'big'"), 0);
  });
  it('leaves a route with config.idempotency false alone', async () => {
    const r = await post('/untouched', null, {});
    assert.equal(r.statusCode, 200);
    assert.deepEqual(r.json(), { idempotency: null });
  });
  it('commits when the client goes away before the answer (a real socket)', async () => {
    const address = await app.listen({ port: 0, host: '127.0.0.1' });
    const { port } = new URL(address);
    const body = JSON.stringify({ note: 'slow' });
    const started = new Promise<void>((r) => { slowStarted = r; });
    await postAndHangUp(Number(port), 'gone', body, started);
    for (let i = 0; i < 50 && (await records("key = 'gone' AND status = 'completed'")) === 0; i++) await sleep(100);
    assert.equal(await records("key = 'gone' AND status = 'completed'"), 1);
    assert.equal(await effects('slow'), 1);
    assert.equal((await post('/items', 'gone', { note: 'slow' })).headers['idempotent-replayed'], 'true');
    assert.equal(await effects('slow'), 1);
  });
  it('returns every client to the pool', () => {
    assert.equal(db.pool.totalCount - db.pool.idleCount, 0);
  });
  it('replays a record the Express middleware completed (one envelope)', async () => {
    const { idempotency } = await import('../src/express.js');
    const express = (await import('express')).default;
    const supertest = (await import('supertest')).default;
    const idem = await idempotency({ pool: db.pool, scope: (req) => users[(req.headers.authorization ?? '').replace(/^Bearer /, '')] });
    const ex = express().post('/items', idem.route({ operation: 'create-item' }), express.json(), async (req, res) => {
      await req.idempotency!.client.query("INSERT INTO effects (note) VALUES ('cross')");
      res.status(201).location('/items/x').json({ from: 'express' });
    });
    await supertest(ex).post('/items').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 'cross')
      .set('Content-Type', 'application/json').send('{"note":"cross"}').expect(201);
    const r = await post('/items', 'cross', { note: 'cross' });
    assert.equal(r.statusCode, 201);
    assert.equal(r.headers['idempotent-replayed'], 'true');
    assert.equal(r.headers.location, '/items/x');
    assert.deepEqual(r.json(), { from: 'express' });
    assert.equal(await effects('cross'), 1);
  });
});

describe('the Fastify plugin\'s version check', () => {
  it('fails the app\'s start without the extension, naming what it found', async () => {
    const bare = await createDatabase('fastify_bare', { extension: false });
    const other = Fastify();
    try {
      await assert.rejects(async () => {
        await other.register(fastifyIdempotency, { pool: bare.pool, scope });
        await other.ready();
      }, (e: unknown) => e instanceof ExtensionVersionError && e.found === null);
    } finally {
      await other.close().catch(() => undefined);
      await bare.drop();
    }
  });
  it('fails with 0.1.0', async () => {
    const old = await createDatabase('fastify_old', { version: '0.1.0' });
    const other = Fastify();
    try {
      await assert.rejects(async () => {
        await other.register(fastifyIdempotency, { pool: old.pool, scope });
        await other.ready();
      }, /version 0\.1\.0/);
    } finally {
      await other.close().catch(() => undefined);
      await old.drop();
    }
  });
});
