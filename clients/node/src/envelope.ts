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
    if (replayHeaders.has(lower)) stored[lower] = headerString(value);
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

/** A stored envelope whose version this library cannot read. */
export class UnsupportedEnvelopeError extends Error {
  /** The version found. */
  readonly version: unknown;

  constructor(version: unknown) {
    super(`The stored response has envelope version ${JSON.stringify(version)}; this library reads version ${ENVELOPE_VERSION}.`);
    this.name = 'UnsupportedEnvelopeError';
    this.version = version;
  }
}

/**
 * The response a stored record replays.
 *
 * @param status - `response_status`.
 * @param responseText - `response::text` (jsonb's formatting), or null.
 * @param bodyText - `(response -> 'body')::text`, or null: the stored JSON
 *   body in jsonb's formatting.
 * @throws UnsupportedEnvelopeError for an envelope of a later version.
 */
export function decodeEnvelope(status: number, responseText: string | null, bodyText: string | null): CapturedResponse {
  if (responseText === null) return { status, headers: {}, body: Buffer.alloc(0) };
  const response: unknown = JSON.parse(responseText);
  if (response === null || typeof response !== 'object' || Array.isArray(response) || !('v' in response)) {
    // completed by plain SQL: the response is the JSON body
    return { status, headers: { 'content-type': 'application/json' }, body: Buffer.from(responseText) };
  }
  const envelope = response as { v: unknown; headers?: unknown; body_base64?: unknown };
  if (envelope.v !== ENVELOPE_VERSION) throw new UnsupportedEnvelopeError(envelope.v);
  const headers: Record<string, string> = {};
  if (envelope.headers !== null && typeof envelope.headers === 'object') {
    for (const [name, value] of Object.entries(envelope.headers as Record<string, unknown>)) {
      if (typeof value === 'string') headers[name.toLowerCase()] = value;
    }
  }
  let body = Buffer.alloc(0);
  if (bodyText !== null && 'body' in envelope) {
    body = Buffer.from(bodyText);
  } else if (typeof envelope.body_base64 === 'string') {
    body = Buffer.from(envelope.body_base64, 'base64');
  }
  return { status, headers, body };
}
