// The parts that need no database: the key parser, JSON Pointers, the
// request document, the envelope and the mapping.

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  decodeEnvelope, DEFAULT_MAPPING, encodeEnvelope, unsendable, headerFields, parseIdempotencyKey, parseJsonPointer,
  problemResponse, requestDocument, resolveMapping, UnsupportedEnvelopeError, evaluateJsonPointer, compareVersions,
} from '../src/index.js';

describe('parseIdempotencyKey', () => {
  const key = (...fields: string[]) => parseIdempotencyKey(fields);
  it('takes the quoted sf-string and the bare form as one key', () => {
    assert.deepEqual(key('"abc"'), { kind: 'key', key: 'abc' });
    assert.deepEqual(key('abc'), { kind: 'key', key: 'abc' });
    assert.deepEqual(key(' \t"abc"  '), { kind: 'key', key: 'abc' });
    assert.deepEqual(key('  abc\t'), { kind: 'key', key: 'abc' });
  });
  it('unescapes \\" and \\\\', () => {
    assert.deepEqual(key('"a\\"b\\\\c"'), { kind: 'key', key: 'a"b\\c' });
    assert.deepEqual(key('"a b"'), { kind: 'key', key: 'a b' });
    // a bare value is the key as it is but for a comma, as in every language
    assert.deepEqual(key('ab"c'), { kind: 'key', key: 'ab"c' });
    assert.deepEqual(key('caf\u00e9'), { kind: 'key', key: 'caf\u00e9' });
  });
  it('is missing without a field', () => assert.deepEqual(key(), { kind: 'missing' }));
  for (const [label, fields] of [
    ['two fields', ['a', 'b']],
    ['a list of sf-strings', ['"a", "b"']],
    ['a bare list', ['a, b']],
    ['an unclosed string', ['"abc']],
    ['an escape other than \\" and \\\\', ['"a\\nb"']],
    ['a trailing backslash', ['"abc\\']],
    ['sf-string parameters', ['"a";p=1']],
    ['text after the closing quote', ['"a" b']],
    ['a control character', ['"a\u0001b"']],
    ['a character over 0x7E', ['"caf\u00e9"']],
    ['an empty sf-string', ['""']],
    ['an empty bare value', ['  ']],
  ] as [string, string[]][]) {
    it(`refuses ${label}`, () => assert.equal(key(...fields).kind, 'invalid'));
  }
  it('finds every field in rawHeaders, whatever its case', () => {
    assert.deepEqual(headerFields(['Idempotency-Key', 'a', 'Host', 'x', 'idempotency-key', 'b'], 'idempotency-key'), ['a', 'b']);
  });
});

describe('JSON Pointers', () => {
  const doc = { a: { 'b/c': [10, { '~d': 2 }] }, '': 5 };
  it('evaluates RFC 6901 pointers', () => {
    assert.deepEqual(evaluateJsonPointer(doc, parseJsonPointer('')), doc);
    assert.equal(evaluateJsonPointer(doc, parseJsonPointer('/a/b~1c/0')), 10);
    assert.equal(evaluateJsonPointer(doc, parseJsonPointer('/a/b~1c/1/~0d')), 2);
    assert.equal(evaluateJsonPointer(doc, parseJsonPointer('/')), 5);
    assert.equal(evaluateJsonPointer(doc, parseJsonPointer('/a/b~1c/01')), undefined);
    assert.equal(evaluateJsonPointer(doc, parseJsonPointer('/a/b~1c/-')), undefined);
    assert.equal(evaluateJsonPointer(doc, parseJsonPointer('/x/y')), undefined);
  });
  it('refuses text that is not a pointer', () => {
    assert.throws(() => parseJsonPointer('a'), TypeError);
    assert.throws(() => parseJsonPointer('/a~2'), TypeError);
  });
});

