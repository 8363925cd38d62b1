// One behaviour suite for both integrations: the same cases drive an
// Express app (through supertest, and through a real node server) and a
// Fastify app (through inject, and through a real node server), built from
// one handler. Every effect is counted in the database; the handler inserts
// one row per run, with the request's key as its note.

import assert from 'node:assert/strict';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import express, { type Request } from 'express';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import type { PoolClient } from 'pg';
import supertest from 'supertest';
import { idempotency } from '../src/express.js';
import fastifyIdempotency from '../src/fastify.js';
import type { IdempotencyOptions } from '../src/index.js';
import pg from 'pg';
import { createDatabase, sleep, type TestDatabase } from './helpers.js';

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

/** The one handler both apps run, by the body's `note`; it inserts a row first. */
async function act(client: PoolClient, key: string, body: { note?: string; text?: string }): Promise<Answer> {
  await client.query('INSERT INTO effects (note) VALUES ($1)', [key]);
  const json = 'application/json; charset=utf-8';
  switch (body.note) {
    case 'raise-402': throw new CardDeclined();
    case 'raise-402-final': throw new FinalCardDeclined();
    case 'location-from-client': return { status: 201, headers: [['location', `/items/${body.text}`]], body: { ok: true } };
    case 'latin1-location': return { status: 201, headers: [['location', '/items/caf\u00e9']], body: { ok: true } };
    case 'euro-content-type': return { status: 200, headers: [['content-type', 'text/plain; charset=\u20ac']], body: 'text' };
    case 'nul-header': return { status: 201, headers: [['x-trace', 'a\u0000b']], body: { ok: true } };
    case 'bad-header-name': return { status: 201, headers: [['x trace', 'a']], body: { ok: true } };
    case 'nul-body': return { status: 201, headers: [['content-type', json]], body: { s: 'a\u0000b' } };
    case 'surrogate-body': return { status: 201, headers: [['content-type', json]], body: { s: 'a\ud800b' } };
    case 'lose-connection': {
      // the connection is lost between two queries, as in a server restart
      const { rows } = await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
      await db.pool.query('SELECT pg_terminate_backend($1)', [rows[0]!.pid]);
      await sleep(200);
      await client.query('SELECT 1');
      return { status: 201, headers: [], body: { ok: true } };
    }
    default: return { status: 201, headers: [['location', '/items/1'], ['content-type', json]], body: { ok: true, note: body.note } };
  }
}

const users: Record<string, string> = { 'token-a': 'user-a', 'token-empty': '', 'token-nul': 'user\u0000a', 'token-long': 'u'.repeat(256) };
/** The principal of a request; the token 'token-throws' makes the scope function throw. */
const principal = (authorization: string | undefined) => {
  const token = (authorization ?? '').replace(/^Bearer /, '');
  if (token === 'token-throws') throw new Error('secret failure of the scope function');
  return users[token];
};
/** Stored and replayed: the framing headers are here to show they are never replayed all the same. */
const replayHeaders = ['content-type', 'location', 'x-allowed', 'content-length', 'transfer-encoding', 'connection', 'keep-alive', 'te', 'trailer', 'upgrade', 'proxy-connection'];
/** The settings both apps are created with; `pool` (default the test database's) can be another. */
const settings = <Req>(db: TestDatabase, scope: (req: Req) => string | undefined, pool?: pg.Pool): IdempotencyOptions<Req> =>
  ({ pool: pool ?? db.pool, scope, replayHeaders, finalErrors: [FinalCardDeclined], onError: (error) => reported.push(error) });
/** What the apps' onError was given. */
const reported: unknown[] = [];

function expressApp(db: TestDatabase, pool?: pg.Pool): Promise<express.Express> {
  return idempotency(settings<Request>(db, (req) => principal(req.headers.authorization), pool)).then((idem) => {
    const app = express();
    app.post('/items', idem.route({ operation: 'create-item' }), async (req, res) => {
      const answer = await act(req.idempotency!.client, req.idempotency!.key, req.body as { note?: string });
      res.status(answer.status);
      for (const [name, value] of answer.headers) res.setHeader(name, value);
      if (typeof answer.body === 'string') res.send(answer.body);
      else res.json(answer.body);
    });
    app.use(idem.errorHandler());
    // the application's own error handler resolves the status of an error
    app.use((error: { status?: number; message: string }, _req: Request, res: express.Response, _next: express.NextFunction) => {
      res.status(error.status ?? 500).json({ error: error.message });
    });
    return app;
  });
}

