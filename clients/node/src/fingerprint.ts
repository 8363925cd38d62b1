/**
 * The request document whose `idem_hash` is the fingerprint (doc/clients.md,
 * "The fingerprint"): `{"method", "path", "body" | "body_base64"}`.
 *
 * @module
 */

/**
 * True when a `Content-Type` names JSON: `application/json` or any
 * `type/subtype+json`, with or without parameters.
 */
export function isJsonContentType(contentType: string | undefined | null): boolean {
  if (!contentType) return false;
  const media = contentType.split(';', 1)[0]!.trim().toLowerCase();
  if (media === 'application/json') return true;
  return /^[!#$%&'*+.^_`|~0-9a-z-]+\/[!#$%&'*+.^_`|~0-9a-z-]+\+json$/.test(media);
}

/**
 * The deepest nesting of arrays and objects a body may have and still be
 * JSON to the library, the same in every language (doc/clients.md, "The
 * fingerprint"): a body nested deeper is bytes (`body_base64`).
 */
export const MAX_BODY_DEPTH = 256;

/** True when a parsed value has arrays and objects nested more than `limit` levels deep. */
export function nestedDeeperThan(value: unknown, limit: number): boolean {
  if (value === null || typeof value !== 'object') return false;
  const level: Array<[object, number]> = [[value, 1]];
  for (let next = level.pop(); next !== undefined; next = level.pop()) {
    const [container, depth] = next;
    for (const member of Array.isArray(container) ? container : Object.values(container)) {
      if (member !== null && typeof member === 'object') {
        if (depth === limit) return true;
        level.push([member as object, depth + 1]);
      }
    }
  }
  return false;
}

/** A parsed RFC 6901 JSON Pointer: its source text and reference tokens. */
export interface JsonPointer {
  readonly source: string;
  readonly tokens: readonly string[];
}

/**
 * Parses an RFC 6901 JSON Pointer (`""`, `/a`, `/a~1b/0`).
 *
 * @throws TypeError when the text is not a JSON Pointer.
 */
export function parseJsonPointer(source: string): JsonPointer {
  if (typeof source !== 'string') throw new TypeError('a JSON Pointer must be a string');
  if (source === '') return { source, tokens: [] };
  if (!source.startsWith('/')) {
    throw new TypeError(`"${source}" is not a JSON Pointer: it must be empty or begin with "/"`);
  }
  const tokens = source.slice(1).split('/').map((token) => {
    if (/~(?![01])/.test(token)) {
      throw new TypeError(`"${source}" is not a JSON Pointer: "~" must be followed by "0" or "1"`);
    }
    return token.replace(/~1/g, '/').replace(/~0/g, '~');
  });
  return { source, tokens };
}

/** The value a pointer finds in a document, or `undefined` where it finds none. */
export function evaluateJsonPointer(document: unknown, pointer: JsonPointer): unknown {
  let value: unknown = document;
  for (const token of pointer.tokens) {
    if (Array.isArray(value)) {
      if (!/^(0|[1-9][0-9]*)$/.test(token)) return undefined;
      const index = Number(token);
      if (index >= value.length) return undefined;
      value = value[index];
    } else if (value !== null && typeof value === 'object') {
      if (!Object.prototype.hasOwnProperty.call(value, token)) return undefined;
      value = (value as Record<string, unknown>)[token];
    } else {
      return undefined;
    }
  }
  return value;
}

/** The parts of a request that make its fingerprint. */
export interface FingerprintRequest {
  /** The HTTP method (any case). */
  method: string;
  /** The path as sent, with or without the query string (which is dropped). */
  path: string;
  /** The request's `Content-Type`. */
  contentType?: string | undefined | null;
  /** The body's bytes; `undefined` or empty for no body. */
  rawBody?: Uint8Array | undefined;
  /**
   * The body already parsed as JSON by a body parser that ran before, when
   * its bytes are gone (Express's `express.json()`); only read when
   * `rawBody` is not given.
   */
  parsedBody?: { value: unknown } | undefined;
}

/** A request whose fingerprint cannot be computed: answered 400 `invalid-request`. */
export class FingerprintError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FingerprintError';
  }
}

/** A fingerprint subset on a request without a JSON body. */
export class FingerprintSubsetError extends FingerprintError {
  constructor() {
    super('The fingerprint of this route is a subset of a JSON body, and the request has no JSON body.');
    this.name = 'FingerprintSubsetError';
  }
}

/**
 * A number beyond a double in a body the library writes again (a subset,
 * or a body parsed before it), which `JSON.parse` made `Infinity`: the
 * server refuses it as well (SQLSTATE 22003) where the text reaches it.
 */
