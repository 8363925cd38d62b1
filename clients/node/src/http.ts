/**
 * Helpers on Node's `http` objects that both integrations use.
 *
 * @module
 */

import type { IncomingMessage, ServerResponse } from 'node:http';
import type { CapturedResponse } from './envelope.js';
import { headerString } from './envelope.js';

/** A body over the route's limit. */
export class BodyTooLargeError extends Error {
  constructor(limit: number) {
    super(`The request body is larger than ${limit} bytes.`);
    this.name = 'BodyTooLargeError';
  }
}

/** Reads a request's body (at most `limit` bytes). */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > limit) {
        req.off('data', onData);
        req.resume();
        reject(new BodyTooLargeError(limit));
      } else {
        chunks.push(chunk);
      }
    };
    req.on('data', onData);
    req.once('end', () => resolve(Buffer.concat(chunks)));
    req.once('error', reject);
  });
}

/** The response headers as the envelope stores them: lower-cased names, one string each. */
export function responseHeaders(res: ServerResponse): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(res.getHeaders())) {
    if (value !== undefined) headers[name.toLowerCase()] = headerString(value);
  }
  return headers;
}

/** Sends a whole response (a replay or a problem) on a response nothing was written to. */
export function sendResponse(res: ServerResponse, response: CapturedResponse): void {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  res.statusCode = response.status;
  for (const [name, value] of Object.entries(response.headers)) res.setHeader(name, value);
  res.setHeader('content-length', response.body.length);
  res.end(response.body);
}

type WriteCallback = (error?: Error | null) => void;

/** A buffer of what was written: strings in their encoding. */
function toBuffer(chunk: unknown, encoding: unknown): Buffer {
  if (typeof chunk === 'string') return Buffer.from(chunk, (typeof encoding === 'string' ? encoding : 'utf8') as BufferEncoding);
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  throw new TypeError('a response chunk must be a string, a Buffer or a Uint8Array');
}

/**
 * Holds back everything a handler writes to `res` (status, headers, body)
 * until it ends the response, then calls `onEnd` with it; `onEnd` resolves
 * to the response to send, which is sent then: the handler's own (sent as
 * it was written) or another one (a problem) in its place.
 *
 * @returns a function that sends another response at once, before the
 *   handler ends its own (which is then dropped).
 */
export function captureResponse(
  res: ServerResponse,
  onEnd: (captured: CapturedResponse) => Promise<CapturedResponse>,
): (response: CapturedResponse) => void {
  const original = {
    writeHead: res.writeHead,
    write: res.write,
    end: res.end,
    flushHeaders: res.flushHeaders,
  };
  const chunks: Buffer[] = [];
  let ended = false;

  res.writeHead = function writeHead(this: ServerResponse, statusCode: number, ...rest: unknown[]) {
    let headers = rest[0];
    if (typeof headers === 'string') {
      this.statusMessage = headers;
      headers = rest[1];
    }
    this.statusCode = statusCode;
    if (Array.isArray(headers)) {
      // [name, value, name, value, ...] or [[name, value], ...]
      if (headers.length > 0 && Array.isArray(headers[0])) {
        for (const [name, value] of headers as [string, string][]) this.appendHeader(name, value);
      } else {
        for (let i = 0; i + 1 < headers.length; i += 2) this.appendHeader(String(headers[i]), String(headers[i + 1]));
      }
    } else if (headers !== null && typeof headers === 'object') {
      for (const [name, value] of Object.entries(headers as Record<string, string | string[] | number>)) {
        if (value !== undefined) this.setHeader(name, value);
      }
    }
    return this;
  } as ServerResponse['writeHead'];

  res.flushHeaders = function flushHeaders() {
    // held back until the transaction is over
  };

  res.write = function write(this: ServerResponse, chunk: unknown, encoding?: unknown, callback?: unknown) {
    if (typeof encoding === 'function') callback = encoding;
    if (ended) throw new Error('write after end');
    chunks.push(toBuffer(chunk, encoding));
    if (typeof callback === 'function') process.nextTick(callback as WriteCallback);
    return true;
  } as ServerResponse['write'];

  res.end = function end(this: ServerResponse, chunk?: unknown, encoding?: unknown, callback?: unknown) {
    if (typeof chunk === 'function') {
      callback = chunk;
      chunk = undefined;
    } else if (typeof encoding === 'function') {
      callback = encoding;
      encoding = undefined;
    }
    if (ended) return this;
    ended = true;
    if (chunk !== undefined && chunk !== null) chunks.push(toBuffer(chunk, encoding));
    res.writeHead = original.writeHead;
    res.write = original.write;
    res.end = original.end;
    res.flushHeaders = original.flushHeaders;
    const captured: CapturedResponse = {
      status: res.statusCode,
      headers: responseHeaders(res),
      body: Buffer.concat(chunks),
    };
    void onEnd(captured).then(
      (response) => {
        if (response === captured) {
          res.end(captured.body, typeof callback === 'function' ? (callback as () => void) : undefined);
        } else {
          sendResponse(res, response);
        }
      },
      (error: unknown) => {
        res.destroy(error instanceof Error ? error : new Error(String(error)));
      },
    );
    return this;
  } as ServerResponse['end'];

  return (response) => {
    if (ended) return;
    ended = true;
    res.writeHead = original.writeHead;
    res.write = original.write;
    res.end = original.end;
    res.flushHeaders = original.flushHeaders;
    sendResponse(res, response);
    // what the handler writes after this is dropped
    res.write = (() => true) as unknown as ServerResponse['write'];
    res.end = function end(this: ServerResponse) { return this; } as ServerResponse['end'];
  };
}
