/**
 * The response envelope stored in `idem_keys.response` (doc/clients.md,
 * "The response envelope"): `{"v": 1, "headers": {...}, "body" | "body_base64"}`.
 *
 * @module
 */

import { isJsonContentType, MAX_BODY_DEPTH, nestedDeeperThan } from './fingerprint.js';

/** The envelope version this library writes and the highest it reads. */
export const ENVELOPE_VERSION = 1;

/** A response as the library stores, replays and sends it. */
export interface CapturedResponse {
  status: number;
  /** Lower-cased header names; several values joined with `, `. */
  headers: Record<string, string>;
  body: Buffer;
}

/** Header values as Node's `OutgoingMessage.getHeaders()` gives them. */
export type HeaderValues = Record<string, number | string | readonly string[] | undefined>;

/**
 * Framing and hop-by-hop headers: never stored or replayed from a record,
 * even when allow-listed; the server frames the replayed body itself.
 */
export const NEVER_REPLAYED: ReadonlySet<string> = new Set([
  'content-length', 'transfer-encoding', 'connection', 'keep-alive', 'te', 'trailer', 'upgrade', 'proxy-connection',
]);

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const VISIBLE = /^(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?$/;

/** An RFC 9110 token: what a header name must be. */
export function isHeaderName(name: string): boolean {
  return TOKEN.test(name);
}

/**
 * What every server here writes as a header value: visible ASCII (0x21 to
 * 0x7E) with spaces and tabs inside it; no control character (CR, LF,
 * NUL), nothing above 0x7E.
 */
export function isHeaderValue(value: string): boolean {
  return VISIBLE.test(value);
}

/**
 * Why a response cannot be sent as it is (doc/clients.md, "Only what can be
 * sent is committed"), or undefined when it can: a status outside 200 to
 * 599, a header name that is not a token, a header value that is not
 * visible ASCII.
 */
export function unsendable(status: number, headers: HeaderValues): string | undefined {
  if (!Number.isInteger(status) || status < 200 || status > 599) return `the status ${status} is not 200 to 599`;
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    if (!isHeaderName(name)) return `the header name ${JSON.stringify(name)} is not a token`;
    for (const one of Array.isArray(value) ? value : [value]) {
      if (!isHeaderValue(String(one))) return `the value of the header ${JSON.stringify(name)} is not visible ASCII`;
    }
  }
  return undefined;
}

/** A response the library refuses to commit, as it could not be sent as it is. */
export class UnsendableResponseError extends Error {
  constructor(reason: string) {
    super(`The response cannot be sent, so it was rolled back: ${reason}.`);
    this.name = 'UnsendableResponseError';
  }
}

/** A header value as one string: several values joined with `, `. */
export function headerString(value: number | string | readonly string[]): string {
  return Array.isArray(value) ? value.join(', ') : String(value);
}

/**
 * The envelope of a response, as JSON text.
 *
 * @param headers - the response headers (any case).
 * @param body - the body's bytes.
 * @param replayHeaders - the allow-list, lower-cased.
 */
export function encodeEnvelope(headers: HeaderValues, body: Uint8Array, replayHeaders: ReadonlySet<string>): string {
  const stored: Record<string, string> = {};
  let contentType: string | undefined;
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    const lower = name.toLowerCase();
    if (lower === 'content-type') contentType = headerString(value);
    if (replayHeaders.has(lower) && !NEVER_REPLAYED.has(lower)) stored[lower] = headerString(value);
  }
  let envelope = `{"v":${ENVELOPE_VERSION},"headers":${JSON.stringify(stored)}`;
  const bytes = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  if (bytes.length > 0) {
    let json: string | undefined;
    if (isJsonContentType(contentType)) {
      const text = bytes.toString('utf8');
      try {
        if (!nestedDeeperThan(JSON.parse(text), MAX_BODY_DEPTH)) json = text;
      } catch {
        // stored as bytes
      }
    }
    envelope += json !== undefined ? `,"body":${json}` : `,"body_base64":${JSON.stringify(bytes.toString('base64'))}`;
  }
  return `${envelope}}`;
}

