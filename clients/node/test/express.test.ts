// What only the Express middleware has, through supertest, against the real
// extension (a body parser before it, an optional key, Buffer bodies, an
// error after the answer, its start-up); the behaviour it shares with the
// Fastify plugin is in behaviour.test.ts. Every effect is counted in the
// database.

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import express, { type Request } from 'express';
import pg from 'pg';
import supertest from 'supertest';
import { ExtensionVersionError } from '../src/index.js';
import { idempotency, type IdempotencyMiddleware } from '../src/express.js';
import {
  createDatabase, defaultVersion, holdReservation, sleep, type TestDatabase,
} from './helpers.js';

const users: Record<string, string> = { 'token-a': 'user-a', 'token-b': 'user-b' };
const scope = (req: Request) => users[(req.headers.authorization ?? '').replace(/^Bearer /, '')];

let db: TestDatabase;
let idem: IdempotencyMiddleware;
let app: express.Express;

const json = (path: string, key: string | string[] | null, body: unknown, user = 'token-a') => {
  let r = supertest(app).post(path).set('Authorization', `Bearer ${user}`);
  if (key !== null) r = r.set('Idempotency-Key', key as string);
  return r.set('Content-Type', 'application/json').send(JSON.stringify(body));
};
const effects = () => db.count('SELECT count(*) FROM effects');
const records = (where = 'true') => db.count(`SELECT count(*) FROM idem_keys WHERE ${where}`);

before(async () => {
  db = await createDatabase('express');
  idem = await idempotency({ pool: db.pool, scope, onError: () => undefined, replayHeaders: ['content-type', 'location', 'x-request-id'] });
  app = express();
  app.post('/items', idem.route({ operation: 'create-item' }), async (req, res) => {
    const { client } = req.idempotency!;
    const note = (req.body as { note?: string }).note ?? null;
    const { rows } = await client.query('INSERT INTO effects (note) VALUES ($1) RETURNING id', [note]);
    res.status(201).location(`/items/${rows[0].id}`).set('X-Request-Id', 'r-1').set('X-Not-Stored', 'x').json({ id: Number(rows[0].id), note });
  });
  app.post('/text/:name', idem, async (req, res) => {
    await req.idempotency!.client.query('INSERT INTO effects (note) VALUES ($1)', [req.params.name]);
    res.status(200).type('text/plain').send(Buffer.concat([Buffer.from('got '), req.body as Buffer]));
  });
  app.post('/parsed', express.json(), idem.route({ ttl: 3600 }), async (req, res) => {
    await req.idempotency!.client.query('INSERT INTO effects (note) VALUES ($1)', [JSON.stringify(req.body)]);
    res.status(201).json(req.body);
  });
  app.post('/optional', idem.route({ keyRequired: false, operation: 'optional' }), async (req, res) => {
    const db2 = req.idempotency?.client ?? db.pool;
    await db2.query('INSERT INTO effects (note) VALUES ($1)', ['optional']);
    res.status(201).json({ idempotent: req.idempotency !== undefined });
  });
  app.use(idem.errorHandler());
});
after(async () => db.drop());

describe('the key', () => {
  it('runs a route whose key is optional without idempotency', async () => {
    const r = await json('/optional', null, {}).expect(201);
    assert.deepEqual(r.body, { idempotent: false });
    assert.equal(await records("operation = 'optional'"), 0);
    assert.deepEqual((await json('/optional', 'opt-1', {}).expect(201)).body, { idempotent: true });
    assert.equal(await records("operation = 'optional'"), 1);
  });
});

describe('the scope', () => {
  it('refuses to start without a scope function', async () => {
    await assert.rejects(idempotency({ pool: db.pool } as never), TypeError);
  });
});

