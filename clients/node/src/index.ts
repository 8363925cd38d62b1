/**
 * pg-idempotency: Idempotency-Key handling on the `idempotency` PostgreSQL
 * extension, with the request's record and its effect in one transaction.
 *
 * The framework integrations are `pg-idempotency/express` and
 * `pg-idempotency/fastify`; this entry point is the core they share.
 *
 * @packageDocumentation
 */

export {
  type Answer,
  defaultRetryable,
  Idempotency,
  type IdempotencyContext,
  type IdempotencyOptions,
  IdempotencyTransaction,
  type ReserveParams,
  type ResolvedRoute,
  resolveRoute,
  type RouteOptions,
  type Started,
} from './core.js';
export {
  AcquireTimeoutError,
  type Completion,
  InProgressError,
  KeyOutcomeError,
  MismatchError,
  type RunPolicy,
  ResponseTooLargeError,
  type RunResult,
  StuckError,
  TimeLimitError,
} from './runner.js';
export {
  type CapturedResponse,
  decodeEnvelope,
  encodeEnvelope,
  ENVELOPE_VERSION,
  type HeaderValues,
  UnsendableResponseError,
  unsendable,
  UnsupportedEnvelopeError,
} from './envelope.js';
export {
  evaluateJsonPointer,
  FingerprintDepthError,
  FingerprintError,
  FingerprintNumberError,
  type FingerprintRequest,
  FingerprintSubsetError,
  isJsonContentType,
  type JsonPointer,
  MAX_BODY_DEPTH,
  nestedDeeperThan,
  parseJsonPointer,
  type RequestBody,
  requestBody,
  requestDocument,
} from './fingerprint.js';
export { headerFields, type KeyParse, parseIdempotencyKey } from './key.js';
export {
  DEFAULT_MAPPING,
  type Mapping,
  type MappingEntry,
  type MappingOverrides,
  PROBLEM_TYPE_BASE,
  type ProblemCode,
  type ProblemDocument,
  problemResponse,
  resolveMapping,
  SQLSTATE_CODES,
  sqlstateProblem,
} from './mapping.js';
export { checkExtensionVersion, compareVersions, type ExtensionInfo, ExtensionVersionError, MINIMUM_EXTENSION_VERSION } from './version.js';