/**
 * A stored record this library cannot read: an envelope of a later
 * version, or one that breaks the envelope's rules (doc/clients.md, "The
 * response envelope"). Answered 500 `unsupported-envelope`.
 */
export class UnsupportedEnvelopeError extends Error {
  /** The version found. */
  readonly version: unknown;

  constructor(version: unknown, reason?: string) {
    super(reason === undefined
      ? `The stored response has envelope version ${JSON.stringify(version)}; this library reads version ${ENVELOPE_VERSION}.`
      : `The stored response cannot be read: ${reason}.`);
    this.name = 'UnsupportedEnvelopeError';
    this.version = version;
  }
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/**
 * The response a stored record replays: the stored headers that are on the
 * allow-list now, never a framing or hop-by-hop one.
 *
 * @param status - `response_status`.
 * @param responseText - `response::text` (jsonb's formatting), or null.
 * @param bodyText - `(response -> 'body')::text`, or null: the stored JSON
 *   body in jsonb's formatting.
 * @param replayHeaders - the allow-list, lower-cased.
 * @throws UnsupportedEnvelopeError for an envelope of a later version, or
 *   one that cannot be read: `v` not the number 1, `headers` not an object
 *   of strings, a header that cannot be sent, both `body` and
 *   `body_base64`, or `body_base64` not padded base64.
 */
export function decodeEnvelope(
  status: number,
  responseText: string | null,
  bodyText: string | null,
  replayHeaders: ReadonlySet<string>,
): CapturedResponse {
  if (responseText === null) return { status, headers: {}, body: Buffer.alloc(0) };
  const response: unknown = JSON.parse(responseText);
  if (response === null || typeof response !== 'object' || Array.isArray(response) || !('v' in response)) {
    // completed by plain SQL: the response is the JSON body
    return { status, headers: { 'content-type': 'application/json' }, body: Buffer.from(responseText) };
  }
  const envelope = response as { v: unknown; headers?: unknown; body?: unknown; body_base64?: unknown };
  if (typeof envelope.v === 'number' && envelope.v > ENVELOPE_VERSION) throw new UnsupportedEnvelopeError(envelope.v);
  if (envelope.v !== ENVELOPE_VERSION) throw new UnsupportedEnvelopeError(envelope.v, `"v" is ${JSON.stringify(envelope.v)}, not 1`);
  const headers: Record<string, string> = {};
  if (envelope.headers !== undefined) {
    if (envelope.headers === null || typeof envelope.headers !== 'object' || Array.isArray(envelope.headers)) {
      throw new UnsupportedEnvelopeError(envelope.v, '"headers" is not an object');
    }
    for (const [name, value] of Object.entries(envelope.headers as Record<string, unknown>)) {
      if (typeof value !== 'string') throw new UnsupportedEnvelopeError(envelope.v, `the header ${JSON.stringify(name)} is not a string`);
      if (!isHeaderName(name) || !isHeaderValue(value)) {
        throw new UnsupportedEnvelopeError(envelope.v, `the header ${JSON.stringify(name)} cannot be sent`);
      }
      const lower = name.toLowerCase();
      if (replayHeaders.has(lower) && !NEVER_REPLAYED.has(lower)) headers[lower] = value;
    }
  }
  if ('body' in envelope && 'body_base64' in envelope) {
    throw new UnsupportedEnvelopeError(envelope.v, 'it has both "body" and "body_base64"');
  }
  let body = Buffer.alloc(0);
  if ('body' in envelope) {
    body = Buffer.from(bodyText ?? JSON.stringify(envelope.body));
  } else if ('body_base64' in envelope) {
    if (typeof envelope.body_base64 !== 'string' || !BASE64.test(envelope.body_base64)) {
      throw new UnsupportedEnvelopeError(envelope.v, '"body_base64" is not padded base64');
    }
    body = Buffer.from(envelope.body_base64, 'base64');
  }
  return { status, headers, body };
}