describe('requestDocument', () => {
  const json = Buffer.from('{"order_id": "o-1", "amount": 100.0, "n": 12345678901234567890}');
  it('sends a JSON body as its own text, without the query string, the method upper case', () => {
    assert.equal(requestDocument({ method: 'post', path: '/payments?x=1', contentType: 'application/json; charset=utf-8', rawBody: json }),
      `{"method":"POST","path":"/payments","body":${json.toString()}}`);
  });
  it('treats */*+json as JSON', () => {
    assert.match(requestDocument({ method: 'POST', path: '/p', contentType: 'application/merge-patch+json', rawBody: Buffer.from('[1]') }), /"body":\[1\]/);
  });
  it('hashes other bodies, and JSON that does not parse, as padded base64', () => {
    assert.equal(requestDocument({ method: 'POST', path: '/p', contentType: 'text/plain', rawBody: Buffer.from('ab') }),
      '{"method":"POST","path":"/p","body_base64":"YWI="}');
    assert.match(requestDocument({ method: 'POST', path: '/p', contentType: 'application/json', rawBody: Buffer.from('{x') }), /"body_base64":"e3g="/);
  });
  it('hashes JSON that is not UTF-8, or begins with a BOM, as bytes (as the other languages do)', () => {
    const doc = (bytes: number[]) => requestDocument({ method: 'POST', path: '/p', contentType: 'application/json', rawBody: Buffer.from(bytes) });
    // {"a":"\xff"} and {"a":"\xfe"}: two bodies, not one U+FFFD
    assert.equal(doc([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d]), '{"method":"POST","path":"/p","body_base64":"eyJhIjoi/yJ9"}');
    assert.equal(doc([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xfe, 0x22, 0x7d]), '{"method":"POST","path":"/p","body_base64":"eyJhIjoi/iJ9"}');
    assert.equal(doc([0xef, 0xbb, 0xbf, 0x7b, 0x7d]), '{"method":"POST","path":"/p","body_base64":"77u/e30="}');
  });
  it('has neither key for an empty body', () => {
    assert.equal(requestDocument({ method: 'POST', path: '/p', contentType: 'application/json', rawBody: Buffer.alloc(0) }), '{"method":"POST","path":"/p"}');
  });
  it('maps each pointer of a subset to what it finds, null where nothing', () => {
    const doc = JSON.parse(requestDocument({ method: 'POST', path: '/p', contentType: 'application/json', rawBody: json },
      [parseJsonPointer('/order_id'), parseJsonPointer('/missing')]));
    assert.deepEqual(doc.body, { '/order_id': 'o-1', '/missing': null });
  });
  it('takes 256 levels of arrays and objects as JSON and hashes a body nested deeper as bytes, in every language', () => {
    const nested = (levels: number) => `{"a": ${'['.repeat(levels - 1)}${']'.repeat(levels - 1)}}`;
    const doc = (body: string) => requestDocument({ method: 'POST', path: '/p', contentType: 'application/json', rawBody: Buffer.from(body) });
    assert.equal(doc(nested(256)), `{"method":"POST","path":"/p","body":${nested(256)}}`);
    for (const body of [nested(257), '['.repeat(100000) + ']'.repeat(100000)]) {
      assert.equal(doc(body), `{"method":"POST","path":"/p","body_base64":"${Buffer.from(body).toString('base64')}"}`);
    }
    assert.throws(() => requestDocument({ method: 'POST', path: '/p', contentType: 'application/json', rawBody: Buffer.from(nested(257)) },
      [parseJsonPointer('/a')]), { name: 'FingerprintSubsetError' });
    // a body parsed before the middleware has no bytes to hash
    assert.throws(() => requestDocument({ method: 'POST', path: '/p', contentType: 'application/json', parsedBody: { value: JSON.parse(nested(257)) } }),
      { name: 'FingerprintDepthError' });
    assert.match(requestDocument({ method: 'POST', path: '/p', contentType: 'application/json', parsedBody: { value: JSON.parse(nested(256)) } }), /"body":\{"a":\[/);
  });
  it('refuses a subset on a body that is not JSON', () => {
    assert.throws(() => requestDocument({ method: 'POST', path: '/p', contentType: 'text/plain', rawBody: Buffer.from('x') }, [parseJsonPointer('/a')]),
      { name: 'FingerprintSubsetError' });
  });
});

describe('the envelope', () => {
  const allow = new Set(['content-type', 'location']);
  it('stores allow-listed headers, lower-cased, and a JSON body as JSON', () => {
    const text = encodeEnvelope({ 'Content-Type': 'application/json', Location: '/p/1', 'X-Other': 'no', 'Set-Cookie': ['a', 'b'] },
      Buffer.from('{"id":1}'), allow);
    assert.deepEqual(JSON.parse(text), { v: 1, headers: { 'content-type': 'application/json', location: '/p/1' }, body: { id: 1 } });
  });
  it('joins several values with ", "', () => {
    assert.deepEqual(JSON.parse(encodeEnvelope({ vary: ['a', 'b'] }, Buffer.alloc(0), new Set(['vary']))).headers, { vary: 'a, b' });
  });
  it('stores a JSON body nested more than 256 levels deep as base64, and reads an envelope of one at the limit', () => {
    const nested = (levels: number) => Buffer.from(`{"a": ${'['.repeat(levels - 1)}${']'.repeat(levels - 1)}}`);
    const json = { 'content-type': 'application/json' };
    const atLimit = encodeEnvelope(json, nested(256), allow);
    assert.ok('body' in JSON.parse(atLimit));
    const beyond = JSON.parse(encodeEnvelope(json, nested(257), allow));
    assert.equal(beyond.body_base64, nested(257).toString('base64'));
    assert.equal(beyond.body, undefined);
  });
  it('stores other bodies as base64, and no body for an empty one', () => {
    assert.deepEqual(JSON.parse(encodeEnvelope({ 'content-type': 'image/png' }, Buffer.from([0, 255]), allow)),
      { v: 1, headers: { 'content-type': 'image/png' }, body_base64: 'AP8=' });
    assert.deepEqual(JSON.parse(encodeEnvelope({}, Buffer.alloc(0), allow)), { v: 1, headers: {} });
  });
  it('reads what it writes', () => {
    const r = decodeEnvelope(201, '{"v": 1, "headers": {"location": "/p/1"}, "body_base64": "AP8="}', null, allow);
    assert.deepEqual(r, { status: 201, headers: { location: '/p/1' }, body: Buffer.from([0, 255]) });
    assert.equal(decodeEnvelope(200, '{"v": 1, "body": {"a": 1}}', '{"a": 1}', allow).body.toString(), '{"a": 1}');
    assert.equal(decodeEnvelope(200, '{"v": 1.0, "headers": {}}', null, allow).status, 200);
  });
  it('replays a response without "v" as a JSON body', () => {
    assert.deepEqual(decodeEnvelope(200, '{"a": 1}', null, allow), { status: 200, headers: { 'content-type': 'application/json' }, body: Buffer.from('{"a": 1}') });
  });
  it('refuses a later version', () => {
    assert.throws(() => decodeEnvelope(200, '{"v": 2}', null, allow), UnsupportedEnvelopeError);
  });
  it('replays the headers on the allow-list now; set-cookie only when listed; framing headers never', () => {
    const stored = '{"v": 1, "headers": {"location": "/p", "x-old": "1", "set-cookie": "sid=1", "content-length": "9", "transfer-encoding": "chunked"}}';
    assert.deepEqual(decodeEnvelope(200, stored, null, allow).headers, { location: '/p' });
    const wide = new Set(['location', 'set-cookie', 'content-length', 'transfer-encoding']);
    assert.deepEqual(decodeEnvelope(200, stored, null, wide).headers, { location: '/p', 'set-cookie': 'sid=1' });
  });
  it('never stores a framing header, even when allow-listed', () => {
    const wide = new Set(['content-length', 'transfer-encoding', 'connection', 'location']);
    assert.deepEqual(JSON.parse(encodeEnvelope({ 'content-length': '3', 'transfer-encoding': 'chunked', connection: 'close', location: '/p' },
      Buffer.alloc(0), wide)).headers, { location: '/p' });
  });
});

describe('the mapping', () => {
  it('is the table of doc/clients.md', () => {
    const rows = Object.fromEntries(Object.entries(DEFAULT_MAPPING).map(([code, e]) => [code, [e.status, e.retryAfter]]));
    assert.deepEqual(rows, {
      'missing-key': [400, false], 'invalid-key': [400, false], unauthenticated: [401, false], 'invalid-request': [400, false],
      'in-progress': [409, true], stuck: [409, true], mismatch: [422, false], 'read-only': [503, true], retry: [503, true],
      'unsupported-envelope': [500, false], 'payload-too-large': [413, false], 'internal-error': [500, false],
      unavailable: [503, true], 'time-limit': [503, true],
    });
  });
  it('answers problem+json with Retry-After, which the user can change', () => {
    const mapping = resolveMapping({ 'in-progress': { status: 429, retryAfter: 7 } });
    const r = problemResponse(mapping, 'in-progress', 1);
    assert.equal(r.status, 429);
    assert.deepEqual(r.headers, { 'content-type': 'application/problem+json', 'retry-after': '7' });
    assert.equal(JSON.parse(r.body.toString()).type, 'https://github.com/pg-idempotency/idempotency/blob/main/doc/clients.md#in-progress');
    assert.equal(problemResponse(resolveMapping(undefined), 'stuck', 3).headers['retry-after'], '3');
    assert.throws(() => resolveMapping({ nope: {} } as never), TypeError);
  });
  it('compares versions as numbers', () => {
    assert.ok(compareVersions('0.10.0', '0.9.9') > 0);
    assert.equal(compareVersions('0.2', '0.2.0'), 0);
    assert.ok(compareVersions('0.1.0', '0.2.0') < 0);
  });
});

describe('what can be sent', () => {
  it('takes visible ASCII values with spaces and tabs inside, token names, a status of 200 to 599', () => {
    assert.equal(unsendable(201, { location: '/p/1', 'content-type': 'text/plain; charset=utf-8', 'x-empty': '', vary: ['a', 'b\tc'] }), undefined);
  });
  for (const [label, status, headers] of [
    ['CR/LF in a value', 201, { location: '/p\r\nset-cookie: a=b' }],
    ['a NUL in a value', 201, { 'x-a': 'a\u0000b' }],
    ['a character above 0x7E (Latin-1)', 201, { location: '/caf\u00e9' }],
    ['a character above 0xFF', 201, { 'content-type': 'text/plain; charset=\u20ac' }],
    ['a space before the value', 201, { 'x-a': ' a' }],
    ['a name that is not a token', 201, { 'x a': 'b' }],
    ['one bad value of several', 201, { 'set-cookie': ['a=b', 'c=\n'] }],
    ['a status below 200', 101, {}],
    ['a status above 599', 600, {}],
  ] as [string, number, Record<string, string | string[]>][]) {
    it(`refuses ${label}`, () => assert.equal(typeof unsendable(status, headers), 'string'));
  }
});
