/**
 * The options, and the transaction runner both integrations share: reserve,
 * run the handler with the transaction's client, complete, COMMIT.
 *
 * @module
 */

import type { Pool, PoolClient } from 'pg';
import {
  type CapturedResponse, decodeEnvelope, encodeEnvelope, UnsendableResponseError, unsendable, UnsupportedEnvelopeError,
} from './envelope.js';
import {
  type FingerprintRequest,
  FingerprintError,
  type JsonPointer,
  parseJsonPointer,
  requestDocument,
} from './fingerprint.js';
import { type KeyParse, parseIdempotencyKey } from './key.js';
import {
  type Mapping,
  type MappingOverrides,
  type ProblemCode,
  isUnavailable,
  problemResponse,
  resolveMapping,
  sqlstateProblem,
} from './mapping.js';
import {
  AcquireTimeoutError, type Completion, defaultRetryable, KeyOutcomeError, pastTimeLimit, TimeLimitError, type ReserveParams, type RunPolicy, type RunResult, type RunnerSql, runUnderKey,
} from './runner.js';
import { checkExtensionVersion, type ExtensionInfo } from './version.js';

export { defaultRetryable, type ReserveParams } from './runner.js';

/** The settings a route may set for itself (doc/clients.md, "Settings every library has"). */
export interface RouteOptions<Req = unknown> {
  /**
   * The operation: a name (`create-payment`), or a function of the request.
   * Default `METHOD path-template` (`POST /payments/{id}`).
   */
  operation?: string | ((req: Req) => string);
  /**
   * RFC 6901 JSON Pointers of the body members that make two requests the
   * same (`['/order_id', '/amount']`); default the whole body.
   */
  fingerprint?: readonly string[];
  /**
   * How long a completed record replays: a PostgreSQL interval (`'1 day'`)
   * or seconds. Default the server's `idempotency.default_ttl`.
   */
  ttl?: string | number;
  /** A missing key is 400 `missing-key` (`true`, the default), or the handler runs without idempotency. */
  keyRequired?: boolean;
  /** Handler statuses that roll back instead of completing; default every 5xx, 408 and 429. */
  retryable?: readonly number[] | ((status: number) => boolean);
  /**
   * Raised errors that are completed with the status and body the framework
   * resolves for them (and replayed), instead of rolled back: error classes
   * (`instanceof`), or a predicate of the error. Default none: every raised
   * error rolls back, whatever its status.
   */
  finalErrors?: readonly (abstract new (...args: never[]) => unknown)[] | ((error: unknown) => boolean);
  /**
   * Milliseconds the handler may hold the key's transaction; past them the
   * transaction is rolled back (its connection closed), the key freed, and
   * the client answered 503 `time-limit` with `Retry-After`. Default none;
   * keep it below the server's `idempotency.processing_timeout`.
   */
  timeLimit?: number;
}

/** Every setting. */
export interface IdempotencyOptions<Req = unknown> extends RouteOptions<Req> {
  /** The node-postgres pool the transactions borrow their client from. */
  pool: Pool;
  /**
   * The authenticated principal of a request (user id, account, API
   * client): required. `null`, `undefined` or `''` answers 401
   * `unauthenticated`. Never take it from a header the client chooses.
   */
  scope: (req: Req) => string | null | undefined | Promise<string | null | undefined>;
  /** The response headers stored and replayed (lower-cased); default `content-type`, `location`. */
  replayHeaders?: readonly string[];
  /** Changes to the mapping (status, title, detail, `Retry-After` of each case). */
  mapping?: MappingOverrides;
  /** `Retry-After` seconds of the cases that have it; default 1. */
  retryAfter?: number;
  /** The methods whose requests are idempotent; default `POST`, `PATCH`. */
  methods?: readonly string[];
  /** The largest request body read, in bytes; default 1 MiB (larger: 413 `payload-too-large`). */
  bodyLimit?: number;
  /**
   * The largest response stored, in bytes of its envelope's JSON text;
   * default 1 MiB. A larger one is rolled back and answered 500
   * `internal-error` (the retry runs again), so that no replay loads more.
   */
  responseLimit?: number;
  /**
   * Milliseconds a request waits for a client from the pool; past them it
   * is answered 503 `unavailable` with `Retry-After`. Default 10000 (the
   * pool's own `connectionTimeoutMillis` applies too, when it is shorter).
   */
  acquireTimeout?: number;
  /** Reports an error the client is answered 500 for (default: `console.error`). */
  onError?: (error: unknown) => void;
}

