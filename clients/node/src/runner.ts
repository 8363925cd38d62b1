/**
 * The core runner (doc/clients.md, "One core: run a function under a
 * key"): the only code that reserves, runs, completes or rolls back, and
 * commits. The Express middleware and the Fastify plugin are its callers;
 * it maps nothing to HTTP.
 *
 * @module
 */

import type { Pool, PoolClient } from 'pg';

/** What one call reserves. */
export interface ReserveParams {
  operation: string;
  key: string;
  scope: string;
  /** The request document (JSON text); its `idem_hash` is the fingerprint. */
  request: string;
  /** An interval text, or null for the server's default. */
  ttl: string | null;
}

/** What the function run under a key returns: a status and the response to store (JSON text, or null for none). */
export interface Completion {
  status: number;
  response: string | null;
}

/** Which completions roll back, and which raised errors are completed. */
export interface RunPolicy {
  /** Completion statuses that roll back instead of completing (default every 5xx, 408 and 429). */
  retryable?: (status: number) => boolean;
  /** The completion of a raised error that is final (completed and committed), or undefined to roll it back (the default). */
  final?: (error: unknown) => Completion | undefined;
  /**
   * Milliseconds `fn` may run; past them its connection is closed (the
   * server rolls the transaction back and frees the key) and
   * {@link TimeLimitError} is thrown, whatever `fn` still does. The
   * transaction's `statement_timeout` is set to it too, so that a
   * statement still running is cancelled: the key is free at the latest
   * twice the limit after `fn` started. Default none.
   */
  timeLimit?: number;
  /** The largest response stored, in bytes of its JSON text; over it the transaction rolls back and {@link ResponseTooLargeError} is thrown. Default none. */
  responseLimit?: number;
  /** Milliseconds to wait for a client from the pool; past them {@link AcquireTimeoutError}. Default none (the pool's own `connectionTimeoutMillis`). */
  acquireTimeout?: number;
}

/** A completion whose response is over the limit of what is stored: rolled back. */
export class ResponseTooLargeError extends Error {
  constructor(size: number, limit: number) {
    super(`The response is ${size} bytes, over the ${limit} bytes that are stored; it was rolled back.`);
    this.name = 'ResponseTooLargeError';
  }
}

/** No client from the pool within the acquisition deadline. */
export class AcquireTimeoutError extends Error {
  constructor(acquireTimeout: number) {
    super(`No database connection from the pool within ${acquireTimeout} ms.`);
    this.name = 'AcquireTimeoutError';
  }
}

/** The function ran past the time limit: its transaction was rolled back (its connection closed) and the key freed. */
export class TimeLimitError extends Error {
  readonly timeLimit: number;

  constructor(timeLimit: number) {
    super(`The request ran past its time limit of ${timeLimit} ms and was rolled back.`);
    this.name = 'TimeLimitError';
    this.timeLimit = timeLimit;
  }
}

/** The outcome of {@link runUnderKey}: the function ran (`new`), or the stored response (`replay`). */
export type RunResult =
  | { outcome: 'new'; status: number; response: string | null; /** false when a retryable status rolled back */ committed: boolean }
  | { outcome: 'replay'; status: number; response: string | null; /** `(response -> 'body')::text`: the envelope's body in jsonb's formatting */ body: string | null };

/** The outcomes that are not an answer: another attempt holds the key, its outcome is unknown, or the key was used with another request. */
export class KeyOutcomeError extends Error {
  readonly outcome: 'in_progress' | 'stuck' | 'mismatch';

  constructor(outcome: 'in_progress' | 'stuck' | 'mismatch', message: string) {
    super(message);
    this.name = new.target.name;
    this.outcome = outcome;
  }
}

/** Another transaction holds the key right now. */
export class InProgressError extends KeyOutcomeError {
  constructor() {
    super('in_progress', 'A request with this key is still being processed.');
  }
}

/** A first attempt's outcome is unknown (older than `idempotency.processing_timeout`). */
export class StuckError extends KeyOutcomeError {
  constructor() {
    super('stuck', 'The outcome of the first attempt under this key is unknown.');
  }
}

/** The key was used before with another request (another fingerprint). */
export class MismatchError extends KeyOutcomeError {
  constructor() {
    super('mismatch', 'This key was already used with another request.');
  }
}

/**
 * An error of a function run under a time limit, as the runner sees it: a
 * statement cancelled (`57014`) once the limit has passed is the time
 * limit's `statement_timeout`, so a {@link TimeLimitError}.
 */
export function pastTimeLimit(error: unknown, timeLimit: number | undefined, started: number): unknown {
  if (timeLimit !== undefined && (error as { code?: unknown } | null)?.code === '57014' && Date.now() - started >= timeLimit) {
    return new TimeLimitError(timeLimit);
  }
  return error;
}

/** A time limit as the integer SET takes, or a TypeError. */
function checkedTimeLimit(timeLimit: number): number {
  if (!Number.isInteger(timeLimit) || timeLimit <= 0) throw new TypeError('timeLimit must be a positive whole number of milliseconds');
  return timeLimit;
}

/** The two calls, schema-qualified. */
export interface RunnerSql {
  readonly reserve: string;
  readonly complete: string;
}

/** The default retryable statuses: every 5xx, 408 and 429. */
export const defaultRetryable = (status: number): boolean => status >= 500 || status === 408 || status === 429;

