// One behaviour suite for both integrations: the same cases drive an
// Express app (through supertest, and through a real node server) and a
// Fastify app (through inject, and through a real node server), built from
// one handler. Every effect is counted in the database; the handler inserts
// one row per run, with the request's key as its note. What only one
// integration has (Express's body parsed before the middleware, Fastify's
// decorators, each one's start-up) is in express.test.ts and fastify.test.ts.

import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import express, { type Request } from 'express';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import pg from 'pg';
import supertest from 'supertest';
import { idempotency } from '../src/express.js';
import fastifyIdempotency from '../src/fastify.js';
import type { IdempotencyOptions } from '../src/index.js';
import {
  createDatabase, holdReservation, postAndHangUp, refusedBodies, refusedSqlStates, sleep, type TestDatabase,
} from './helpers.js';

/** An error that resolves to 402, as http-errors' PaymentRequired does. */
class CardDeclined extends Error {
  readonly status = 402;
  readonly statusCode = 402;
  constructor() {
    super('card declined');
    this.name = 'CardDeclined';
  }
}
/** The same error, marked final by the apps' `finalErrors`. */
class FinalCardDeclined extends CardDeclined {}

/** What the handler answers: a status, headers set with the framework's own calls, a JSON body. */
interface Answer {
  status: number;
  headers: [string, string][];
  body: unknown;
}

/** Called by the handler of note 'slow' once it runs. */
let slowStarted: () => void = () => {};

/** The one handler both apps run, by the body's `note`; it inserts a row first. */
async function act(client: pg.PoolClient, key: string, body: { note?: string; text?: string } | undefined): Promise<Answer> {
  const { rows } = await client.query<{ id: string }>('INSERT INTO effects (note) VALUES ($1) RETURNING id', [key]);
  const id = Number(rows[0]!.id);
  const json = 'application/json; charset=utf-8';
  const note = body?.note;
  if (note === 'conflict') await client.query("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$");
  if (note === 'deadlock') await client.query("DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$");
  if (note?.startsWith('sqlstate-')) await client.query(`DO $$ BEGIN RAISE EXCEPTION 'secret text' USING ERRCODE = '${note.slice(9, 14)}'; END $$`);
  switch (note) {
    case 'fail': throw new Error('secret internal detail');
    case 'teapot': throw Object.assign(new Error('short and stout'), { status: 418, statusCode: 418 });
    case 'raise-402': throw new CardDeclined();
    case 'raise-402-final': throw new FinalCardDeclined();
    case 'unavailable': return { status: 503, headers: [], body: { error: 'try later' } };
    case 'declined': return { status: 402, headers: [], body: { error: 'declined' } };
    case 'location-from-client': return { status: 201, headers: [['location', `/items/${body?.text}`]], body: { ok: true } };
    case 'latin1-location': return { status: 201, headers: [['location', '/items/caf\u00e9']], body: { ok: true } };
    case 'euro-content-type': return { status: 200, headers: [['content-type', 'text/plain; charset=\u20ac']], body: 'text' };
    case 'nul-header': return { status: 201, headers: [['x-trace', 'a\u0000b']], body: { ok: true } };
    case 'bad-header-name': return { status: 201, headers: [['x trace', 'a']], body: { ok: true } };
    case 'nul-body': return { status: 201, headers: [['content-type', json]], body: { s: 'a\u0000b' } };
    case 'surrogate-body': return { status: 201, headers: [['content-type', json]], body: { s: 'a\ud800b' } };
    case 'lose-connection': {
      // the connection is lost between two queries, as in a server restart
      const { rows: [backend] } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      await db.pool.query('SELECT pg_terminate_backend($1)', [backend!.pid]);
      await sleep(200);
      await client.query('SELECT 1');
      return { status: 201, headers: [], body: { ok: true } };
    }
    case 'big-body': return { status: 201, headers: [['content-type', json]], body: { s: 'x'.repeat(500) } };
    case 'hang-sql':
      await client.query('SELECT pg_sleep(5)');
      break;
    case 'slow':
      slowStarted();
      await sleep(400);
      break;
    default:
  }
  return { status: 201, headers: [['location', `/items/${id}`], ['x-not-stored', 'x'], ['content-type', json]], body: { id, note: note ?? null } };
}

