// The demo payment API of doc/clients.md ("The demo app") on Express, with
// pg-idempotency's middleware: the payment's INSERT, the key's record and
// the stored answer commit together, before the answer is sent.
//
//   POST /payments      Authorization: Bearer <token>   Idempotency-Key: "<key>"
//   {"order_id": "o-1", "amount": 100, "currency": "EUR"}
//   GET  /payments/<id>
//
// Run: demo/start.sh [--port N] [--port-file F] [--max-seconds S] [--bench]
// with libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE) naming a
// database with the extension and clients/demo/schema.sql.

import { writeFileSync, renameSync } from 'node:fs';
import { createServer } from 'node:http';
import express, { type NextFunction, type Request, type Response } from 'express';
import pg from 'pg';
import { PROBLEM_TYPE_BASE } from 'pg-idempotency';
import { idempotency } from 'pg-idempotency/express';

const DECLINE_ABOVE = 1_000_000;
const MAX_LATENCY_MS = 5000;

interface Args {
  port: number;
  portFile: string | null;
  maxSeconds: number;
  bench: boolean;
}

function parseArgs(argv: string[]): Args {
  const args: Args = { port: 0, portFile: null, maxSeconds: 3600, bench: false };
  for (let i = 0; i < argv.length; i++) {
    const name = argv[i]!;
    if (name === '--bench') {
      args.bench = true;
      continue;
    }
    const value = argv[++i];
    if (value === undefined) throw new Error(`${name} needs a value`);
    if (name === '--port') args.port = Number(value);
    else if (name === '--port-file') args.portFile = value;
    else if (name === '--max-seconds') args.maxSeconds = Number(value);
    else throw new Error(`unknown option ${name}`);
  }
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) throw new Error('--port must be 0 to 65535');
  if (!(args.maxSeconds > 0)) throw new Error('--max-seconds must be positive');
  return args;
}

/** The token=account pairs of DEMO_TOKENS. */
function parseTokens(text: string): Map<string, string> {
  const tokens = new Map<string, string>();
  for (const pair of text.split(',')) {
    const [token, account] = pair.split('=').map((part) => part.trim());
    if (token && account) tokens.set(token, account);
  }
  return tokens;
}

const tokens = parseTokens(process.env.DEMO_TOKENS ?? 'token-a=acct-a,token-b=acct-b');

/** The account of the request's bearer token, or null. */
function account(req: Request): string | null {
  const match = /^Bearer +([^ ]+) *$/i.exec(req.headers.authorization ?? '');
  return match ? (tokens.get(match[1]!) ?? null) : null;
}

/** An application/problem+json answer of the demo's own. */
function problem(res: Response, status: number, code: string, title: string, detail: string): void {
  res.status(status).type('application/problem+json')
    .send(JSON.stringify({ type: PROBLEM_TYPE_BASE + code, title, status, detail, code }));
}