interface ReserveRow {
  outcome: string;
  response_status: number | null;
  response: string | null;
  body: string | null;
}

/**
 * Runs `fn` under a key, in one transaction on one client of `pool`:
 * BEGIN, `idem_reserve`; on `new`, `fn(client)`, then `idem_complete` with
 * its completion and COMMIT (the commit follows the completion, never
 * precedes it), or ROLLBACK for a retryable status or a raised error that
 * is not final. Nothing here listens for a caller going away.
 *
 * @returns `new` with the completion, or `replay` with the stored response (`fn` not called).
 * @throws InProgressError, StuckError, MismatchError for those outcomes;
 *   any other error (of `fn`, of the database) after ROLLBACK, as raised.
 */
export async function runUnderKey(
  pool: Pool,
  sql: RunnerSql,
  params: ReserveParams,
  fn: (client: PoolClient) => Promise<Completion>,
  policy: RunPolicy = {},
): Promise<RunResult> {
  const client = await acquire(pool, policy.acquireTimeout);
  guard(client);
  let row: ReserveRow;
  try {
    await client.query(policy.timeLimit === undefined ? 'BEGIN' : `BEGIN; SET LOCAL statement_timeout = ${checkedTimeLimit(policy.timeLimit)}`);
    const result = await client.query<ReserveRow>(sql.reserve, [params.operation, params.key, params.request, params.scope, params.ttl]);
    row = result.rows[0]!;
    if (row.outcome !== 'new') await client.query('COMMIT');
  } catch (error) {
    await rollbackAndRelease(client);
    throw error;
  }
  if (row.outcome !== 'new') {
    release(client);
    switch (row.outcome) {
      case 'replay':
        return { outcome: 'replay', status: row.response_status ?? 200, response: row.response, body: row.body };
      case 'in_progress':
        throw new InProgressError();
      case 'stuck':
        throw new StuckError();
      case 'mismatch':
        throw new MismatchError();
      default:
        throw new Error(`idem_reserve answered an unknown outcome "${row.outcome}"`);
    }
  }
  let completion: Completion;
  let timer: NodeJS.Timeout | undefined;
  const started = Date.now();
  try {
    const { timeLimit } = policy;
    completion = timeLimit === undefined ? await fn(client) : await Promise.race([
      fn(client),
      new Promise<never>((_resolve, reject) => { timer = setTimeout(() => reject(new TimeLimitError(timeLimit)), timeLimit); }),
    ]);
  } catch (raised) {
    const error = pastTimeLimit(raised, policy.timeLimit, started);
    if (error instanceof TimeLimitError) {
      // fn may still be using the client: closing its connection rolls the
      // transaction back and frees the key, and fails what fn does next
      release(client, error);
      throw error;
    }
    const final = policy.final?.(error);
    if (final === undefined) {
      await rollbackAndRelease(client);
      throw error;
    }
    completion = final;
  } finally {
    clearTimeout(timer);
  }
  if ((policy.retryable ?? defaultRetryable)(completion.status)) {
    await rollbackAndRelease(client);
    return { outcome: 'new', ...completion, committed: false };
  }
  const size = completion.response === null ? 0 : Buffer.byteLength(completion.response);
  if (policy.responseLimit !== undefined && size > policy.responseLimit) {
    await rollbackAndRelease(client);
    throw new ResponseTooLargeError(size, policy.responseLimit);
  }
  try {
    await client.query(sql.complete, [params.operation, params.key, completion.response, completion.status, params.scope]);
    await client.query('COMMIT');
  } catch (error) {
    await rollbackAndRelease(client);
    throw error;
  }
  release(client);
  return { outcome: 'new', ...completion, committed: true };
}

/** A client from the pool, waiting at most `acquireTimeout` ms; a client that comes later goes straight back. */
async function acquire(pool: Pool, acquireTimeout: number | undefined): Promise<PoolClient> {
  if (acquireTimeout === undefined) return pool.connect();
  const pending = pool.connect();
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      pending,
      new Promise<never>((_resolve, reject) => { timer = setTimeout(() => reject(new AcquireTimeoutError(acquireTimeout)), acquireTimeout); }),
    ]);
  } catch (error) {
    if (error instanceof AcquireTimeoutError) pending.then((client) => client.release(), () => undefined);
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

const guards = new WeakMap<PoolClient, (error: Error) => void>();

/**
 * Listens for the errors of a borrowed client: node-postgres removes the
 * pool's listener while a client is out, and a connection lost between two
 * queries (a terminated backend, a restart) is an 'error' event, which
 * without a listener ends the process. The next query fails instead.
 */
function guard(client: PoolClient): void {
  const listener = (): void => {
    // the next query on this client fails with the connection's error
  };
  guards.set(client, listener);
  client.on('error', listener);
}

/** Gives a borrowed client back (destroying it after an error of its connection). */
function release(client: PoolClient, error?: Error): void {
  const listener = guards.get(client);
  if (listener !== undefined) {
    client.removeListener('error', listener);
    guards.delete(client);
  }
  client.release(error);
}

/** ROLLBACK (when the connection still works) and release; a broken connection is destroyed. */
async function rollbackAndRelease(client: PoolClient): Promise<void> {
  try {
    await client.query('ROLLBACK');
    release(client);
  } catch (error) {
    release(client, error instanceof Error ? error : new Error(String(error)));
  }
}
