'use strict';
// A small payment API that honours the Idempotency-Key header, in Node.js
// with node-postgres (npm "pg").  The HTTP contract is
// doc/http.md's, the same for the Python, Go and Java services:
//
//   POST /payments   Idempotency-Key: <key>   X-Account-Id: <scope>
//   {"order_id": "order-842", "amount": 10000, "currency": "BRL"}
//
//   201 the payment was made; 402 the card was declined (final, replayed);
//   400 missing or invalid key (SQLSTATE 22023) or a bad body; 409 in
//   progress or stuck, with Retry-After; 422 the key was used with another
//   request; a retry gets the stored status and body with
//   "Idempotent-Replayed: true".
//
// The key is reserved, the payment written and the answer stored in one
// transaction (idem_reserve, INSERT, idem_complete), committed before the
// answer is sent.
//
// Run: PGHOST=... PGDATABASE=... node server.js [--port N] [--port-file F]
//      [--max-seconds S]
// It listens on 127.0.0.1 only, connects with libpq's environment variables
// (PGHOST, PGPORT, PGUSER, PGDATABASE) or DATABASE_URL, and stops on SIGTERM.

const fs = require('fs');
const http = require('http');
const { Pool } = require('pg');

const OPERATION = 'create-payment';
const DECLINE_ABOVE = 1000000; // cents; larger payments are declined
const MAX_BODY = 64 * 1024;
const MAX_LATENCY_MS = 5000;

// The outcomes of idem_reserve that answer without running the effect
const REFUSED = {
  in_progress: [409, 'in_progress', 'a request with this Idempotency-Key is in progress; retry later'],
  stuck: [409, 'stuck', 'the outcome of the request with this Idempotency-Key is being checked'],
  mismatch: [422, 'mismatch', 'this Idempotency-Key was already used with another request'],
};

// SQLSTATEs of the extension (node-postgres: err.code) and what the client is told
const SQLSTATE_HTTP = {
  '22023': [400, 'invalid_request', null], // the message names the argument
  ID003: REFUSED.in_progress, // idem_call's outcomes as errors
  ID004: REFUSED.mismatch,
  ID005: REFUSED.stuck,
  ID001: [500, 'internal_error', 'internal error'], // a bug in the caller
  ID002: [500, 'internal_error', 'internal error'],
  '25006': [503, 'read_only', 'the database is read-only; retry later'],
};

class BadRequest extends Error {}

function errorBody(code, message) {
  return { error: code, message };
}

// The payment request as an object, or BadRequest
function parsePayment(raw) {
  let request;
  try {
    request = JSON.parse(raw.toString('utf8'));
  } catch (e) {
    throw new BadRequest(`the body is not JSON: ${e.message}`);
  }
  if (request === null || typeof request !== 'object' || Array.isArray(request)) {
    throw new BadRequest('the body must be a JSON object');
  }
  if (typeof request.order_id !== 'string' || request.order_id === '') {
    throw new BadRequest('"order_id" must be a non-empty string');
  }
  if (!Number.isSafeInteger(request.amount) || request.amount <= 0) {
    throw new BadRequest('"amount" must be a positive integer (cents)');
  }
  if (typeof request.currency !== 'string' || request.currency.length !== 3) {
    throw new BadRequest('"currency" must be a three-letter code');
  }
  return request;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// One POST /payments: { status, body, replayed }
async function createPayment(pool, scope, key, request, latencyMs) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const result = await createInTransaction(client, scope, key, request, latencyMs);
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    const mapped = SQLSTATE_HTTP[err.code];
    if (!mapped) throw err;
    const [status, code, message] = mapped;
    return { status, body: errorBody(code, message || err.message), replayed: false };
  } finally {
    client.release();
  }
}