async function fastifyApp(db: TestDatabase, pool?: pg.Pool): Promise<FastifyInstance> {
  const app = Fastify();
  await app.register(fastifyIdempotency, settings<FastifyRequest>(db, (request) => principal(request.headers.authorization), pool));
  // Fastify's own error handler resolves the status of an error (statusCode)
  app.post('/items', { config: { idempotency: { operation: 'create-item' } } }, async (request, reply) => {
    const answer = await act(request.idempotency!.client, request.idempotency!.key, request.body as { note?: string });
    reply.code(answer.status);
    for (const [name, value] of answer.headers) reply.header(name, value);
    return reply.send(answer.body);
  });
  await app.ready();
  return app;
}

/** A response as every driver reports it. */
interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

interface Driver {
  name: string;
  post(key: string, body: unknown, token?: string): Promise<Reply>;
  close(): Promise<void>;
}

const requestHeaders = (key: string, token = 'token-a') => ({ authorization: `Bearer ${token}`, 'idempotency-key': key, 'content-type': 'application/json' });

/** POSTs to a real server with node's http client, which reads what the server wrote. */
function postOverSocket(port: number, key: string, body: unknown, token?: string): Promise<Reply> {
  return new Promise((resolve) => {
    const payload = JSON.stringify(body);
    const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: '/items',
      headers: { ...requestHeaders(key, token), 'content-length': Buffer.byteLength(payload) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString() }));
      res.on('error', () => resolve({ status: 0, headers: {}, text: 'the response broke off' }));
    });
    req.on('error', (error) => resolve({ status: 0, headers: {}, text: `no response: ${error.message}` }));
    req.end(payload);
  });
}