const users: Record<string, string> = {
  'token-a': 'user-a', 'token-b': 'user-b', 'token-empty': '', 'token-nul': 'user\u0000a', 'token-long': 'u'.repeat(256),
};
/** The principal of a request; the token 'token-throws' makes the scope function throw. */
const principal = (authorization: string | undefined) => {
  const token = (authorization ?? '').replace(/^Bearer /, '');
  if (token === 'token-throws') throw new Error('secret failure of the scope function');
  return users[token];
};
/** Stored and replayed: the framing headers are here to show they are never replayed all the same. */
const replayHeaders = ['content-type', 'location', 'x-allowed', 'content-length', 'transfer-encoding', 'connection', 'keep-alive', 'te', 'trailer', 'upgrade', 'proxy-connection'];
/** Settings of one app over the shared ones (another pool, a body limit). */
type Overrides = Partial<Pick<IdempotencyOptions, 'pool' | 'bodyLimit' | 'timeLimit' | 'acquireTimeout' | 'responseLimit'>>;
/** The settings both apps are created with. */
const settings = <Req>(scope: (req: Req) => string | undefined, overrides: Overrides): IdempotencyOptions<Req> =>
  ({ pool: db.pool, scope, replayHeaders, finalErrors: [FinalCardDeclined], onError: (error) => reported.push(error), ...overrides });
/** What the apps' onError was given. */
const reported: unknown[] = [];
/** The routes of both apps: the operation, and the fingerprint subset. */
const routes = { '/items': { operation: 'create-item' }, '/subset': { operation: 'subset', fingerprint: ['/order_id', '/amount'] } };

async function expressApp(overrides: Overrides): Promise<express.Express> {
  const idem = await idempotency(settings<Request>((req) => principal(req.headers.authorization), overrides));
  const app = express();
  for (const [path, options] of Object.entries(routes)) {
    app.post(path, idem.route(options), async (req, res) => {
      const answer = await act(req.idempotency!.client, req.idempotency!.key, req.body as { note?: string });
      res.status(answer.status);
      for (const [name, value] of answer.headers) res.setHeader(name, value);
      if (typeof answer.body === 'string') res.send(answer.body);
      else res.json(answer.body);
    });
  }
  app.use(idem.errorHandler());
  // the application's own error handler resolves the status of an error
  app.use((error: { status?: number; message: string }, _req: Request, res: express.Response, _next: express.NextFunction) => {
    res.status(error.status ?? 500).json({ error: error.message });
  });
  return app;
}

async function fastifyApp(overrides: Overrides): Promise<FastifyInstance> {
  const app = Fastify();
  app.addContentTypeParser('application/octet-stream', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
  await app.register(fastifyIdempotency, settings<FastifyRequest>((request) => principal(request.headers.authorization), overrides));
  // Fastify's own error handler resolves the status of an error (statusCode)
  for (const [path, options] of Object.entries(routes)) {
    app.post(path, { config: { idempotency: options } }, async (request, reply) => {
      const answer = await act(request.idempotency!.client, request.idempotency!.key, request.body as { note?: string });
      reply.code(answer.status);
      for (const [name, value] of answer.headers) reply.header(name, value);
      return reply.send(answer.body);
    });
  }
  await app.ready();
  return app;
}

/** A response as every driver reports it. */
interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

/** A request: the key (null for none, a list for several fields), the body (an object is sent as JSON), and the rest. */
interface Post {
  key: string | string[] | null;
  body: unknown;
  token?: string;
  path?: string;
  contentType?: string;
}

interface Driver {
  name: string;
  /** The port of a real server; undefined for a test client. */
  port?: number;
  post(request: Post): Promise<Reply>;
  close(): Promise<void>;
}

const payloadOf = (body: unknown): string | Buffer => (typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body));
const headersOf = ({ key, token = 'token-a', contentType = 'application/json' }: Post) => {
  const headers: Record<string, string | string[]> = { authorization: `Bearer ${token}`, 'content-type': contentType };
  if (key !== null) headers['idempotency-key'] = key;
  return headers;
};

/** POSTs to a real server with node's http client, which reads what the server wrote. */
function postOverSocket(port: number, request: Post): Promise<Reply> {
  return new Promise((resolve) => {
    const payload = payloadOf(request.body);
    const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: request.path ?? '/items',
      headers: { ...headersOf(request), 'content-length': Buffer.byteLength(payload) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString() }));
      res.on('error', () => resolve({ status: 0, headers: {}, text: 'the response broke off' }));
    });
    req.on('error', (error) => resolve({ status: 0, headers: {}, text: `no response: ${error.message}` }));
    req.end(payload);
  });
}