describe('the fingerprint', () => {
  it('a body nested more than 256 levels deep, parsed by express.json() before the middleware, is 400 invalid-request (its bytes are gone)', async () => {
    // without a parser before it, the handler gets it parsed and it is hashed as bytes: behaviour.test.ts
    const nested = (levels: number) => `{"note": "deep", "x": ${'['.repeat(levels - 1)}${']'.repeat(levels - 1)}}`;
    const raw = (path: string, key: string, body: string) => supertest(app).post(path).set('Authorization', 'Bearer token-a')
      .set('Idempotency-Key', key).set('Content-Type', 'application/json').send(body);
    await raw('/items', 'deep-257', nested(257)).expect(201);
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'deep'"), 1);
    const before = await effects();
    const r = await raw('/parsed', 'deep-parsed', nested(257)).expect(400);
    assert.equal(r.body.code, 'invalid-request');
    assert.equal(await records("key = 'deep-parsed'"), 0);
    assert.equal(await effects(), before);
  });
  it('the whole body, member order and number spelling aside', async () => {
    await json('/items', 'f-1', { note: 'fp', n: 1 }).expect(201);
    assert.equal((await json('/items', 'f-1', { n: 1.0, note: 'fp' }).expect(201)).headers['idempotent-replayed'], 'true');
    assert.equal((await json('/items', 'f-1', { n: 2, note: 'fp' }).expect(422)).body.code, 'mismatch');
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'fp'"), 1);
  });
  it('works after express.json(), and sets the ttl', async () => {
    await json('/parsed', 'p-1', { a: 1 }).expect(201);
    assert.equal((await json('/parsed', 'p-1', { a: 1 }).expect(201)).headers['idempotent-replayed'], 'true');
    assert.equal(await records("key = 'p-1' AND operation = 'POST /parsed' AND ttl = interval '1 hour'"), 1);
  });
});

describe('requests refused after express.json(): 400 invalid-request with its message, nothing reserved', () => {
  const raw = (path: string, key: string, body: string) => supertest(app).post(path).set('Authorization', 'Bearer token-a')
    .set('Idempotency-Key', key).set('Content-Type', 'application/json').send(body);
  it('a number beyond a double after express.json(): refused here, not written as null', async () => {
    const before = await effects();
    for (const [path, key] of [['/parsed', 'refused-parsed']] as const) {
      const r = await raw(path, key, '{"order_id": "o", "amount": 1e400}').expect(400);
      assert.equal(r.body.code, 'invalid-request');
      assert.match(r.body.detail, /beyond the range of a double/);
      assert.equal(await records(`key = '${key}'`), 0);
    }
    assert.equal(await effects(), before);
  });
});

describe('the envelope', () => {
  it('replays the status, Location and the allow-listed headers, not the others', async () => {
    const first = await json('/items', 'e-1', { note: 'env' }).expect(201);
    const again = await json('/items', 'e-1', { note: 'env' }).expect(201);
    assert.equal(again.headers.location, first.headers.location);
    assert.equal(again.headers['x-request-id'], 'r-1');
    assert.equal(again.headers['x-not-stored'], undefined);
    const { rows } = await db.pool.query("SELECT response FROM idem_keys WHERE key = 'e-1'");
    assert.deepEqual(rows[0].response, {
      v: 1,
      headers: { 'content-type': 'application/json; charset=utf-8', location: first.headers.location, 'x-request-id': 'r-1' },
      body: first.body,
    });
  });
  it('stores a body that is not JSON as base64 and replays its bytes; the default operation is the route template', async () => {
    const bytes = Buffer.from([0x00, 0xff, 0x41]);
    const send = () => supertest(app).post('/text/n1').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 't-1')
      .set('Content-Type', 'application/octet-stream').send(bytes).buffer(true).parse((res, cb) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => cb(null, Buffer.concat(chunks)));
      });
    const first = await send().expect(200);
    const again = await send().expect(200);
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.deepEqual(again.body, first.body);
    assert.deepEqual(again.body, Buffer.concat([Buffer.from('got '), bytes]));
    const { rows } = await db.pool.query("SELECT operation, response FROM idem_keys WHERE key = 't-1'");
    assert.equal(rows[0].operation, 'POST /text/{name}');
    assert.equal(rows[0].response.body_base64, Buffer.concat([Buffer.from('got '), bytes]).toString('base64'));
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'n1'"), 1);
  });
  it('replays a response completed by plain SQL (no "v") as JSON', async () => {
    await json('/items', 'e-2', { note: 'plain' }).expect(201);
    await db.pool.query("UPDATE idem_keys SET response = '{\"plain\": true}' WHERE key = 'e-2'");
    const r = await json('/items', 'e-2', { note: 'plain' }).expect(201).expect('content-type', /application\/json/);
    assert.deepEqual(r.body, { plain: true });
  });
});

