// The Express middleware through supertest, against the real extension:
// every effect is counted in the database.

import assert from 'node:assert/strict';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import express, { type Request } from 'express';
import pg from 'pg';
import supertest from 'supertest';
import { ExtensionVersionError } from '../src/index.js';
import { idempotency, type IdempotencyMiddleware } from '../src/express.js';
import {
  createDatabase, defaultVersion, holdReservation, postAndHangUp, refusedBodies, refusedSqlStates, sleep, type TestDatabase,
} from './helpers.js';

const users: Record<string, string> = { 'token-a': 'user-a', 'token-b': 'user-b' };
const scope = (req: Request) => users[(req.headers.authorization ?? '').replace(/^Bearer /, '')];

let db: TestDatabase;
/** Called by the handler of note 'slow' once it runs. */
let slowStarted: () => void = () => {};
let idem: IdempotencyMiddleware;
let app: express.Express;
const reported: unknown[] = [];

const json = (path: string, key: string | string[] | null, body: unknown, user = 'token-a') => {
  let r = supertest(app).post(path).set('Authorization', `Bearer ${user}`);
  if (key !== null) r = r.set('Idempotency-Key', key as string);
  return r.set('Content-Type', 'application/json').send(JSON.stringify(body));
};
const effects = () => db.count('SELECT count(*) FROM effects');
const records = (where = 'true') => db.count(`SELECT count(*) FROM idem_keys WHERE ${where}`);