const drivers: { name: string; start(db: TestDatabase, pool?: pg.Pool): Promise<Driver> }[] = [
  {
    name: 'Express through supertest',
    async start(db, pool) {
      const app = await expressApp(db, pool);
      return {
        name: this.name,
        async post(key, body, token) {
          const r = await supertest(app).post('/items').set(requestHeaders(key, token)).send(JSON.stringify(body))
            .buffer(true).parse((res, cb) => { let t = ''; res.setEncoding('utf8'); res.on('data', (c: string) => { t += c; }); res.on('end', () => cb(null, t)); });
          return { status: r.status, headers: r.headers, text: r.body as string };
        },
        async close() {},
      };
    },
  },
  {
    name: 'Express on a node server',
    async start(db, pool) {
      const server = (await expressApp(db, pool)).listen(0, '127.0.0.1');
      await new Promise((resolve) => server.once('listening', resolve));
      const { port } = server.address() as AddressInfo;
      return {
        name: this.name,
        post: (key, body, token) => postOverSocket(port, key, body, token),
        close: () => new Promise<void>((resolve) => { server.closeAllConnections(); server.close(() => resolve()); }),
      };
    },
  },
  {
    name: 'Fastify through inject',
    async start(db, pool) {
      const app = await fastifyApp(db, pool);
      return {
        name: this.name,
        async post(key, body, token) {
          const r = await app.inject({ method: 'POST', url: '/items', headers: requestHeaders(key, token), payload: JSON.stringify(body) });
          return { status: r.statusCode, headers: r.headers as Reply['headers'], text: r.body };
        },
        close: () => app.close(),
      };
    },
  },
  {
    name: 'Fastify on a node server',
    async start(db, pool) {
      const app = await fastifyApp(db, pool);
      const { port } = new URL(await app.listen({ port: 0, host: '127.0.0.1' }));
      return { name: this.name, post: (key, body, token) => postOverSocket(Number(port), key, body, token), close: () => app.close() };
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
const problem = (reply: Reply) => (reply.headers['content-type'] === 'application/problem+json' ? JSON.parse(reply.text) as { code: string } : null);

drivers.forEach((spec, n) => describe(spec.name, () => {
  let driver: Driver;
  /** A key of this driver's own. */
  const k = (label: string) => `d${n}-${label}`;
  before(async () => {
    driver = await spec.start(db);
  });
  after(async () => driver.close());

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
        const r = await driver.post(key, { note: 'ok' }, token);
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
      const first = await driver.post(key, { note: 'raise-402' });
      assert.equal(first.status, 402);
      assert.match(first.text, /card declined/);
      assert.equal(await effects(key), 0);
      assert.equal(await records(key), 0);
      const again = await driver.post(key, { note: 'raise-402' });
      assert.equal(again.status, 402);
      assert.equal(again.headers['idempotent-replayed'], undefined);
      assert.equal(await effects(key), 0);
      assert.equal(await records(key), 0);
    });
    it('marked final is completed with its resolved status and body: one row, a record, the retry replays it', async () => {
      const key = k('raise-402-final');
      const first = await driver.post(key, { note: 'raise-402-final' });
      assert.equal(first.status, 402);
      assert.match(first.text, /card declined/);
      assert.equal(await effects(key), 1);
      assert.equal(await db.count("SELECT count(*) FROM idem_keys WHERE key = $1 AND status = 'completed' AND response_status = 402", [key]), 1);
      const again = await driver.post(key, { note: 'raise-402-final' });
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
          const r = await driver.post(key, body);
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
      const first = await driver.post(key, { note: 'ok' });
      assert.equal(first.status, 201);
      await db.pool.query('UPDATE idem_keys SET response = $2::jsonb WHERE key = $1', [key, response]);
    };
    it('sends only the headers on the allow-list now: no set-cookie unless listed, never a framing header', async () => {
      const key = k('replay-headers');
      await stored(key, JSON.stringify({ v: 1, headers: {
        'content-type': 'application/json', location: '/items/7', 'x-allowed': 'yes', 'x-not-listed': 'no', 'set-cookie': 'sid=stolen',
        'content-length': '999', 'transfer-encoding': 'chunked', connection: 'x-stored', 'keep-alive': 'timeout=99', trailer: 'x', upgrade: 'h2c',
      }, body: { replayed: true } }));
      const r = await driver.post(key, { note: 'ok' });
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
      const r = await driver.post(key, { note: 'ok' });
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
        const r = await driver.post(key, { note: 'ok' });
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
      unavailable(await driver.post(key, { note: 'lose-connection' }));
      assert.equal(await effects(key), 0);
      assert.equal(await records(key), 0);
      assert.equal((await driver.post(k('after-lost'), { note: 'ok' })).status, 201);
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
      assert.equal((await driver.post(k('after-restart'), { note: 'ok' })).status, 201);
      assert.equal(await effects(k('after-restart')), 1);
    });
    it('a pool that cannot connect is 503 unavailable', async () => {
      const pool = new pg.Pool({ database: db.name, max: 2, idleTimeoutMillis: 10 });
      const other = await spec.start(db, pool);
      try {
        await sleep(100); // the version check's connection has gone
        (pool as unknown as { options: { port: number } }).options.port = 1; // no server there
        unavailable(await other.post(k('no-server'), { note: 'ok' }));
        assert.equal(await records(k('no-server')), 0);
      } finally {
        await other.close();
        await pool.end();
      }
    });
    it('no connection from the pool within its connectionTimeoutMillis is 503 unavailable', async () => {
      const pool = new pg.Pool({ database: db.name, max: 1, connectionTimeoutMillis: 200 });
      const other = await spec.start(db, pool);
      const held = await pool.connect();
      try {
        unavailable(await other.post(k('pool-timeout'), { note: 'ok' }));
        assert.equal(await records(k('pool-timeout')), 0);
      } finally {
        held.release();
        await other.close();
        await pool.end();
      }
    });
  });

  it('returns every client to the pool', () => {
    assert.equal(db.pool.totalCount - db.pool.idleCount, 0);
  });
}));
