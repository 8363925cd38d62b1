// Test databases on the server of libpq's environment (PGHOST, PGPORT,
// PGUSER a superuser): each test file creates its own database with the
// extension and drops it at the end.

import { request as httpRequest } from 'node:http';
import pg from 'pg';

export interface TestDatabase {
  name: string;
  /** A pool on the database, as the application's. */
  pool: pg.Pool;
  /** One count from SQL. */
  count(sql: string, params?: unknown[]): Promise<number>;
  drop(): Promise<void>;
}

/** Creates a database (with the extension unless `extension` is false) and its effects table. */
export async function createDatabase(label: string, { extension = true, version }: { extension?: boolean; version?: string } = {}): Promise<TestDatabase> {
  const name = `idem_node_${label}_${process.pid}`;
  const admin = new pg.Client({ database: 'postgres' });
  await admin.connect();
  try {
    await admin.query(`DROP DATABASE IF EXISTS ${name}`);
    await admin.query(`CREATE DATABASE ${name}`);
  } finally {
    await admin.end();
  }
  const pool = new pg.Pool({ database: name, max: 8 });
  if (extension) {
    await pool.query(version ? `CREATE EXTENSION idempotency VERSION '${version}'` : 'CREATE EXTENSION idempotency');
  }
  await pool.query('CREATE TABLE effects (id bigserial PRIMARY KEY, note text)');
  return {
    name,
    pool,
    async count(sql, params = []) {
      const { rows } = await pool.query(sql, params);
      return Number(Object.values(rows[0] as object)[0]);
    },
    async drop() {
      await pool.end();
      const dropper = new pg.Client({ database: 'postgres' });
      await dropper.connect();
      try {
        // Without FORCE: pool.end() resolves before its backends have
        // gone, and a backend terminated under a client still ending
        // would be an unhandled error of that client.
        for (let attempt = 0; ; attempt++) {
          try {
            await dropper.query(`DROP DATABASE IF EXISTS ${name}`);
            break;
          } catch (error) {
            if ((error as { code?: string }).code !== '55006' || attempt >= 100) throw error;
            await sleep(100);
          }
        }
      } finally {
        await dropper.end();
      }
    },
  };
}

/** The version `CREATE EXTENSION` installs on this server (the control file's `default_version`). */
export async function defaultVersion(pool: pg.Pool): Promise<string> {
  const { rows } = await pool.query<{ v: string }>(
    "SELECT default_version AS v FROM pg_catalog.pg_available_extensions WHERE name = 'idempotency'");
  return rows[0]!.v;
}

/**
 * POSTs a JSON body to /items on 127.0.0.1:port as token-a with the given
 * key, and hangs up once `started` resolves (the handler runs), before the
 * answer: a fixed delay could end the request before it reached the
 * handler.  Gives up after 10 s.
 */
export function postAndHangUp(port: number, key: string, body: string, started: Promise<void>): Promise<void> {
  return new Promise<void>((resolve) => {
    const req = httpRequest({ port, host: '127.0.0.1', method: 'POST', path: '/items', headers: {
      'content-type': 'application/json', 'content-length': Buffer.byteLength(body), authorization: 'Bearer token-a', 'idempotency-key': key,
    } });
    req.on('error', () => resolve());
    req.end(body);
    let timer: NodeJS.Timeout | undefined;
    const gone = () => { clearTimeout(timer); req.destroy(); resolve(); };
    void started.then(gone);
    timer = setTimeout(gone, 10000);
  });
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Commits a processing reservation of (operation, key, scope), as a request in flight would hold. */
export async function holdReservation(pool: pg.Pool, operation: string, key: string, scope: string, request: string | null = null): Promise<void> {
  await pool.query('SELECT idem_reserve($1, $2, $3::jsonb, scope => $4)', [operation, key, request, scope]);
}

/**
 * Bodies every library takes that the server cannot read (doc/clients.md,
 * "Requests the server refuses"), with its message.
 */
export const refusedBodies: readonly [label: string, body: string, message: RegExp][] = [
  ['\\u0000 in a string (22P05)', '{"note": "refused", "x": "a\\u0000b"}', /^unsupported Unicode escape sequence$/],
  ['\\u0000 as a member name (22P05)', '{"note": "refused", "\\u0000": 1}', /^unsupported Unicode escape sequence$/],
  ['a lone surrogate (22P02)', '{"note": "refused", "x": "\\ud800"}', /^invalid input syntax for type json$/],
  ['a number beyond a double (22003)', '{"note": "refused", "x": 1e400}', /out of range for canonical JSON$/],
  ['a number beyond numeric (22003)', '{"note": "refused", "x": 1e1000000}', /^value overflows numeric format$/],
];

/** The SQLSTATEs of the requests the server refuses, raised by a handler's own SQL instead. */
export const refusedSqlStates: readonly string[] = ['22P02', '22P05', '22003', '22021', '54001'];