before(async () => {
  db = await createDatabase('express');
  idem = await idempotency({ pool: db.pool, scope, onError: (e) => reported.push(e), replayHeaders: ['content-type', 'location', 'x-request-id'] });
  app = express();
  app.post('/items', idem.route({ operation: 'create-item' }), async (req, res) => {
    const { client } = req.idempotency!;
    const note = (req.body as { note?: string }).note ?? null;
    const { rows } = await client.query('INSERT INTO effects (note) VALUES ($1) RETURNING id', [note]);
    if (note === 'fail') throw new Error('secret internal detail');
    if (note === 'conflict') await client.query("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$");
    if (note === 'deadlock') await client.query("DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$");
    if (note?.startsWith('sqlstate-')) await client.query(`DO $$ BEGIN RAISE EXCEPTION 'secret text' USING ERRCODE = '${note.slice(9, 14)}'; END $$`);
    if (note === 'unavailable') { res.status(503).json({ error: 'try later' }); return; }
    if (note === 'declined') { res.status(402).json({ error: 'declined' }); return; }
    if (note === 'teapot') { const e = Object.assign(new Error('refused'), { status: 418 }); throw e; }
    if (note === 'slow') { slowStarted(); await sleep(400); }
    res.status(201).location(`/items/${rows[0].id}`).set('X-Request-Id', 'r-1').set('X-Not-Stored', 'x').json({ id: Number(rows[0].id), note });
  });
  app.post('/subset', idem.route({ operation: 'subset', fingerprint: ['/order_id', '/amount'] }), async (req, res) => {
    await req.idempotency!.client.query('INSERT INTO effects (note) VALUES ($1)', ['subset']);
    res.status(201).json({ ok: true });
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
  app.use((error: unknown, _req: Request, res: express.Response, _next: express.NextFunction) => {
    res.status((error as { status?: number }).status ?? 500).json({ handledBy: 'app' });
  });
});
after(async () => db.drop());

describe('the key', () => {
  it('takes a quoted and a bare key as one key: the handler runs once, the second is a replay', async () => {
    const first = await json('/items', '"k-1"', { note: 'a' }).expect(201);
    assert.equal(first.headers['idempotent-replayed'], undefined);
    const second = await json('/items', 'k-1', { note: 'a' }).expect(201);
    assert.equal(second.headers['idempotent-replayed'], 'true');
    assert.deepEqual(second.body, first.body);
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'a'"), 1);
    assert.equal(await records("key = 'k-1'"), 1);
  });
  for (const [label, key] of [
    ['two fields', ['x', 'y']], ['a list', '"x", "y"'], ['a bad escape', '"a\\qb"'], ['parameters', '"x";p=1'],
    ['an unclosed string', '"abc'], ['an empty key', '""'],
  ] as [string, string | string[]][]) {
    it(`answers 400 invalid-key for ${label}, and runs nothing`, async () => {
      const before = await effects();
      const r = await json('/items', key, { note: 'bad-key' }).expect(400).expect('content-type', 'application/problem+json');
      assert.equal(r.body.code, 'invalid-key');
      assert.equal(await effects(), before);
    });
  }
  it('answers 400 missing-key without a key', async () => {
    const r = await json('/items', null, { note: 'no-key' }).expect(400);
    assert.equal(r.body.code, 'missing-key');
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'no-key'"), 0);
  });
  it('runs a route whose key is optional without idempotency', async () => {
    const r = await json('/optional', null, {}).expect(201);
    assert.deepEqual(r.body, { idempotent: false });
    assert.equal(await records("operation = 'optional'"), 0);
    assert.deepEqual((await json('/optional', 'opt-1', {}).expect(201)).body, { idempotent: true });
    assert.equal(await records("operation = 'optional'"), 1);
  });
  it('answers the extension\'s 22023 as 400 invalid-request with its message', async () => {
    const r = await json('/items', 'k'.repeat(300), { note: 'long' }).expect(400);
    assert.equal(r.body.code, 'invalid-request');
    assert.match(r.body.detail, /too long/);
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'long'"), 0);
  });
});

describe('the scope', () => {
  it('keeps user B from replaying user A\'s key: B runs its own', async () => {
    const a = await json('/items', 'shared', { note: 'scoped' }, 'token-a').expect(201);
    const b = await json('/items', 'shared', { note: 'scoped' }, 'token-b').expect(201);
    assert.equal(b.headers['idempotent-replayed'], undefined);
    assert.notEqual(a.body.id, b.body.id);
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'scoped'"), 2);
    assert.equal(await records("key = 'shared' AND scope IN ('user-a', 'user-b')"), 2);
  });
  it('answers 401 unauthenticated without a principal', async () => {
    const r = await json('/items', 'anon', { note: 'anon' }, 'nobody').expect(401);
    assert.equal(r.body.code, 'unauthenticated');
    assert.equal(await records("key = 'anon'"), 0);
  });
  it('refuses to start without a scope function', async () => {
    await assert.rejects(idempotency({ pool: db.pool } as never), TypeError);
  });
});

describe('the fingerprint', () => {
  it('a subset: other members do not count, a named one does', async () => {
    await json('/subset', 's-1', { order_id: 'o', amount: 1, note: 'x' }).expect(201);
    const same = await json('/subset', 's-1', { amount: 1.0, note: 'y', order_id: 'o' }).expect(201);
    assert.equal(same.headers['idempotent-replayed'], 'true');
    const other = await json('/subset', 's-1', { order_id: 'o', amount: 2 }).expect(422);
    assert.equal(other.body.code, 'mismatch');
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'subset'"), 1);
  });
  it('a subset on a body that is not JSON is 400 invalid-request', async () => {
    const r = await supertest(app).post('/subset').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 's-2')
      .set('Content-Type', 'text/plain').send('hello').expect(400);
    assert.equal(r.body.code, 'invalid-request');
  });
  it('256 levels of nesting are JSON; a body nested deeper is hashed as its bytes, and refused after express.json()', async () => {
    const nested = (levels: number) => `{"note": "deep", "x": ${'['.repeat(levels - 1)}${']'.repeat(levels - 1)}}`;
    const raw = (path: string, key: string, body: string) => supertest(app).post(path).set('Authorization', 'Bearer token-a')
      .set('Idempotency-Key', key).set('Content-Type', 'application/json').send(body);
    const hashed = (key: string, doc: string) => records(`key = '${key}' AND request_hash = idem_hash('${doc}'::jsonb)`);
    await raw('/items', 'deep-256', nested(256)).expect(201);
    assert.equal(await hashed('deep-256', `{"method": "POST", "path": "/items", "body": ${nested(256)}}`), 1);
    await raw('/items', 'deep-257', nested(257)).expect(201);
    assert.equal(await hashed('deep-257', `{"method": "POST", "path": "/items", "body_base64": "${Buffer.from(nested(257)).toString('base64')}"}`), 1);
    // the handler gets both parsed
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'deep'"), 2);
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

describe('requests the server refuses: 400 invalid-request with its message, nothing reserved', () => {
  const raw = (path: string, key: string, body: string) => supertest(app).post(path).set('Authorization', 'Bearer token-a')
    .set('Idempotency-Key', key).set('Content-Type', 'application/json').send(body);
  refusedBodies.forEach(([label, body, message], i) => {
    it(label, async () => {
      const r = await raw('/items', `refused-${i}`, body).expect(400).expect('content-type', 'application/problem+json');
      assert.equal(r.body.code, 'invalid-request');
      assert.match(r.body.detail, message);
      assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'refused'"), 0);
      assert.equal(await records(`key = 'refused-${i}'`), 0);
    });
  });
  it('a number beyond a double in a subset, or after express.json(): refused here, not written as null', async () => {
    const before = await effects();
    for (const [path, key] of [['/subset', 'refused-subset'], ['/parsed', 'refused-parsed']] as const) {
      const r = await raw(path, key, '{"order_id": "o", "amount": 1e400}').expect(400);
      assert.equal(r.body.code, 'invalid-request');
      assert.match(r.body.detail, /beyond the range of a double/);
      assert.equal(await records(`key = '${key}'`), 0);
    }
    assert.equal(await effects(), before);
  });
  for (const state of refusedSqlStates) {
    it(`${state} from the handler's own SQL too, rolled back`, async () => {
      const r = await json('/items', `refused-${state}`, { note: `sqlstate-${state}` }).expect(400);
      assert.equal(r.body.code, 'invalid-request');
      assert.equal(r.body.detail, 'secret text');
      assert.equal(await db.count('SELECT count(*) FROM effects WHERE note = $1', [`sqlstate-${state}`]), 0);
      assert.equal(await records(`key = 'refused-${state}'`), 0);
    });
  }
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
  it('answers 500 unsupported-envelope for a later envelope version', async () => {
    await json('/items', 'e-3', { note: 'v2' }).expect(201);
    await db.pool.query("UPDATE idem_keys SET response = '{\"v\": 2}' WHERE key = 'e-3'");
    assert.equal((await json('/items', 'e-3', { note: 'v2' }).expect(500)).body.code, 'unsupported-envelope');
  });
});

describe('the mapping', () => {
  it('in_progress is 409 in-progress with Retry-After', async () => {
    await holdReservation(db.pool, 'create-item', 'busy', 'user-a', '{"method":"POST","path":"/items","body":{"note":"busy"}}');
    const r = await json('/items', 'busy', { note: 'busy' }).expect(409).expect('retry-after', '1');
    assert.equal(r.body.code, 'in-progress');
    assert.equal(r.body.detail, 'A request with this Idempotency-Key is still being processed.');
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'busy'"), 0);
  });
  it('stuck is 409 stuck with Retry-After', async () => {
    await holdReservation(db.pool, 'create-item', 'stuck', 'user-a', '{"method":"POST","path":"/items","body":{"note":"stuck"}}');
    await db.pool.query("UPDATE idem_keys SET status = 'stuck' WHERE key = 'stuck'");
    const r = await json('/items', 'stuck', { note: 'stuck' }).expect(409).expect('retry-after', '1');
    assert.equal(r.body.code, 'stuck');
  });
  it('mismatch is 422', async () => {
    await json('/items', 'm-1', { note: 'm' }).expect(201);
    assert.equal((await json('/items', 'm-1', { note: 'other' }).expect(422)).body.code, 'mismatch');
  });
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
  for (const note of ['conflict', 'deadlock']) {
    it(`${note === 'conflict' ? '40001' : '40P01'} from the handler's SQL is 503 retry, rolled back`, async () => {
      const r = await json('/items', `x-${note}`, { note }).expect(503).expect('retry-after', '1');
      assert.equal(r.body.code, 'retry');
      assert.equal(await db.count('SELECT count(*) FROM effects WHERE note = $1', [note]), 0);
      assert.equal(await records(`key = 'x-${note}'`), 0);
    });
  }
  it('a handler error rolls back: 500 internal-error without its text, no effect, no record, and the retry runs again', async () => {
    const r = await json('/items', 'boom', { note: 'fail' }).expect(500);
    assert.equal(r.body.code, 'internal-error');
    assert.doesNotMatch(JSON.stringify(r.body), /secret/);
    assert.ok(reported.some((e) => (e as Error).message === 'secret internal detail'), 'the error is reported to onError');
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'fail'"), 0);
    assert.equal(await records("key = 'boom'"), 0);
    await json('/items', 'boom', { note: 'fail' }).expect(500);
  });
  it('an error with its own 4xx goes to the app\'s error handler, rolled back', async () => {
    const r = await json('/items', 'tea', { note: 'teapot' }).expect(418);
    assert.deepEqual(r.body, { handledBy: 'app' });
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'teapot'"), 0);
    assert.equal(await records("key = 'tea'"), 0);
  });
  it('a retryable status rolls back, and the retry is new', async () => {
    await json('/items', 'r-1', { note: 'unavailable' }).expect(503);
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'unavailable'"), 0);
    assert.equal(await records("key = 'r-1'"), 0);
    const again = await json('/items', 'r-1', { note: 'unavailable' }).expect(503);
    assert.equal(again.headers['idempotent-replayed'], undefined);
  });
  it('a final failure (402) is completed and replayed', async () => {
    await json('/items', 'd-1', { note: 'declined' }).expect(402);
    const again = await json('/items', 'd-1', { note: 'declined' }).expect(402);
    assert.equal(again.headers['idempotent-replayed'], 'true');
    assert.deepEqual(again.body, { error: 'declined' });
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'declined'"), 1);
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
  it('answers a body over bodyLimit with 413 payload-too-large, reserving nothing', async () => {
    const small = await idempotency({ pool: db.pool, scope, bodyLimit: 8 });
    const smallApp = express().post('/s', small, (_req, res) => { res.status(201).end(); });
    const r = await supertest(smallApp).post('/s').set('Authorization', 'Bearer token-a').set('Idempotency-Key', 'big')
      .set('Content-Type', 'application/json').send('{"a": "0123456789"}').expect(413);
    assert.equal(r.body.code, 'payload-too-large');
    assert.equal(await records("key = 'big'"), 0);
  });
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
  it('commits when the client goes away before the answer, so its retry replays', async () => {
    const server = app.listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    const { port } = server.address() as AddressInfo;
    const body = JSON.stringify({ note: 'slow' });
    const started = new Promise<void>((r) => { slowStarted = r; });
    await postAndHangUp(port, 'gone', body, started);
    for (let i = 0; i < 50 && (await records("key = 'gone' AND status = 'completed'")) === 0; i++) await sleep(100);
    server.close();
    assert.equal(await records("key = 'gone' AND status = 'completed'"), 1);
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'slow'"), 1);
    assert.equal((await json('/items', 'gone', { note: 'slow' }).expect(201)).headers['idempotent-replayed'], 'true');
    assert.equal(await db.count("SELECT count(*) FROM effects WHERE note = 'slow'"), 1);
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