/** Each app through its framework's test client and on a real server (which a client can hang up on). */
const drivers: { name: string; realServer: boolean; start(overrides?: Overrides): Promise<Driver> }[] = [
  {
    name: 'Express through supertest',
    realServer: false,
    async start(overrides = {}) {
      const app = await expressApp(overrides);
      return {
        name: this.name,
        async post(request) {
          let r = supertest(app).post(request.path ?? '/items');
          for (const [name, value] of Object.entries(headersOf(request))) r = r.set(name, value as string);
          const response = await r.send(payloadOf(request.body) as string)
            .buffer(true).parse((res, cb) => { let t = ''; res.setEncoding('utf8'); res.on('data', (c: string) => { t += c; }); res.on('end', () => cb(null, t)); });
          return { status: response.status, headers: response.headers, text: response.body as string };
        },
        async close() {},
      };
    },
  },
  {
    name: 'Express on a node server',
    realServer: true,
    async start(overrides = {}) {
      const server = (await expressApp(overrides)).listen(0, '127.0.0.1');
      await new Promise((resolve) => server.once('listening', resolve));
      const { port } = server.address() as AddressInfo;
      return {
        name: this.name,
        port,
        post: (request) => postOverSocket(port, request),
        close: () => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()); }),
      };
    },
  },
  {
    name: 'Fastify through inject',
    realServer: false,
    async start(overrides = {}) {
      const app = await fastifyApp(overrides);
      return {
        name: this.name,
        async post(request) {
          const r = await app.inject({ method: 'POST', url: request.path ?? '/items', headers: headersOf(request), payload: payloadOf(request.body) });
          return { status: r.statusCode, headers: r.headers as Reply['headers'], text: r.body };
        },
        close: () => app.close(),
      };
    },
  },
  {
    name: 'Fastify on a node server',
    realServer: true,
    async start(overrides = {}) {
      const app = await fastifyApp(overrides);
      const port = Number(new URL(await app.listen({ port: 0, host: '127.0.0.1' })).port);
      return { name: this.name, port, post: (request) => postOverSocket(port, request), close: () => app.close() };
    },
  },
];

let db: TestDatabase;
before(async () => {
  db = await createDatabase('behaviour');
});
after(async () => db.drop());

const effects = (key: string) => db.count('SELECT count(*) FROM effects WHERE note = $1', [key]);
const records = (key: string) => db.count('SELECT count(*) FROM idem_keys WHERE key = $1', [key]);
const allEffects = () => db.count('SELECT count(*) FROM effects');
const problem = (reply: Reply) => (reply.headers['content-type'] === 'application/problem+json' ? JSON.parse(reply.text) as { code: string } : null);