describe('the mapping', () => {
  it('25006 (read-only) is 503 read-only with Retry-After', async () => {
    const pool = new pg.Pool({ database: db.name, options: '-c default_transaction_read_only=on', max: 2 });
    try {
      const ro = await idempotency({ pool, scope });
      const roApp = express().post('/items', ro, (_req, res) => { res.status(201).end(); });
      const r = await supertest(roApp).post('/items').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 'ro').expect(503).expect('retry-after', '1');
      assert.equal(r.body.code, 'read-only');
    } finally {
      await pool.end();
    }
  });
  it('is data: the status and Retry-After of a case, and the retryable list, can change', async () => {
    const custom = await idempotency({ pool: db.pool, scope, mapping: { 'in-progress': { status: 429, retryAfter: 7 } }, retryAfter: 3, retryable: [418] });
    const customApp = express().post('/c', custom, async (req, res) => {
      await req.idempotency!.client.query("INSERT INTO effects (note) VALUES ('custom')");
      res.status(req.headers['x-status'] ? Number(req.headers['x-status']) : 201).end();
    });
    await holdReservation(db.pool, 'POST /c', 'c-busy', 'user-a', '{"method":"POST","path":"/c"}');
    const busy = await supertest(customApp).post('/c').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 'c-busy').expect(429);
    assert.equal(busy.headers['retry-after'], '7');
    await db.pool.query("UPDATE idem_keys SET status = 'stuck' WHERE key = 'c-busy'");
    const stuck = await supertest(customApp).post('/c').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 'c-busy').expect(409);
    assert.equal(stuck.headers['retry-after'], '3');
    await supertest(customApp).post('/c').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 'c-1').set('X-Status', '418').expect(418);
    await supertest(customApp).post('/c').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 'c-2').set('X-Status', '500').expect(500);
    assert.equal(await records("key = 'c-1'"), 0);
    assert.equal(await records("key = 'c-2' AND status = 'completed' AND response_status = 500"), 1);
  });
});

describe('the transaction', () => {
  it('commits the answer of a handler that throws after answering, and reports the error', async () => {
    const seen: unknown[] = [];
    const late = await idempotency({ pool: db.pool, scope, onError: (e) => seen.push(e) });
    const lateApp = express().post('/late', late, async (req, res) => {
      await req.idempotency!.client.query("INSERT INTO effects (note) VALUES ('late')");
      res.status(201).json({ ok: true });
      throw new Error('after the answer');
    });
    lateApp.use(late.errorHandler());
    await supertest(lateApp).post('/late').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 'late').expect(201);
    for (let i = 0; i < 20 && (await records("key = 'late' AND status = 'completed'")) === 0; i++) await sleep(50);
    assert.equal(await records("key = 'late' AND status = 'completed' AND response_status = 201"), 1);
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'late'"), 1);
    assert.equal((seen[0] as Error).message, 'after the answer');
  });
  it('returns every client to the pool', async () => {
    assert.equal(db.pool.totalCount - db.pool.idleCount, 0);
  });
});

describe('the version check', () => {
  it('refuses to start without the extension, naming what it found', async () => {
    const bare = await createDatabase('express_bare', { extension: false });
    try {
      await assert.rejects(idempotency({ pool: bare.pool, scope }), (e: unknown) =>
        e instanceof ExtensionVersionError && e.found === null && /not installed/.test(e.message));
    } finally {
      await bare.drop();
    }
  });
  it('refuses to start with 0.1.0, naming the version', async () => {
    const old = await createDatabase('express_old', { version: '0.1.0' });
    try {
      await assert.rejects(idempotency({ pool: old.pool, scope }), (e: unknown) =>
        e instanceof ExtensionVersionError && e.found === '0.1.0' && /version 0\.1\.0/.test(e.message));
      await old.pool.query('ALTER EXTENSION idempotency UPDATE');
      const ok = await idempotency({ pool: old.pool, scope });
      assert.equal(ok.idempotency.extension.version, await defaultVersion(old.pool));
    } finally {
      await old.drop();
    }
  });
});
