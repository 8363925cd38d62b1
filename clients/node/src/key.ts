/**
 * The `Idempotency-Key` header, parsed as draft-ietf-httpapi-idempotency-key-header
 * defines it: one RFC 8941 sf-string field (`"..."`), or the bare value.
 *
 * @module
 */

/** The result of {@link parseIdempotencyKey}. */
export type KeyParse =
  | { readonly kind: 'missing' }
  | { readonly kind: 'invalid'; readonly reason: string }
  | { readonly kind: 'key'; readonly key: string };

const isOws = (c: string): boolean => c === ' ' || c === '\t';

/** Trims the optional white space (spaces and tabs) of a field value. */
function trimOws(value: string): string {
  let start = 0;
  let end = value.length;
  while (start < end && isOws(value[start]!)) start++;
  while (end > start && isOws(value[end - 1]!)) end--;
  return value.slice(start, end);
}

/** True for the characters an sf-string may hold: printable ASCII. */
const isPrintable = (code: number): boolean => code >= 0x20 && code <= 0x7e;

/**
 * Parses the `Idempotency-Key` fields of a request.
 *
 * @param fields - every `Idempotency-Key` field of the request, in order, as
 *   the client sent them (in Node, from `req.rawHeaders`, since
 *   `req.headers` joins repeated fields with `, `); empty when there is none.
 * @returns `missing` without a field; `invalid` (with the reason, a sentence)
 *   for more than one field, a list, a malformed sf-string, sf-string
 *   parameters or an empty key; else the key: `"abc"` and `abc` are one key.
 */
export function parseIdempotencyKey(fields: readonly string[]): KeyParse {
  if (fields.length === 0) return { kind: 'missing' };
  if (fields.length > 1) {
    return { kind: 'invalid', reason: 'The request has more than one Idempotency-Key field.' };
  }
  const value = trimOws(fields[0]!);
  if (value.startsWith('"')) return parseSfString(value);
  if (value === '') return { kind: 'invalid', reason: 'The Idempotency-Key is empty.' };
  // a bare value's characters are the extension's to check (its 22023)
  if (value.includes(',')) {
    return { kind: 'invalid', reason: 'The Idempotency-Key field holds a list; it must hold one key.' };
  }
  return { kind: 'key', key: value };
}

/** Parses a field value that begins with a double quote as one sf-string. */
function parseSfString(value: string): KeyParse {
  let key = '';
  let i = 1;
  for (;;) {
    if (i >= value.length) {
      return { kind: 'invalid', reason: 'The quoted Idempotency-Key is not closed.' };
    }
    const c = value[i]!;
    const code = value.charCodeAt(i);
    if (c === '\\') {
      const next = value[i + 1];
      if (next !== '"' && next !== '\\') {
        return {
          kind: 'invalid',
          reason: 'The quoted Idempotency-Key has an escape other than \\" or \\\\.',
        };
      }
      key += next;
      i += 2;
    } else if (c === '"') {
      i++;
      break;
    } else if (!isPrintable(code)) {
      return {
        kind: 'invalid',
        reason: 'The quoted Idempotency-Key has a character outside printable ASCII.',
      };
    } else {
      key += c;
      i++;
    }
  }
  if (i < value.length) {
    const rest = value.slice(i);
    const reason = rest.trimStart().startsWith(',')
      ? 'The Idempotency-Key field holds a list; it must hold one key.'
      : 'The Idempotency-Key has something after its closing quote (sf-string parameters are not accepted).';
    return { kind: 'invalid', reason };
  }
  if (key === '') return { kind: 'invalid', reason: 'The Idempotency-Key is empty.' };
  return { kind: 'key', key };
}

/**
 * The values of every field named `name` (case-insensitive) in Node's
 * `rawHeaders` list (`[name, value, name, value, ...]`).
 */
export function headerFields(rawHeaders: readonly string[], name: string): string[] {
  const lower = name.toLowerCase();
  const values: string[] = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if (rawHeaders[i]!.toLowerCase() === lower) values.push(rawHeaders[i + 1]!);
  }
  return values;
}