drivers.forEach((spec, n) => describe(spec.name, () => {
  let driver: Driver;
  /** A key of this driver's own. */
  const k = (label: string) => `d${n}-${label}`;
  before(async () => {
    driver = await spec.start();
  });
  after(async () => driver.close());

  describe('the key', () => {
    it('takes a quoted and a bare key as one key: the handler runs once, the retry replays status, body and Location', async () => {
      const key = k('k-1');
      const first = await driver.post({ key: `"${key}"`, body: { note: 'a' } });
      assert.equal(first.status, 201);
      assert.equal(first.headers['idempotent-replayed'], undefined);
      const again = await driver.post({ key, body: { note: 'a' } });
      assert.equal(again.status, 201);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.equal(again.headers.location, first.headers.location);
      assert.equal(again.headers['x-not-stored'], undefined);
      assert.deepEqual(JSON.parse(again.text), JSON.parse(first.text));
      assert.equal(await effects(key), 1);
      assert.equal(await records(key), 1);
    });
    for (const [label, key] of [
      ['two fields', ['x', 'y']], ['a list', '"x", "y"'], ['a bare list', 'x, y'], ['a bad escape', '"a\\qb"'],
      ['parameters', '"x";p=1'], ['an unclosed string', '"abc'], ['an empty key', '""'],
    ] as [string, string | string[]][]) {
      it(`answers 400 invalid-key for ${label}, and runs nothing`, async () => {
        const before = await allEffects();
        const r = await driver.post({ key, body: { note: 'bad-key' } });
        assert.equal(r.status, 400);
        assert.equal(problem(r)?.code, 'invalid-key');
        assert.equal(await allEffects(), before);
      });
    }
    it('answers 400 missing-key without a key, and runs nothing', async () => {
      const before = await allEffects();
      const r = await driver.post({ key: null, body: { note: 'no-key' } });
      assert.equal(r.status, 400);
      assert.equal(problem(r)?.code, 'missing-key');
      assert.equal(await allEffects(), before);
    });
    it('answers the extension\'s 22023 (a key over 255 bytes) as 400 invalid-request with its message', async () => {
      const r = await driver.post({ key: k('x').padEnd(300, 'k'), body: { note: 'long' } });
      assert.equal(r.status, 400);
      assert.equal(problem(r)?.code, 'invalid-request');
      assert.match(JSON.parse(r.text).detail, /too long/);
    });
  });

  describe('the scope', () => {
    it('keeps user B from replaying user A\'s key: B runs its own', async () => {
      const key = k('shared');
      const a = await driver.post({ key, body: { note: 'scoped' }, token: 'token-a' });
      const b = await driver.post({ key, body: { note: 'scoped' }, token: 'token-b' });
      assert.equal(b.status, 201);
      assert.equal(b.headers['idempotent-replayed'], undefined);
      assert.notEqual(JSON.parse(a.text).id, JSON.parse(b.text).id);
      assert.equal(await effects(key), 2);
      assert.equal(await db.count("SELECT count(*) FROM idem_keys WHERE key = $1 AND scope IN ('user-a', 'user-b')", [key]), 2);
    });
  });

  describe('the fingerprint', () => {
    it('with a subset: other members do not count, a named one does', async () => {
      const key = k('subset');
      assert.equal((await driver.post({ key, path: '/subset', body: { order_id: 'o', amount: 1, note: 'x' } })).status, 201);
      const same = await driver.post({ key, path: '/subset', body: { amount: 1.0, note: 'y', order_id: 'o' } });
      assert.equal(same.headers['idempotent-replayed'], 'true');
      const other = await driver.post({ key, path: '/subset', body: { order_id: 'o', amount: 2 } });
      assert.equal(other.status, 422);
      assert.equal(problem(other)?.code, 'mismatch');
      assert.equal(await effects(key), 1);
    });
    it('a subset on a body that is not JSON is 400 invalid-request', async () => {
      const r = await driver.post({ key: k('subset-raw'), path: '/subset', body: Buffer.from('raw'), contentType: 'application/octet-stream' });
      assert.equal(r.status, 400);
      assert.equal(problem(r)?.code, 'invalid-request');
      assert.equal(await records(k('subset-raw')), 0);
    });
    it('refuses a number beyond a double in a subset member, rather than write it as null', async () => {
      const r = await driver.post({ key: k('subset-1e400'), path: '/subset', body: '{"order_id": 1e400}' });
      assert.equal(r.status, 400);
      assert.equal(problem(r)?.code, 'invalid-request');
      assert.match(JSON.parse(r.text).detail, /beyond the range of a double/);
      assert.equal(await records(k('subset-1e400')), 0);
    });
    it('takes 256 levels of nesting as JSON and hashes a body nested deeper as its bytes', async () => {
      const nested = (levels: number) => `{"note": "deep", "x": ${'['.repeat(levels - 1)}${']'.repeat(levels - 1)}}`;
      const hashed = (key: string, doc: string) => db.count('SELECT count(*) FROM idem_keys WHERE key = $1 AND request_hash = idem_hash($2::jsonb)', [key, doc]);
      assert.equal((await driver.post({ key: k('deep-256'), body: nested(256) })).status, 201);
      assert.equal(await hashed(k('deep-256'), `{"method": "POST", "path": "/items", "body": ${nested(256)}}`), 1);
      assert.equal((await driver.post({ key: k('deep-257'), body: nested(257) })).status, 201);
      assert.equal(await hashed(k('deep-257'), `{"method": "POST", "path": "/items", "body_base64": "${Buffer.from(nested(257)).toString('base64')}"}`), 1);
    });
    refusedBodies.forEach(([label, body, message], i) => {
      it(`answers a request the server refuses with 400 invalid-request, reserving nothing: ${label}`, async () => {
        const key = k(`refused-${i}`);
        const r = await driver.post({ key, body });
        assert.equal(r.status, 400);
        assert.equal(problem(r)?.code, 'invalid-request');
        assert.match(JSON.parse(r.text).detail, message);
        assert.equal(await effects(key), 0);
        assert.equal(await records(key), 0);
      });
    });
  });

  describe('the mapping', () => {
    it('in_progress and stuck are 409 with Retry-After; another request under the key is 422 mismatch', async () => {
      const key = k('busy');
      await holdReservation(db.pool, 'create-item', key, 'user-a', '{"method":"POST","path":"/items","body":{"note":"busy"}}');
      const busy = await driver.post({ key, body: { note: 'busy' } });
      assert.equal(busy.status, 409);
      assert.equal(busy.headers['retry-after'], '1');
      assert.equal(problem(busy)?.code, 'in-progress');
      assert.equal(JSON.parse(busy.text).detail, 'A request with this Idempotency-Key is still being processed.');
      await db.pool.query("UPDATE idem_keys SET status = 'stuck' WHERE key = $1", [key]);
      const stuck = await driver.post({ key, body: { note: 'busy' } });
      assert.equal(stuck.status, 409);
      assert.equal(stuck.headers['retry-after'], '1');
      assert.equal(problem(stuck)?.code, 'stuck');
      const other = await driver.post({ key, body: { note: 'other' } });
      assert.equal(other.status, 422);
      assert.equal(problem(other)?.code, 'mismatch');
      assert.equal(await effects(key), 0);
    });
    for (const [note, state] of [['conflict', '40001'], ['deadlock', '40P01']]) {
      it(`${state} from the handler's SQL is 503 retry with Retry-After, rolled back`, async () => {
        const key = k(note!);
        const r = await driver.post({ key, body: { note } });
        assert.equal(r.status, 503);
        assert.equal(r.headers['retry-after'], '1');
        assert.equal(problem(r)?.code, 'retry');
        assert.equal(await effects(key), 0);
        assert.equal(await records(key), 0);
      });
    }
    for (const state of refusedSqlStates) {
      it(`${state} from the handler's own SQL is 400 invalid-request with the server's message, rolled back`, async () => {
        const key = k(`sqlstate-${state}`);
        const r = await driver.post({ key, body: { note: `sqlstate-${state}` } });
        assert.equal(r.status, 400);
        assert.equal(problem(r)?.code, 'invalid-request');
        assert.equal(JSON.parse(r.text).detail, 'secret text');
        assert.equal(await effects(key), 0);
        assert.equal(await records(key), 0);
      });
    }
    it('a handler error rolls back: 500 internal-error without its text, reported, and the retry runs again', async () => {
      const key = k('fail');
      reported.length = 0;
      for (let attempt = 1; attempt <= 2; attempt++) {
        const r = await driver.post({ key, body: { note: 'fail' } });
        assert.equal(r.status, 500);
        assert.equal(problem(r)?.code, 'internal-error');
        assert.doesNotMatch(r.text, /secret/);
        assert.equal(await effects(key), 0);
        assert.equal(await records(key), 0);
      }
      assert.ok(reported.some((e) => (e as Error).message === 'secret internal detail'), 'the error is reported to onError');
    });
    it('an error with its own 4xx is answered by the framework\'s error handler, rolled back', async () => {
      const key = k('teapot');
      const r = await driver.post({ key, body: { note: 'teapot' } });
      assert.equal(r.status, 418);
      assert.match(r.text, /short and stout/);
      assert.equal(await effects(key), 0);
      assert.equal(await records(key), 0);
    });
    it('a returned retryable status rolls back, and the retry runs again', async () => {
      const key = k('unavailable');
      for (let attempt = 1; attempt <= 2; attempt++) {
        const r = await driver.post({ key, body: { note: 'unavailable' } });
        assert.equal(r.status, 503);
        assert.equal(r.headers['idempotent-replayed'], undefined);
        assert.equal(await effects(key), 0);
        assert.equal(await records(key), 0);
      }
    });
    it('a returned final failure (402) is completed and replayed', async () => {
      const key = k('declined');
      assert.equal((await driver.post({ key, body: { note: 'declined' } })).status, 402);
      const again = await driver.post({ key, body: { note: 'declined' } });
      assert.equal(again.status, 402);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.deepEqual(JSON.parse(again.text), { error: 'declined' });
      assert.equal(await effects(key), 1);
    });
  });

  describe('the transaction', () => {
    it('answers a body over bodyLimit with 413 payload-too-large, reserving nothing', async () => {
      const small = await spec.start({ bodyLimit: 8 });
      try {
        const r = await small.post({ key: k('big'), body: { a: '0123456789' } });
        assert.equal(r.status, 413);
        assert.equal(problem(r)?.code, 'payload-too-large');
        assert.equal(await records(k('big')), 0);
      } finally {
        await small.close();
      }
    });
    it('a response over responseLimit is rolled back: 500 internal-error, no row, no record, and the retry runs again', async () => {
      const limited = await spec.start({ responseLimit: 400 });
      const key = k('big-body');
      try {
        for (let attempt = 1; attempt <= 2; attempt++) {
          const r = await limited.post({ key, body: { note: 'big-body' } });
          assert.equal(r.status, 500, r.text);
          assert.equal(problem(r)?.code, 'internal-error');
          assert.equal(await effects(key), 0);
          assert.equal(await records(key), 0);
        }
        assert.equal((await limited.post({ key: k('small-body'), body: { note: 'ok' } })).status, 201);
      } finally {
        await limited.close();
      }
    });
    it('a handler past the time limit is 503 time-limit with Retry-After at once, rolled back, and its key freed', async () => {
      const limited = await spec.start({ timeLimit: 300 });
      const key = k('hang');
      try {
        const start = Date.now();
        const r = await limited.post({ key, body: { note: 'hang-sql' } });
        assert.ok(Date.now() - start < 2000, `answered after ${Date.now() - start} ms`);
        assert.equal(r.status, 503, r.text);
        assert.equal(problem(r)?.code, 'time-limit');
        assert.equal(r.headers['retry-after'], '1');
        // the statement is cancelled within the limit again: then the key is free
        let retry = await limited.post({ key, body: { note: 'ok' } });
        for (let i = 0; i < 20 && retry.status === 409; i++) {
          await sleep(100);
          retry = await limited.post({ key, body: { note: 'ok' } });
        }
        assert.ok(Date.now() - start < 3000, `the key was free after ${Date.now() - start} ms`);
        assert.equal(retry.status, 201, retry.text);
        assert.equal(await effects(key), 1);
      } finally {
        await limited.close();
      }
    });
    if (spec.realServer) it('commits when the client goes away before the answer, so its retry replays', async () => {
      assert.ok(driver.port !== undefined);
      const key = k('gone');
      const started = new Promise<void>((resolve) => { slowStarted = resolve; });
      await postAndHangUp(driver.port, key, JSON.stringify({ note: 'slow' }), started);
      for (let i = 0; i < 50 && (await db.count("SELECT count(*) FROM idem_keys WHERE key = $1 AND status = 'completed'", [key])) === 0; i++) await sleep(100);
      assert.equal(await db.count("SELECT count(*) FROM idem_keys WHERE key = $1 AND status = 'completed'", [key]), 1);
      assert.equal(await effects(key), 1);
      assert.equal((await driver.post({ key, body: { note: 'slow' } })).headers['idempotent-replayed'], 'true');
      assert.equal(await effects(key), 1);
    });
  });

  describe('one answer per bad input', () => {
    for (const [label, token, status, code] of [
      ['an empty principal', 'token-empty', 401, 'unauthenticated'],
      ['no principal', 'token-unknown', 401, 'unauthenticated'],
      ['a NUL in the principal', 'token-nul', 400, 'invalid-request'],
      ['a principal over 255 bytes', 'token-long', 400, 'invalid-request'],
      ['a scope function that throws', 'token-throws', 500, 'internal-error'],
    ] as [string, string, number, string][]) {
      it(`answers ${label} with ${status} ${code}, as problem+json without a stack trace, reserving nothing`, async () => {
        const key = k(`principal-${token}`);
        const r = await driver.post({ key, body: { note: 'ok' }, token });
        assert.equal(r.status, status, r.text);
        assert.equal(problem(r)?.code, code);
        assert.doesNotMatch(r.text, /secret|at .*\.js|\/test\//);
        assert.equal(await effects(key), 0);
        assert.equal(await records(key), 0);
      });
    }
  });

  describe('a raised error', () => {
    it('that resolves to 402 is rolled back: the client gets 402, no row, no record, and the retry runs again', async () => {
      const key = k('raise-402');
      const first = await driver.post({ key: key, body: { note: 'raise-402' } });
      assert.equal(first.status, 402);
      assert.match(first.text, /card declined/);
      assert.equal(await effects(key), 0);
      assert.equal(await records(key), 0);
      const again = await driver.post({ key: key, body: { note: 'raise-402' } });
      assert.equal(again.status, 402);
      assert.equal(again.headers['idempotent-replayed'], undefined);
      assert.equal(await effects(key), 0);
      assert.equal(await records(key), 0);
    });
    it('marked final is completed with its resolved status and body: one row, a record, the retry replays it', async () => {
      const key = k('raise-402-final');
      const first = await driver.post({ key: key, body: { note: 'raise-402-final' } });
      assert.equal(first.status, 402);
      assert.match(first.text, /card declined/);
      assert.equal(await effects(key), 1);
      assert.equal(await db.count("SELECT count(*) FROM idem_keys WHERE key = $1 AND status = 'completed' AND response_status = 402", [key]), 1);
      const again = await driver.post({ key: key, body: { note: 'raise-402-final' } });
      assert.equal(again.status, 402);
      assert.equal(again.headers['idempotent-replayed'], 'true');
      assert.deepEqual(JSON.parse(again.text), JSON.parse(first.text));
      assert.equal(await effects(key), 1);
    });
  });

  describe('only what can be sent is committed', () => {
    for (const [label, body] of [
      ['CR/LF in a Location built from client text', { note: 'location-from-client', text: 'x\r\nSet-Cookie: sid=evil' }],
      ['a character above 0x7E (é) in Location', { note: 'latin1-location' }],
      ['€ in Content-Type', { note: 'euro-content-type' }],
      ['a NUL in a header value', { note: 'nul-header' }],
      ['a header name that is not a token', { note: 'bad-header-name' }],
      ['\\u0000 in a JSON body', { note: 'nul-body' }],
      ['a lone surrogate in a JSON body', { note: 'surrogate-body' }],
    ] as [string, { note: string }][]) {
      it(`rolls back ${label}: 500 internal-error, no row, no record, and the retry runs again`, async () => {
        const key = k(body.note);
        for (let attempt = 1; attempt <= 2; attempt++) {
          const r = await driver.post({ key, body });
          assert.equal(r.status, 500, r.text);
          assert.equal(problem(r)?.code, 'internal-error');
          assert.equal(r.headers['set-cookie'], undefined);
          assert.equal(await effects(key), 0);
          assert.equal(await records(key), 0);
        }
      });
    }
  });

  describe('replay', () => {
    /** Completes a request under key, then rewrites its stored response. */
    const stored = async (key: string, response: string) => {
      const first = await driver.post({ key: key, body: { note: 'ok' } });
      assert.equal(first.status, 201);
      await db.pool.query('UPDATE idem_keys SET response = $2::jsonb WHERE key = $1', [key, response]);
    };
    it('sends only the headers on the allow-list now: no set-cookie unless listed, never a framing header', async () => {
      const key = k('replay-headers');
      await stored(key, JSON.stringify({ v: 1, headers: {
        'content-type': 'application/json', location: '/items/7', 'x-allowed': 'yes', 'x-not-listed': 'no', 'set-cookie': 'sid=stolen',
        'content-length': '999', 'transfer-encoding': 'chunked', connection: 'x-stored', 'keep-alive': 'timeout=99', trailer: 'x', upgrade: 'h2c',
      }, body: { replayed: true } }));
      const r = await driver.post({ key: key, body: { note: 'ok' } });
      assert.equal(r.status, 201);
      assert.equal(r.headers['idempotent-replayed'], 'true');
      assert.equal(r.headers.location, '/items/7');
      assert.equal(r.headers['x-allowed'], 'yes');
      for (const name of ['x-not-listed', 'set-cookie', 'transfer-encoding', 'trailer', 'upgrade']) {
        assert.equal(r.headers[name], undefined, name);
      }
      // a node server writes these two itself; never the stored ones
      assert.notEqual(r.headers.connection, 'x-stored');
      assert.notEqual(r.headers['keep-alive'], 'timeout=99');
      assert.equal(r.headers['content-length'], String(Buffer.byteLength(r.text)));
      assert.deepEqual(JSON.parse(r.text), { replayed: true });
      assert.equal(await effects(key), 1);
    });
    it('reads "v": 1.0 as version 1', async () => {
      const key = k('replay-v1.0');
      await stored(key, '{"v": 1.0, "headers": {"content-type": "application/json"}, "body": {"a": 1}}');
      const r = await driver.post({ key: key, body: { note: 'ok' } });
      assert.equal(r.status, 201);
      assert.deepEqual(JSON.parse(r.text), { a: 1 });
    });
    [
      ['a later version', '{"v": 2}'],
      ['"v" a string', '{"v": "1", "headers": {}}'],
      ['"v" null', '{"v": null, "headers": {}}'],
      ['headers an array', '{"v": 1, "headers": ["a"]}'],
      ['a header that is not a string', '{"v": 1, "headers": {"location": 1}}'],
      ['a header value with CR/LF', '{"v": 1, "headers": {"location": "/a\\r\\nset-cookie: a=b"}}'],
      ['a header value above 0x7E', '{"v": 1, "headers": {"location": "/caf\u00e9"}}'],
      ['both body and body_base64', '{"v": 1, "headers": {}, "body": {}, "body_base64": "AA=="}'],
      ['body_base64 that is not base64', '{"v": 1, "headers": {}, "body_base64": "%%%"}'],
      ['body_base64 without its padding', '{"v": 1, "headers": {}, "body_base64": "AP8"}'],
      ['body_base64 not a string', '{"v": 1, "headers": {}, "body_base64": 12}'],
    ].forEach(([label, response], i) => {
      it(`answers 500 unsupported-envelope for ${label}, never a partial answer`, async () => {
        const key = k(`envelope-${i}`);
        await stored(key, response!);
        const r = await driver.post({ key: key, body: { note: 'ok' } });
        assert.equal(r.status, 500, r.text);
        assert.equal(problem(r)?.code, 'unsupported-envelope');
        assert.equal(r.headers.location, undefined);
        assert.equal(await effects(key), 1);
      });
    });
  });

  describe('the database going away', () => {
    const unavailable = (r: Reply) => {
      assert.equal(r.status, 503, r.text);
      assert.equal(problem(r)?.code, 'unavailable');
      assert.equal(r.headers['retry-after'], '1');
    };
    it('a connection lost while the handler holds it is 503 unavailable: no row, no record, the pool usable', async () => {
      const key = k('lose-connection');
      unavailable(await driver.post({ key: key, body: { note: 'lose-connection' } }));
      assert.equal(await effects(key), 0);
      assert.equal(await records(key), 0);
      assert.equal((await driver.post({ key: k('after-lost'), body: { note: 'ok' } })).status, 201);
    });
    it('idle connections lost (a server restart) do not end the process; the next request connects anew', async () => {
      assert.ok(db.pool.idleCount > 0);
      const uncaught: unknown[] = [];
      const onUncaught = (error: unknown) => uncaught.push(error);
      process.on('uncaughtException', onUncaught);
      reported.length = 0;
      const admin = new pg.Client({ database: db.name });
      await admin.connect();
      try {
        await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()');
        await sleep(200);
      } finally {
        await admin.end();
        process.off('uncaughtException', onUncaught);
      }
      // an idle client's lost connection, emitted on the pool, is reported, not thrown
      assert.deepEqual(uncaught, []);
      assert.ok(reported.some((error) => (error as { code?: string }).code === '57P01'));
      assert.equal((await driver.post({ key: k('after-restart'), body: { note: 'ok' } })).status, 201);
      assert.equal(await effects(k('after-restart')), 1);
    });
    it('a pool that cannot connect is 503 unavailable', async () => {
      const pool = new pg.Pool({ database: db.name, max: 2, idleTimeoutMillis: 10 });
      const other = await spec.start({ pool });
      try {
        await sleep(100); // the version check's connection has gone
        (pool as unknown as { options: { port: number } }).options.port = 1; // no server there
        unavailable(await other.post({ key: k('no-server'), body: { note: 'ok' } }));
        assert.equal(await records(k('no-server')), 0);
      } finally {
        await other.close();
        await pool.end();
      }
    });
    it('no connection from the pool within its connectionTimeoutMillis is 503 unavailable', async () => {
      const pool = new pg.Pool({ database: db.name, max: 1, connectionTimeoutMillis: 200 });
      const other = await spec.start({ pool });
      const held = await pool.connect();
      try {
        unavailable(await other.post({ key: k('pool-timeout'), body: { note: 'ok' } }));
        assert.equal(await records(k('pool-timeout')), 0);
      } finally {
        held.release();
        await other.close();
        await pool.end();
      }
    });
    it('no client from the pool within acquireTimeout (a pool that would wait without end) is 503 unavailable', async () => {
      const pool = new pg.Pool({ database: db.name, max: 1 });
      const other = await spec.start({ pool, acquireTimeout: 200 });
      const held = await pool.connect();
      try {
        const start = Date.now();
        unavailable(await other.post({ key: k('acquire-timeout'), body: { note: 'ok' } }));
        assert.ok(Date.now() - start < 2000);
        assert.equal(await records(k('acquire-timeout')), 0);
      } finally {
        held.release();
        await sleep(100); // the abandoned wait gets the client, and gives it back
        assert.equal(pool.totalCount - pool.idleCount, 0);
        await other.close();
        await pool.end();
      }
    });
  });

  it('returns every client to the pool', () => {
    assert.equal(db.pool.totalCount - db.pool.idleCount, 0);
  });
}));