/** The payment in a request body, or the sentence saying what is wrong. */
function parsePayment(body: unknown): { order_id: string; amount: number; currency: string } | string {
  if (body === null || typeof body !== 'object' || Array.isArray(body) || Buffer.isBuffer(body)) {
    return 'The body must be a JSON object.';
  }
  const { order_id: orderId, amount, currency } = body as Record<string, unknown>;
  if (typeof orderId !== 'string' || orderId === '') return '"order_id" must be a non-empty string.';
  if (typeof amount !== 'number' || !Number.isSafeInteger(amount) || amount <= 0) return '"amount" must be a positive integer.';
  if (typeof currency !== 'string' || !/^[A-Za-z]{3}$/.test(currency)) return '"currency" must be three letters.';
  return { order_id: orderId, amount, currency };
}

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const pool = new pg.Pool({ max: Number(process.env.DEMO_POOL_MAX ?? 16), connectionTimeoutMillis: 10_000 });
  pool.on('error', (error) => console.error(`demo: idle connection error: ${error.message}`));

  // refuses to start without the extension (or with one older than 0.2.0)
  const idem = await idempotency({ pool, scope: account });

  const app = express();
  app.disable('x-powered-by');
  app.set('etag', false);

  app.get('/healthz', (_req, res) => {
    res.json({ status: 'ok' });
  });

  app.post('/payments', idem.route({ operation: 'create-payment' }), async (req, res) => {
    const { client, scope } = req.idempotency!;
    const payment = parsePayment(req.body);
    if (typeof payment === 'string') {
      problem(res, 400, 'bad-request', 'Not a payment', payment);
      return;
    }
    const latencyHeader = req.headers['x-simulated-latency-ms'];
    const latency = latencyHeader === undefined ? 0 : Number(latencyHeader);
    if (!Number.isInteger(latency) || latency < 0) {
      problem(res, 400, 'bad-request', 'Not a payment', 'X-Simulated-Latency-Ms must be a whole number of milliseconds.');
      return;
    }
    const declined = payment.amount > DECLINE_ABOVE;
    const { rows } = await client.query<{ id: string; body: Record<string, unknown> }>(
      `INSERT INTO payments (account, order_id, amount, currency, status) VALUES ($1, $2, $3, $4, $5)
       RETURNING id, jsonb_build_object('id', id, 'order_id', order_id, 'amount', amount,
                                        'currency', currency, 'status', status) AS body`,
      [scope, payment.order_id, payment.amount, payment.currency, declined ? 'declined' : 'paid'],
    );
    if (latency > 0) await sleep(Math.min(latency, MAX_LATENCY_MS));
    if (declined) {
      problem(res, 402, 'card-declined', 'Card declined', 'The card was declined.');
      return;
    }
    res.status(201).location(`/payments/${rows[0]!.id}`).json(rows[0]!.body);
  });

  app.get('/payments/:id', async (req, res) => {
    const owner = account(req);
    if (owner === null) {
      problem(res, 401, 'unauthenticated', 'Unauthenticated', 'The request has no valid bearer token.');
      return;
    }
    const id = req.params.id;
    const { rows } = /^[0-9]{1,18}$/.test(id)
      ? await pool.query(
        `SELECT jsonb_build_object('id', id, 'order_id', order_id, 'amount', amount,
                                   'currency', currency, 'status', status) AS body
           FROM payments WHERE id = $1 AND account = $2`, [id, owner])
      : { rows: [] };
    if (rows.length === 0) {
      problem(res, 404, 'not-found', 'Not found', 'There is no such payment.');
      return;
    }
    res.json(rows[0].body);
  });

  if (args.bench) {
    app.post('/bench/middleware', idem.route({ operation: 'bench' }), async (req, res) => {
      const { client, key } = req.idempotency!;
      const { rows } = await client.query('INSERT INTO bench_effects (k) VALUES ($1) RETURNING id', [key]);
      res.status(201).json({ id: Number(rows[0].id) });
    });
    // The same handler with the three SQL calls by hand, on the same pool.
    app.post('/bench/by-hand', express.raw({ type: () => true }), async (req, res) => {
      const scope = account(req);
      const key = req.headers['idempotency-key'];
      if (scope === null || typeof key !== 'string') {
        res.status(400).end();
        return;
      }
      const body = Buffer.isBuffer(req.body) && req.body.length > 0 ? req.body.toString('utf8') : 'null';
      const request = `{"method":"POST","path":"/bench/by-hand","body":${body}}`;
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        const { rows } = await client.query(
          'SELECT outcome, response_status, response FROM idem_reserve($1, $2, $3::jsonb, scope => $4)',
          ['bench-by-hand', key, request, scope]);
        const row = rows[0];
        if (row.outcome === 'new') {
          const inserted = await client.query('INSERT INTO bench_effects (k) VALUES ($1) RETURNING id', [key]);
          const answer = { id: Number(inserted.rows[0].id) };
          await client.query('SELECT idem_complete($1, $2, $3::jsonb, $4, scope => $5)',
            ['bench-by-hand', key, JSON.stringify({ v: 1, headers: { 'content-type': 'application/json; charset=utf-8' }, body: answer }), 201, scope]);
          await client.query('COMMIT');
          res.status(201).json(answer);
        } else {
          await client.query('COMMIT');
          if (row.outcome === 'replay') res.status(row.response_status).set('idempotent-replayed', 'true').json(row.response.body);
          else res.status(409).end();
        }
      } catch (error) {
        await client.query('ROLLBACK').catch(() => undefined);
        throw error;
      } finally {
        client.release();
      }
    });
  }

  app.use(idem.errorHandler());
  app.use((error: unknown, _req: Request, res: Response, next: NextFunction) => {
    console.error('demo:', error);
    if (res.headersSent) {
      next(error);
      return;
    }
    const status = (error as { status?: unknown }).status;
    if (typeof status === 'number' && status >= 400 && status < 500) {
      problem(res, status, 'bad-request', 'Bad request', 'The request could not be read.');
      return;
    }
    problem(res, 500, 'internal-error', 'Internal error', 'The request failed and was rolled back.');
  });
  app.use((_req, res) => problem(res, 404, 'not-found', 'Not found', 'There is no such resource.'));

  const server = createServer(app);
  let stopping = false;
  const stop = (why: string): void => {
    if (stopping) return;
    stopping = true;
    console.error(`demo: stopping (${why})`);
    server.close(() => {
      pool.end().then(() => console.error('demo: stopped'), () => undefined);
    });
    server.closeIdleConnections();
    setTimeout(() => process.exit(0), 10_000).unref();
  };
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
  setTimeout(() => stop('--max-seconds'), args.maxSeconds * 1000).unref();

  server.listen(args.port, '127.0.0.1', () => {
    const address = server.address();
    const port = typeof address === 'object' && address !== null ? address.port : args.port;
    if (args.portFile !== null) {
      writeFileSync(`${args.portFile}.tmp`, `${port}\n`);
      renameSync(`${args.portFile}.tmp`, args.portFile);
    }
    console.error(`demo: listening on 127.0.0.1:${port}${args.bench ? ' (with the bench routes)' : ''}`);
  });
}

main().catch((error: unknown) => {
  console.error(`demo: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
});
