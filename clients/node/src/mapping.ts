/**
 * The mapping of outcomes and errors to HTTP answers (doc/clients.md, "The
 * mapping, as data"), and the `application/problem+json` bodies.
 *
 * @module
 */

/** The problem codes the library answers with. */
export type ProblemCode =
  | 'missing-key'
  | 'invalid-key'
  | 'unauthenticated'
  | 'invalid-request'
  | 'in-progress'
  | 'stuck'
  | 'mismatch'
  | 'read-only'
  | 'retry'
  | 'unavailable'
  | 'time-limit'
  | 'unsupported-envelope'
  | 'payload-too-large'
  | 'internal-error';

/** How one case is answered. */
export interface MappingEntry {
  /** The HTTP status. */
  status: number;
  /** The problem's `title`. */
  title: string;
  /** The problem's `detail` (for `invalid-request`, the extension's message replaces it). */
  detail: string;
  /**
   * `Retry-After`: `true` for the `retryAfter` setting, a number of seconds
   * of its own, `false` for none.
   */
  retryAfter: boolean | number;
}

/** The whole mapping, one entry per problem code. */
export type Mapping = Record<ProblemCode, MappingEntry>;

/** Changes to the mapping: per code, the members to replace. */
export type MappingOverrides = Partial<Record<ProblemCode, Partial<MappingEntry>>>;

/** The table of doc/clients.md. */
export const DEFAULT_MAPPING: Readonly<Mapping> = Object.freeze({
  'missing-key': {
    status: 400, title: 'Idempotency-Key missing', retryAfter: false,
    detail: 'This request needs an Idempotency-Key header.',
  },
  'invalid-key': {
    status: 400, title: 'Idempotency-Key malformed', retryAfter: false,
    detail: 'The Idempotency-Key header must be one sf-string, such as "8e03978e-40d5-43e8-bc93-6894a57f9324".',
  },
  unauthenticated: {
    status: 401, title: 'Unauthenticated', retryAfter: false,
    detail: 'The request has no authenticated principal.',
  },
  'invalid-request': {
    status: 400, title: 'Invalid request', retryAfter: false,
    detail: 'The request was refused by the database.',
  },
  'in-progress': {
    status: 409, title: 'Request in progress', retryAfter: true,
    detail: 'A request with this Idempotency-Key is still being processed.',
  },
  stuck: {
    status: 409, title: 'Request outcome unknown', retryAfter: true,
    detail: 'The outcome of the request with this Idempotency-Key is being checked.',
  },
  mismatch: {
    status: 422, title: 'Idempotency-Key reused', retryAfter: false,
    detail: 'This Idempotency-Key was already used with another request.',
  },
  'read-only': {
    status: 503, title: 'Database read-only', retryAfter: true,
    detail: 'The database is read-only; retry later.',
  },
  retry: {
    status: 503, title: 'Transaction conflict', retryAfter: true,
    detail: 'The transaction conflicted with another one; retry the request.',
  },
  unavailable: {
    status: 503, title: 'Database unavailable', retryAfter: true,
    detail: 'The database cannot be reached; retry later.',
  },
  'time-limit': {
    status: 503, title: 'Request time limit', retryAfter: true,
    detail: 'The request ran past its time limit and was rolled back; retry it.',
  },
  'unsupported-envelope': {
    status: 500, title: 'Stored response unreadable', retryAfter: false,
    detail: 'The stored response was written by a later version of the library, or cannot be read.',
  },
  'payload-too-large': {
    status: 413, title: 'Request body too large', retryAfter: false,
    detail: 'The request body is larger than this route accepts.',
  },
  'internal-error': {
    status: 500, title: 'Internal error', retryAfter: false,
    detail: 'The request failed and was rolled back.',
  },
} satisfies Mapping);

/** The mapping with the user's overrides applied. */
export function resolveMapping(overrides: MappingOverrides | undefined): Mapping {
  const mapping = {} as Mapping;
  for (const code of Object.keys(DEFAULT_MAPPING) as ProblemCode[]) {
    mapping[code] = { ...DEFAULT_MAPPING[code], ...(overrides?.[code] ?? {}) };
  }
  for (const code of Object.keys(overrides ?? {})) {
    if (!(code in DEFAULT_MAPPING)) throw new TypeError(`unknown problem code "${code}" in the mapping`);
  }
  return mapping;
}

/** The base of every problem's `type`: doc/clients.md, anchored by code. */
export const PROBLEM_TYPE_BASE = 'https://github.com/pg-idempotency/idempotency/blob/main/doc/clients.md#';

/** An RFC 9457 problem document. */
export interface ProblemDocument {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: string;
}

/**
 * The answer for a problem code, as a response: `application/problem+json`
 * with `Retry-After` where the mapping has it.
 */
export function problemResponse(
  mapping: Mapping,
  code: ProblemCode,
  retryAfter: number,
  detail?: string,
): { status: number; headers: Record<string, string>; body: Buffer } {
  const entry = mapping[code];
  const document: ProblemDocument = {
    type: PROBLEM_TYPE_BASE + code,
    title: entry.title,
    status: entry.status,
    detail: detail ?? entry.detail,
    code,
  };
  const headers: Record<string, string> = { 'content-type': 'application/problem+json' };
  if (entry.retryAfter !== false) {
    headers['retry-after'] = String(entry.retryAfter === true ? retryAfter : entry.retryAfter);
  }
  return { status: entry.status, headers, body: Buffer.from(JSON.stringify(document)) };
}

/**
 * The problem code of each SQLSTATE with a row of its own (doc/clients.md);
 * any other is `internal-error`. `22P02`, `22P05`, `22003`, `22021` and
 * `54001` are the server refusing the request document or the key as it
 * reads them ("Requests the server refuses").
 */
export const SQLSTATE_CODES: Readonly<Record<string, ProblemCode>> = Object.freeze({
  '22023': 'invalid-request',
  '22P02': 'invalid-request',
  '22P05': 'invalid-request',
  '22003': 'invalid-request',
  '22021': 'invalid-request',
  '54001': 'invalid-request',
  ID003: 'in-progress',
  ID004: 'mismatch',
  ID005: 'stuck',
  '25006': 'read-only',
  '40001': 'retry',
  '40P01': 'retry',
} satisfies Record<string, ProblemCode>);

/** The codes node-postgres and Node's sockets give a connection that cannot be made or was lost. */
const UNAVAILABLE_CODES: ReadonlySet<string> = new Set([
  'ECONNREFUSED', 'ECONNRESET', 'ENOENT', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN',
  '57P01', '57P02', '57P03',
]);

/**
 * Whether an error says the database cannot be reached: no connection
 * (refused, no socket, the server shutting down or starting: SQLSTATE
 * `57P01` to `57P03`, class `08`), none from the pool within its
 * `connectionTimeoutMillis`, or the connection lost before COMMIT.
 */
export function isUnavailable(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code === 'string' && (UNAVAILABLE_CODES.has(code) || /^08[0-9A-Z]{3}$/.test(code))) return true;
  const message = error instanceof Error ? error.message : '';
  return /^(Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Client was closed and is not queryable)/.test(message);
}

/** The problem code of a database error's SQLSTATE, or `internal-error`. */
export function sqlstateProblem(sqlstate: string | undefined): ProblemCode {
  return sqlstate !== undefined && Object.prototype.hasOwnProperty.call(SQLSTATE_CODES, sqlstate)
    ? SQLSTATE_CODES[sqlstate]!
    : 'internal-error';
}