/** A route's settings, checked and resolved. */
export interface ResolvedRoute<Req> {
  operation: string | ((req: Req) => string) | undefined;
  fingerprint: readonly JsonPointer[] | undefined;
  ttl: string | null;
  keyRequired: boolean;
  retryable: (status: number) => boolean;
  isFinal: (error: unknown) => boolean;
  timeLimit: number | undefined;
}

/** The finalErrors setting as a predicate. */
function resolveFinalErrors(finalErrors: RouteOptions['finalErrors']): (error: unknown) => boolean {
  if (finalErrors === undefined) return noFinalErrors;
  if (typeof finalErrors === 'function') return finalErrors;
  if (!Array.isArray(finalErrors) || finalErrors.some((type) => typeof type !== 'function')) {
    throw new TypeError('finalErrors must be a list of error classes or a function of the error');
  }
  const types = [...finalErrors];
  return (error) => types.some((type) => error instanceof type);
}

const noFinalErrors = (): boolean => false;

/** The timeLimit setting, checked. */
function resolveTimeLimit(timeLimit: number): number {
  if (!Number.isInteger(timeLimit) || timeLimit <= 0) throw new TypeError('timeLimit must be a positive whole number of milliseconds');
  return timeLimit;
}

/** The ttl setting as an interval text, or null for the server's default. */
function resolveTtl(ttl: string | number | undefined): string | null {
  if (ttl === undefined) return null;
  if (typeof ttl === 'number') {
    if (!Number.isFinite(ttl) || ttl <= 0) throw new TypeError('ttl must be a positive number of seconds');
    return `${ttl} seconds`;
  }
  if (typeof ttl !== 'string' || ttl.trim() === '') throw new TypeError('ttl must be an interval text or seconds');
  return ttl;
}

/** The retryable setting as a predicate. */
function resolveRetryable(retryable: RouteOptions['retryable']): (status: number) => boolean {
  if (retryable === undefined) return defaultRetryable;
  if (typeof retryable === 'function') return retryable;
  if (!Array.isArray(retryable)) throw new TypeError('retryable must be a list of statuses or a function');
  const set = new Set<number>(retryable);
  return (status) => set.has(status);
}

/** Checks and resolves route options over defaults. */
export function resolveRoute<Req>(options: RouteOptions<Req>, defaults?: ResolvedRoute<Req>): ResolvedRoute<Req> {
  if (options.operation !== undefined && typeof options.operation !== 'function'
      && (typeof options.operation !== 'string' || options.operation === '')) {
    throw new TypeError('operation must be a non-empty string or a function of the request');
  }
  if (options.fingerprint !== undefined && !Array.isArray(options.fingerprint)) {
    throw new TypeError('fingerprint must be a list of JSON Pointers');
  }
  return {
    operation: options.operation ?? defaults?.operation,
    fingerprint: options.fingerprint !== undefined
      ? options.fingerprint.map(parseJsonPointer)
      : defaults?.fingerprint,
    ttl: options.ttl !== undefined ? resolveTtl(options.ttl) : (defaults?.ttl ?? null),
    keyRequired: options.keyRequired ?? defaults?.keyRequired ?? true,
    retryable: options.retryable !== undefined ? resolveRetryable(options.retryable) : (defaults?.retryable ?? defaultRetryable),
    isFinal: options.finalErrors !== undefined ? resolveFinalErrors(options.finalErrors) : (defaults?.isFinal ?? noFinalErrors),
    timeLimit: options.timeLimit !== undefined ? resolveTimeLimit(options.timeLimit) : defaults?.timeLimit,
  };
}

/** Double-quotes an SQL identifier. */
function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/** The answer to a request that does not run its handler: a replay or a problem. */
export interface Answer {
  kind: 'answer';
  response: CapturedResponse;
  /** The case, for an answer from the mapping; undefined for a replay. */
  problem?: ProblemCode;
}

/**
 * What a framework integration gives the handler of a request it reserved:
 * Express's `req.idempotency` (and `res.locals.idempotency`), Fastify's
 * `request.idempotency`.
 */
export interface IdempotencyContext {
  /** The client of the request's transaction: run the handler's SQL on it; do not release it or COMMIT. */
  readonly client: PoolClient;
  /** The key (unquoted). */
  readonly key: string;
  /** The principal the scope function returned. */
  readonly scope: string;
  /** The operation. */
  readonly operation: string;
  /** The open transaction. */
  readonly transaction: IdempotencyTransaction;
  /** @internal The error the request failed with, which makes the transaction roll back. */
  error?: unknown;
  /** @internal The route's finalErrors setting: a raised error that is completed, not rolled back. */
  readonly isFinal: (error: unknown) => boolean;
}

