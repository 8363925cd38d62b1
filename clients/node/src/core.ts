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
  problemResponse,
  resolveMapping,
  sqlstateProblem,
} from './mapping.js';
import { checkExtensionVersion, type ExtensionInfo } from './version.js';

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
  /** Reports an error the client is answered 500 for (default: `console.error`). */
  onError?: (error: unknown) => void;
}

/** The default of {@link RouteOptions.retryable}: every 5xx, 408 and 429. */
export const defaultRetryable = (status: number): boolean => status >= 500 || status === 408 || status === 429;

/** A route's settings, checked and resolved. */
export interface ResolvedRoute<Req> {
  operation: string | ((req: Req) => string) | undefined;
  fingerprint: readonly JsonPointer[] | undefined;
  ttl: string | null;
  keyRequired: boolean;
  retryable: (status: number) => boolean;
  isFinal: (error: unknown) => boolean;
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
  };
}

/** Double-quotes an SQL identifier. */
function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

/** What one request reserves. */
export interface ReserveParams {
  operation: string;
  key: string;
  scope: string;
  /** The request document (JSON text), from {@link requestDocument}. */
  request: string;
  /** An interval text, or null for the server's default. */
  ttl: string | null;
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
  readonly route: ResolvedRoute<Req>;
  readonly scope: (req: Req) => string | null | undefined | Promise<string | null | undefined>;
  readonly extension: ExtensionInfo;
  readonly onError: (error: unknown) => void;
  /** @internal The two calls, schema-qualified. */
  readonly sql: { readonly reserve: string; readonly complete: string };

  private constructor(options: IdempotencyOptions<Req>, extension: ExtensionInfo) {
    this.pool = options.pool;
    this.scope = options.scope;
    this.mapping = resolveMapping(options.mapping);
    this.retryAfter = options.retryAfter ?? 1;
    this.replayHeaders = new Set((options.replayHeaders ?? ['content-type', 'location']).map((h) => h.toLowerCase()));
    this.methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
    this.bodyLimit = options.bodyLimit ?? 1024 * 1024;
    this.route = resolveRoute(options);
    this.extension = extension;
    this.onError = options.onError ?? ((error) => console.error('pg-idempotency:', error));
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
   * Borrows a client, BEGINs and reserves the key. On `new`, the
   * transaction stays open for the handler: finish it with
   * {@link IdempotencyTransaction.finish} or {@link IdempotencyTransaction.fail}.
   * Every other outcome is answered here (the client is released).
   */
  async begin(params: ReserveParams): Promise<Answer | Started> {
    let client: PoolClient;
    try {
      client = await this.pool.connect();
    } catch (error) {
      return this.errorAnswer(error);
    }
    guard(client);
    let outcome: string;
    let row: { outcome: string; response_status: number | null; response: string | null; body: string | null };
    try {
      await client.query('BEGIN');
      const result = await client.query<typeof row>(this.sql.reserve, [
        params.operation, params.key, params.request, params.scope, params.ttl,
      ]);
      row = result.rows[0]!;
      outcome = row.outcome;
      if (outcome === 'new') {
        return { kind: 'new', transaction: new IdempotencyTransaction(this, client, params) };
      }
      await client.query('COMMIT');
    } catch (error) {
      await rollbackAndRelease(client, error);
      return this.errorAnswer(error);
    }
    release(client);
    switch (outcome) {
      case 'replay':
        try {
          const response = decodeEnvelope(row.response_status ?? 200, row.response, row.body, this.replayHeaders);
          response.headers['idempotent-replayed'] = 'true';
          return { kind: 'answer', response };
        } catch (error) {
          return this.errorAnswer(error);
        }
      case 'in_progress':
        return this.problem('in-progress');
      case 'stuck':
        return this.problem('stuck');
      case 'mismatch':
        return this.problem('mismatch');
      default:
        return this.errorAnswer(new Error(`idem_reserve answered an unknown outcome "${outcome}"`));
    }
  }

  /**
   * Runs one request in one transaction: reserve; on `new`, the handler
   * with the transaction's client; then complete and COMMIT, or ROLLBACK
   * when the handler throws or returns a retryable status. The commit is
   * never abandoned: nothing here listens for the HTTP client going away.
   *
   * @returns the response to send: the handler's, a replay's, or the
   *   mapping's answer (also for an error the handler throws, after the ROLLBACK).
   */
  async run(
    params: ReserveParams,
    handler: (client: PoolClient) => Promise<CapturedResponse>,
    route: ResolvedRoute<Req> = this.route,
  ): Promise<CapturedResponse> {
    const begun = await this.begin(params);
    if (begun.kind === 'answer') return begun.response;
    let response: CapturedResponse;
    try {
      response = await handler(begun.transaction.client);
    } catch (error) {
      return (await begun.transaction.fail(error)).response;
    }
    return begun.transaction.finish(response, route.retryable);
  }
}

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
  if (options.bodyLimit !== undefined && (!Number.isInteger(options.bodyLimit) || options.bodyLimit < 0)) {
    throw new TypeError('bodyLimit must be a whole number of bytes');
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
async function rollbackAndRelease(client: PoolClient, cause: unknown): Promise<void> {
  try {
    await client.query('ROLLBACK');
    release(client);
  } catch (error) {
    release(client, error instanceof Error ? error : new Error(String(cause)));
  }
}

/** A reserved key's open transaction, with the client the handler's SQL runs on. */
export class IdempotencyTransaction {
  /** The transaction's client: run the handler's SQL on it, and do not release it. */
  readonly client: PoolClient;
  /** The reservation. */
  readonly params: Readonly<ReserveParams>;
  readonly #library: Idempotency<never>;
  #done = false;

  /** @internal */
  constructor(library: Idempotency<any>, client: PoolClient, params: ReserveParams) {
    this.#library = library;
    this.client = client;
    this.params = params;
  }

  /** True once finished or failed. */
  get done(): boolean {
    return this.#done;
  }

  /**
   * Ends the transaction with the handler's response: a retryable status
   * rolls back; any other is completed with its envelope and committed.
   *
   * @returns the response to send: the handler's, or the mapping's answer
   *   when the completion or the COMMIT failed.
   */
  async finish(response: CapturedResponse, retryable: (status: number) => boolean): Promise<CapturedResponse> {
    if (this.#done) throw new Error('this idempotency transaction is already finished');
    this.#done = true;
    const { client, params } = this;
    const reason = unsendable(response.status, response.headers);
    if (reason !== undefined) {
      // committed, it would be a record whose answer its server refuses to write
      await rollbackAndRelease(client, null);
      this.#library.onError(new UnsendableResponseError(reason));
      return this.#library.problem('internal-error').response;
    }
    if (retryable(response.status)) {
      await rollbackAndRelease(client, null);
      return response;
    }
    try {
      await client.query(this.#library.sql.complete, [
        params.operation, params.key,
        encodeEnvelope(response.headers, response.body, this.#library.replayHeaders),
        response.status, params.scope,
      ]);
      await client.query('COMMIT');
    } catch (error) {
      await rollbackAndRelease(client, error);
      if (sqlstateProblem(sqlstate(error)) === 'invalid-request') {
        // the server cannot store the response (a body with \u0000 or a
        // lone surrogate): it is not the request's fault, and nothing is kept
        this.#library.onError(error);
        return this.#library.problem('internal-error').response;
      }
      return this.#library.errorAnswer(error).response;
    }
    release(client);
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
      await rollbackAndRelease(this.client, error);
    }
    return this.#library.errorAnswer(error, report);
  }
}
