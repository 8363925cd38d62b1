// What only the Fastify plugin has, through fastify.inject, against the real
// extension (its decorators, a route left alone, a raw body, its start-up,
// a record the Express middleware completed); the behaviour it shares with
// the Express middleware is in behaviour.test.ts. Every effect is counted
// in the database.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import { ExtensionVersionError } from '../src/index.js';
import fastifyIdempotency from '../src/fastify.js';
import {
  createDatabase, defaultVersion, type TestDatabase,
} from './helpers.js';

const users: Record<string, string> = { 'token-a': 'user-a', 'token-b': 'user-b' };
const scope = (request: FastifyRequest) => users[(request.headers.authorization ?? '').replace(/^Bearer /, '')];

let db: TestDatabase;
let app: FastifyInstance;

const post = (url: string, key: string | string[] | null, body: unknown, user = 'token-a', contentType = 'application/json') => {
  const headers: Record<string, string | string[]> = { authorization: `Bearer ${user}`, 'content-type': contentType };
  if (key !== null) headers['idempotency-key'] = key;
  return app.inject({ method: 'POST', url, headers, payload: typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body) });
};
const effects = (note: string) => db.count('SELECT count(*) FROM effects WHERE note = $1', [note]);

before(async () => {
  db = await createDatabase('fastify');
  app = Fastify();
  app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
  await app.register(fastifyIdempotency, { pool: db.pool, scope, onError: () => undefined });
  app.post<{ Body: { note?: string } }>('/items', { config: { idempotency: { operation: 'create-item' } } }, async (request, reply) => {
    const { client } = request.idempotency!;
    const note = request.body.note ?? null;
    const { rows } = await client.query('INSERT INTO effects (note) VALUES ($1) RETURNING id', [note]);
    return reply.code(201).header('location', `/items/${rows[0].id}`).header('x-not-stored', 'x').send({ id: Number(rows[0].id), note });
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
  it('leaves a route with config.idempotency false alone', async () => {
    const r = await post('/untouched', null, {});
    assert.equal(r.statusCode, 200);
    assert.deepEqual(r.json(), { idempotency: null });
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