/** A request whose handler runs, holding its transaction. */
export interface Started {
  kind: 'new';
  transaction: IdempotencyTransaction;
}

/** An error with a SQLSTATE, as node-postgres throws them. */
function sqlstate(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

/**
 * The library for one pool: the checked settings, the mapping and the
 * extension's schema. Create it with {@link Idempotency.create}, which
 * checks the extension's version; the Express middleware and the Fastify
 * plugin do that for you.
 */
export class Idempotency<Req = unknown> {
  readonly pool: Pool;
  readonly mapping: Mapping;
  readonly retryAfter: number;
  readonly replayHeaders: ReadonlySet<string>;
  readonly methods: ReadonlySet<string>;
  readonly bodyLimit: number;
  readonly acquireTimeout: number;
  readonly responseLimit: number;
  readonly route: ResolvedRoute<Req>;
  readonly scope: (req: Req) => string | null | undefined | Promise<string | null | undefined>;
  readonly extension: ExtensionInfo;
  readonly onError: (error: unknown) => void;
  /** @internal The two calls, schema-qualified. */
  readonly sql: RunnerSql;

  private constructor(options: IdempotencyOptions<Req>, extension: ExtensionInfo) {
    this.pool = options.pool;
    this.scope = options.scope;
    this.mapping = resolveMapping(options.mapping);
    this.retryAfter = options.retryAfter ?? 1;
    this.replayHeaders = new Set((options.replayHeaders ?? ['content-type', 'location']).map((h) => h.toLowerCase()));
    this.methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
    this.bodyLimit = options.bodyLimit ?? 1024 * 1024;
    this.acquireTimeout = options.acquireTimeout ?? 10000;
    this.responseLimit = options.responseLimit ?? 1024 * 1024;
    this.route = resolveRoute(options);
    this.extension = extension;
    this.onError = options.onError ?? ((error) => console.error('pg-idempotency:', error));
    if (this.pool.listenerCount('error') === 0) {
      // node-postgres emits an idle client's lost connection (a server
      // restart) on the pool, which without a listener ends the process;
      // the pool drops that client and connects anew on the next request
      this.pool.on('error', (error) => this.onError(error));
    }
    const schema = quoteIdent(extension.schema);
    this.sql = {
      reserve: `SELECT r.outcome, r.response_status, r.response::text AS response, (r.response -> 'body')::text AS body
      FROM ${schema}.idem_reserve($1, $2, $3::jsonb, scope => $4, ttl => $5::interval) r`,
      complete: `SELECT ${schema}.idem_complete($1, $2, $3::jsonb, $4, scope => $5)`,
    };
  }

  /**
   * Checks the settings and the extension's version.
   *
   * @throws TypeError for a bad setting (no `scope` function, a bad JSON Pointer, ...).
   * @throws ExtensionVersionError when the extension is missing or older than 0.2.0.
   */
  static async create<Req = unknown>(options: IdempotencyOptions<Req>): Promise<Idempotency<Req>> {
    validateOptions(options);
    const extension = await checkExtensionVersion(options.pool);
    return new Idempotency(options, extension);
  }

  /** The answer for a case of the mapping. */
  problem(code: ProblemCode, detail?: string): Answer {
    return { kind: 'answer', response: problemResponse(this.mapping, code, this.retryAfter, detail), problem: code };
  }

  /** The answer for an error: its SQLSTATE's case, else `internal-error` (reported with `onError`). */
  errorAnswer(error: unknown, report = true): Answer {
    if (error instanceof UnsupportedEnvelopeError) return this.problem('unsupported-envelope');
    if (error instanceof KeyOutcomeError) return this.problem(OUTCOME_PROBLEMS[error.outcome]);
    if (error instanceof TimeLimitError) return this.problem('time-limit');
    if (error instanceof AcquireTimeoutError || isUnavailable(error)) return this.problem('unavailable');
    if (error instanceof FingerprintError) return this.problem('invalid-request', error.message);
    const code = sqlstateProblem(sqlstate(error));
    if (code === 'internal-error' && report) this.onError(error);
    return this.problem(code, code === 'invalid-request' ? (error as Error).message : undefined);
  }

  /** Parses the `Idempotency-Key` fields. */
  parseKey(fields: readonly string[]): KeyParse {
    return parseIdempotencyKey(fields);
  }

  /** The request document of a request, for a route's fingerprint setting. */
  requestDocument(request: FingerprintRequest, route: ResolvedRoute<Req> = this.route): string {
    return requestDocument(request, route.fingerprint);
  }

  /**
   * The core runner: runs `fn` under a key in one transaction (reserve;
   * on `new`, `fn` with the transaction's client; complete and COMMIT, or
   * ROLLBACK for a retryable status or a raised error that is not final).
   * The HTTP integrations are its callers.
   *
   * @param fn - gets the open transaction's client (run its SQL there; do
   *   not release it or COMMIT) and returns the completion: a status and
   *   the response to store as JSON text.
   * @param policy - the retryable statuses (default the route setting's)
   *   and the completion of a final error.
   * @returns `new` with the completion, after COMMIT (`committed` false
   *   when a retryable status rolled back), or `replay` with the stored
   *   status and response, `fn` not called.
   * @throws InProgressError, StuckError, MismatchError (a
   *   {@link KeyOutcomeError}) for those outcomes; any other error after
   *   ROLLBACK, as it was raised.
   */
  run(params: ReserveParams, fn: (client: PoolClient) => Promise<Completion>, policy: RunPolicy = {}): Promise<RunResult> {
    return runUnderKey(this.pool, this.sql, params, fn, { retryable: this.route.retryable, acquireTimeout: this.acquireTimeout, responseLimit: this.responseLimit, ...policy });
  }

  /**
   * Reserves the key for an HTTP request, through {@link run}. On `new`,
   * the transaction stays open for the handler: finish it with
   * {@link IdempotencyTransaction.finish} or {@link IdempotencyTransaction.fail}.
   * Every other outcome is answered here (a replay, or the mapping's answer).
   */
  async begin(params: ReserveParams, route: ResolvedRoute<Req> = this.route): Promise<Answer | Started> {
    const transaction = new IdempotencyTransaction(this);
    let reserved!: () => void;
    const handed = new Promise<undefined>((resolve) => { reserved = () => resolve(undefined); });
    const result = this.run(params, (client) => {
      transaction.attach(client, params, route.timeLimit);
      reserved();
      return transaction.completion;
    }, { retryable: route.retryable, timeLimit: route.timeLimit });
    transaction.result = result;
    result.catch((error: unknown) => transaction.timedOut(error));
    const first = await Promise.race([handed, result.then((r) => r, (error: unknown) => ({ error }))]);
    if (first === undefined) return { kind: 'new', transaction };
    if ('error' in first) return this.errorAnswer(first.error);
    if (first.outcome !== 'replay') return this.errorAnswer(new Error('the runner finished without running its function'));
    try {
      const response = decodeEnvelope(first.status, first.response, first.body, this.replayHeaders);
      response.headers['idempotent-replayed'] = 'true';
      return { kind: 'answer', response };
    } catch (error) {
      return this.errorAnswer(error);
    }
  }
}

/** The problem code of each outcome that is not an answer. */
const OUTCOME_PROBLEMS = { in_progress: 'in-progress', stuck: 'stuck', mismatch: 'mismatch' } as const satisfies Record<KeyOutcomeError['outcome'], ProblemCode>;

/** Checks the settings that need no database. */
function validateOptions(options: IdempotencyOptions<never>): void {
  if (options === null || typeof options !== 'object') throw new TypeError('pg-idempotency needs options');
  if (options.pool === undefined || typeof (options.pool as { connect?: unknown }).connect !== 'function') {
    throw new TypeError('pg-idempotency needs a node-postgres Pool as "pool"');
  }
  if (typeof options.scope !== 'function') {
    throw new TypeError('pg-idempotency needs a "scope" function that returns the authenticated principal of a request');
  }
  if (options.retryAfter !== undefined && (!Number.isInteger(options.retryAfter) || options.retryAfter < 0)) {
    throw new TypeError('retryAfter must be a whole number of seconds');
  }
  if (options.responseLimit !== undefined && (!Number.isInteger(options.responseLimit) || options.responseLimit < 0)) {
    throw new TypeError('responseLimit must be a whole number of bytes');
  }
  if (options.acquireTimeout !== undefined && (!Number.isInteger(options.acquireTimeout) || options.acquireTimeout <= 0)) {
    throw new TypeError('acquireTimeout must be a positive whole number of milliseconds');
  }
  if (options.bodyLimit !== undefined && (!Number.isInteger(options.bodyLimit) || options.bodyLimit < 0)) {
    throw new TypeError('bodyLimit must be a whole number of bytes');
  }
}

/**
 * A reserved key's open transaction, as an HTTP integration holds it: the
 * function {@link Idempotency.run} runs waits for {@link finish} (the
 * response, completed and committed) or {@link fail} (rolled back).
 */
export class IdempotencyTransaction {
  readonly #library: Idempotency<any>;
  #client: PoolClient | undefined;
  #params: ReserveParams | undefined;
  #timeLimit: number | undefined;
  #started = 0;
  #done = false;
  #complete!: (completion: Completion) => void;
  #abort!: (error: unknown) => void;
  /** @internal What the runner's function returns. */
  readonly completion: Promise<Completion>;
  /** @internal The runner's result. */
  result: Promise<RunResult> = Promise.resolve({ outcome: 'new', status: 0, response: null, committed: false });

  /** @internal */
  constructor(library: Idempotency<any>) {
    this.#library = library;
    this.completion = new Promise<Completion>((resolve, reject) => {
      this.#complete = resolve;
      this.#abort = reject;
    });
    // the runner awaits it once the key is reserved; a replay never does
    this.completion.catch(() => undefined);
  }

  /** @internal Called by the runner's function with the transaction's client. */
  attach(client: PoolClient, params: ReserveParams, timeLimit: number | undefined): void {
    this.#client = client;
    this.#params = params;
    this.#timeLimit = timeLimit;
    this.#started = Date.now();
  }

  /**
   * The mapping's answer for an error of the handler: a statement the time
   * limit's `statement_timeout` cancelled is 503 `time-limit`, as the
   * runner sees it.
   */
  answerFor(error: unknown, report = true): Answer {
    return this.#library.errorAnswer(pastTimeLimit(error, this.#timeLimit, this.#started), report);
  }

  /** The transaction's client: run the handler's SQL on it, and do not release it. */
  get client(): PoolClient {
    if (this.#client === undefined) throw new Error('this idempotency transaction has no client');
    return this.#client;
  }

  /** The reservation. */
  get params(): Readonly<ReserveParams> {
    if (this.#params === undefined) throw new Error('this idempotency transaction has no reservation');
    return this.#params;
  }

  /** True once finished or failed. */
  get done(): boolean {
    return this.#done;
  }

  /**
   * @internal Called by the integration with the answer to send at once
   * when the handler runs past the route's time limit (the transaction is
   * rolled back already); what the handler sends after it is not sent.
   */
  onTimeLimit: ((answer: Answer) => void) | undefined;

  /** @internal The runner failed before the handler finished: past the time limit, the answer goes out now. */
  timedOut(error: unknown): void {
    if (this.#done || !(error instanceof TimeLimitError)) return;
    this.#done = true;
    this.onTimeLimit?.(this.#library.errorAnswer(error));
  }

  /**
   * Ends the transaction with the handler's response: one that cannot be
   * sent rolls back (500 `internal-error`); a retryable status rolls
   * back; any other is completed with its envelope and committed.
   *
   * @returns the response to send: the handler's, or the mapping's answer
   *   when it could not be sent, or the completion or the COMMIT failed.
   */
  async finish(response: CapturedResponse): Promise<CapturedResponse> {
    if (this.#done) throw new Error('this idempotency transaction is already finished');
    this.#done = true;
    const library = this.#library;
    const reason = unsendable(response.status, response.headers);
    if (reason !== undefined) {
      // committed, it would be a record whose answer its server refuses to write
      const error = new UnsendableResponseError(reason);
      this.#abort(error);
      await this.result.catch(() => undefined);
      library.onError(error);
      return library.problem('internal-error').response;
    }
    this.#complete({ status: response.status, response: encodeEnvelope(response.headers, response.body, library.replayHeaders) });
    try {
      await this.result;
    } catch (error) {
      if (sqlstateProblem(sqlstate(error)) === 'invalid-request') {
        // the server cannot store the response (a body with \u0000 or a
        // lone surrogate): it is not the request's fault, and nothing is kept
        library.onError(error);
        return library.problem('internal-error').response;
      }
      return library.errorAnswer(error).response;
    }
    return response;
  }

  /**
   * Rolls back after the handler failed; the answer is its error's mapping.
   *
   * @param report - report an error answered 500 with `onError` (default
   *   true; false where the framework has reported it already).
   */
  async fail(error: unknown, report = true): Promise<Answer> {
    if (!this.#done) {
      this.#done = true;
      this.#abort(error);
      await this.result.catch(() => undefined);
    }
    return this.answerFor(error, report);
  }
}