export class FingerprintNumberError extends FingerprintError {
  constructor() {
    super('The request body has a number beyond the range of a double.');
    this.name = 'FingerprintNumberError';
  }
}

/**
 * A body parsed before the middleware (`express.json()`) nested deeper than
 * {@link MAX_BODY_DEPTH}: the library would hash such a body as its bytes,
 * which the parser did not keep.
 */
export class FingerprintDepthError extends FingerprintError {
  constructor() {
    super(`The request body is JSON nested more than ${MAX_BODY_DEPTH} levels deep, and its bytes were not kept: give the route a raw body parser.`);
    this.name = 'FingerprintDepthError';
  }
}

/** JSON text of a parsed value, refusing the `Infinity` of a number out of range (not `null`, as `JSON.stringify` writes it). */
function stringifyParsed(value: unknown): string {
  return JSON.stringify(value, (_key, member: unknown) => {
    if (typeof member === 'number' && !Number.isFinite(member)) throw new FingerprintNumberError();
    return member;
  });
}

/** The body of a request as the fingerprint sees it. */
export interface RequestBody {
  /**
   * `json`: `text` is the JSON text and `value` its parsed value. `bytes`:
   * hashed as `bytes`; `value` is set where they are JSON nested deeper
   * than {@link MAX_BODY_DEPTH}, which the handler gets parsed all the same.
   */
  kind: 'json' | 'bytes' | 'empty';
  text?: string;
  value?: unknown;
  bytes?: Buffer;
}

const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * Classifies a request's body: JSON (it parses), other bytes, or empty.
 *
 * @throws FingerprintNumberError for a parsed body with a number beyond a double.
 * @throws FingerprintDepthError for a parsed body nested deeper than {@link MAX_BODY_DEPTH}.
 */
export function requestBody(request: FingerprintRequest): RequestBody {
  const json = isJsonContentType(request.contentType);
  if (request.rawBody === undefined && request.parsedBody !== undefined) {
    const value = request.parsedBody.value;
    if (typeof value === 'string' || value instanceof Uint8Array) {
      // a text or raw parser kept the bytes
      return requestBody({ ...request, rawBody: Buffer.from(value), parsedBody: undefined });
    }
    if (json && value !== undefined) {
      if (nestedDeeperThan(value, MAX_BODY_DEPTH)) throw new FingerprintDepthError();
      return { kind: 'json', text: stringifyParsed(value), value };
    }
    return { kind: 'empty' };
  }
  const bytes = request.rawBody ? Buffer.from(request.rawBody.buffer, request.rawBody.byteOffset, request.rawBody.byteLength) : Buffer.alloc(0);
  if (bytes.length === 0) return { kind: 'empty' };
  if (json) {
    try {
      // UTF-8 or not JSON (a bad byte would otherwise be read as U+FFFD, and
      // two bodies would share a fingerprint); a BOM stays, and is not JSON.
      const text = utf8.decode(bytes);
      // Parsed to check it is JSON; the document sends the text itself, so
      // that the server reads every number exactly as the client wrote it.
      const value: unknown = JSON.parse(text);
      if (!nestedDeeperThan(value, MAX_BODY_DEPTH)) return { kind: 'json', text, value };
      // hashed as bytes, and JSON to the handler all the same
      return { kind: 'bytes', bytes, value };
    } catch {
      // not JSON after all: hashed as bytes
    }
  }
  return { kind: 'bytes', bytes };
}

/**
 * The request document sent as `idem_reserve`'s `request`, as JSON text.
 *
 * @param subset - JSON Pointers naming the body members that make two
 *   requests the same; `undefined` for the whole body.
 * @throws FingerprintSubsetError for a subset on a request without a JSON body.
 * @throws FingerprintNumberError for a subset member with a number beyond a double.
 */
export function requestDocument(
  request: FingerprintRequest,
  subset?: readonly JsonPointer[],
  body: RequestBody = requestBody(request),
): string {
  const path = request.path.split('?', 1)[0]!;
  let doc = `{"method":${JSON.stringify(request.method.toUpperCase())},"path":${JSON.stringify(path)}`;
  if (subset !== undefined) {
    if (body.kind !== 'json') throw new FingerprintSubsetError();
    const members: Record<string, unknown> = {};
    for (const pointer of subset) {
      const found = evaluateJsonPointer(body.value, pointer);
      members[pointer.source] = found === undefined ? null : found;
    }
    doc += `,"body":${stringifyParsed(members)}`;
  } else if (body.kind === 'json') {
    doc += `,"body":${body.text!}`;
  } else if (body.kind === 'bytes') {
    doc += `,"body_base64":${JSON.stringify(body.bytes!.toString('base64'))}`;
  }
  return `${doc}}`;
}