async function createInTransaction(client, scope, key, request, latencyMs) {
  // Unnamed statements only: node-postgres prepares a named statement on
  // the server only when a query is given a "name", which a
  // transaction-pooling PgBouncer would lose between transactions.
  const reserved = await client.query(
    'SELECT outcome, response_status, response FROM idem_reserve($1, $2, $3::jsonb, scope => $4)',
    [OPERATION, key, JSON.stringify(request), scope]);
  const { outcome, response_status: responseStatus, response } = reserved.rows[0];
  if (outcome === 'replay') {
    return { status: responseStatus, body: response, replayed: true };
  }
  if (REFUSED[outcome]) {
    const [status, code, message] = REFUSED[outcome];
    return { status, body: errorBody(code, message), replayed: false };
  }

  // new: this request owns the key
  let status;
  let body;
  let resourceId = null;
  if (request.amount > DECLINE_ABOVE) {
    status = 402;
    body = errorBody('card_declined', 'the card was declined');
  } else {
    // The body is built as jsonb, the form idem_complete stores, so that
    // replays are the same document
    const inserted = await client.query(
      `INSERT INTO payments (account, order_id, amount, currency) VALUES ($1, $2, $3, $4)
       RETURNING id, jsonb_build_object('id', id, 'order_id', order_id, 'amount', amount,
                                        'currency', currency, 'status', 'paid') AS body`,
      [scope, request.order_id, request.amount, request.currency]);
    status = 201;
    body = inserted.rows[0].body;
    resourceId = String(inserted.rows[0].id);
  }
  if (latencyMs > 0) await sleep(latencyMs);
  await client.query('SELECT idem_complete($1, $2, $3::jsonb, $4, $5, $6)',
    [OPERATION, key, JSON.stringify(body), status, resourceId, scope]);
  return { status, body, replayed: false };
}

function reply(res, status, body, headers = {}) {
  const data = Buffer.from(JSON.stringify(body));
  res.writeHead(status, {
    'Content-Type': 'application/json',
    'Content-Length': data.length,
    ...headers,
  });
  res.end(data);
}

// Read the request body (bounded); null when too large
function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size > MAX_BODY) {
        req.destroy();
        resolve(null);
      } else {
        chunks.push(chunk);
      }
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

async function handle(pool, req, res) {
  if (req.method === 'GET' && req.url === '/healthz') {
    return reply(res, 200, { status: 'ok' });
  }
  if (req.method !== 'POST' || req.url !== '/payments') {
    req.resume();
    return reply(res, 404, errorBody('not_found', 'not found'));
  }
  const raw = await readBody(req);
  if (raw === null) return undefined;
  const key = req.headers['idempotency-key'];
  if (key === undefined) {
    return reply(res, 400, errorBody('missing_key', 'the Idempotency-Key header is required'));
  }
  const scope = req.headers['x-account-id'] ?? 'public';
  let request;
  try {
    request = parsePayment(raw);
  } catch (e) {
    if (e instanceof BadRequest) return reply(res, 400, errorBody('bad_request', e.message));
    throw e;
  }
  const latency = Number.parseInt(req.headers['x-simulated-latency-ms'] ?? '0', 10);
  if (Number.isNaN(latency)) {
    return reply(res, 400, errorBody('bad_request', 'bad X-Simulated-Latency-Ms'));
  }

  let result;
  try {
    result = await createPayment(pool, scope, key, request,
      Math.min(Math.max(latency, 0), MAX_LATENCY_MS));
  } catch (err) {
    console.error(`server: database error ${err.code}: ${err.message}`);
    return reply(res, 500, errorBody('internal_error', 'internal error'));
  }
  const headers = {};
  if (result.replayed) headers['Idempotent-Replayed'] = 'true';
  if (result.status === 409 || result.status === 503) headers['Retry-After'] = '1';
  return reply(res, result.status, result.body, headers);
}

function parseArgs(argv) {
  const args = { port: 0, portFile: null, maxSeconds: 300 };
  for (let i = 0; i < argv.length; i += 2) {
    const [name, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${name} needs a value`);
    if (name === '--port') args.port = Number(value);
    else if (name === '--port-file') args.portFile = value;
    else if (name === '--max-seconds') args.maxSeconds = Number(value);
    else throw new Error(`unknown option ${name}`);
  }
  return args;
}

function main() {
  const args = parseArgs(process.argv.slice(2));
  const pool = new Pool({
    connectionString: process.env.DATABASE_URL,
    max: 16,
    connectionTimeoutMillis: 10000,
  });
  pool.on('error', (err) => console.error(`server: idle connection error: ${err.message}`));

  const server = http.createServer((req, res) => {
    handle(pool, req, res).catch((err) => {
      console.error(`server: ${err.stack}`);
      if (!res.headersSent) reply(res, 500, errorBody('internal_error', 'internal error'));
    });
  });

  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    server.close(() => pool.end().then(() => console.error('server: stopped')));
    server.closeIdleConnections();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  setTimeout(stop, args.maxSeconds * 1000).unref();

  server.listen(args.port, '127.0.0.1', () => {
    const { port } = server.address();
    if (args.portFile) {
      fs.writeFileSync(`${args.portFile}.tmp`, `${port}\n`);
      fs.renameSync(`${args.portFile}.tmp`, args.portFile);
    }
    console.error(`server: listening on 127.0.0.1:${port}`);
  });
}

main();
