/**
 * The Fastify plugin: reserve in `preHandler`, run the route's handler with
 * the transaction's client (`request.idempotency.client`), complete and
 * COMMIT in `onSend`, before the response goes out.
 *
 * ```ts
 * import fastifyIdempotency from 'pg-idempotency/fastify';
 * await app.register(fastifyIdempotency, { pool, scope: (request) => request.user?.id });
 * app.post('/payments', { config: { idempotency: { operation: 'create-payment' } } }, async (request, reply) => {
 *   const { rows } = await request.idempotency!.client.query('INSERT INTO payments ... RETURNING id', [...]);
 *   return reply.code(201).header('location', `/payments/${rows[0].id}`).send(rows[0]);
 * });
 * ```
 *
 * Register it before the routes it applies to: it hooks every route added
 * after it whose method is idempotent (`POST`, `PATCH`), unless the route's
 * `config.idempotency` is `false`.
 *
 * @module
 */

import { Readable } from 'node:stream';
import type { FastifyPluginAsync, FastifyReply, FastifyRequest, onSendHookHandler, preHandlerAsyncHookHandler, preParsingAsyncHookHandler, RouteOptions as FastifyRouteOptions } from 'fastify';
import fp from 'fastify-plugin';
import { type Answer, Idempotency, type IdempotencyContext, type IdempotencyOptions, type ResolvedRoute, resolveRoute, type RouteOptions } from './core.js';
import type { CapturedResponse } from './envelope.js';
import { headerString } from './envelope.js';
import { FingerprintError, requestBody, requestDocument } from './fingerprint.js';
import { headerFields } from './key.js';

/** What the plugin gives the handler of a request it reserved, as `request.idempotency`: the same {@link IdempotencyContext} as the Express middleware's. */
export type FastifyIdempotencyContext = IdempotencyContext;

/** The plugin's settings: {@link IdempotencyOptions} on Fastify requests. */
export type FastifyIdempotencyOptions = IdempotencyOptions<FastifyRequest>;

declare module 'fastify' {
  interface FastifyInstance {
    /** The library behind pg-idempotency's plugin (settings, mapping, the transaction runner). */
    idempotency: Idempotency<FastifyRequest>;
  }
  interface FastifyRequest {
    /** Set by pg-idempotency on a request it reserved; null otherwise. */
    idempotency: FastifyIdempotencyContext | null;
  }
  interface FastifyContextConfig {
    /** pg-idempotency's settings for this route, or `false` to leave it alone. */
    idempotency?: RouteOptions<FastifyRequest> | false;
  }
}

const rawBodyKey = Symbol('pg-idempotency raw body');
type WithRawBody = FastifyRequest & { [rawBodyKey]?: Buffer };

/** `:id` to `{id}`: a Fastify route URL as the default operation's template. */
function pathTemplate(url: string): string {
  return url.replace(/:([A-Za-z0-9_]+)(\([^)]*\))?\??/g, '{$1}');
}

/** Reads a stream whole. */
async function readStream(stream: NodeJS.ReadableStream, limit: number): Promise<Buffer | null> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of stream) {
    const buffer = typeof chunk === 'string' ? Buffer.from(chunk) : Buffer.from(chunk as Uint8Array);
    size += buffer.length;
    if (size > limit) return null;
    chunks.push(buffer);
  }
  return Buffer.concat(chunks);
}

/** A payload of `onSend` as bytes. */
async function payloadBytes(payload: unknown): Promise<Buffer> {
  if (payload === null || payload === undefined) return Buffer.alloc(0);
  if (typeof payload === 'string') return Buffer.from(payload);
  if (payload instanceof Uint8Array) return Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
  if (typeof (payload as NodeJS.ReadableStream).pipe === 'function') {
    return (await readStream(payload as NodeJS.ReadableStream, Number.POSITIVE_INFINITY))!;
  }
  throw new TypeError('pg-idempotency cannot store a response payload of this type');
}

/** The status an error asks for itself (http-errors' and Fastify's `statusCode`). */
function ownStatus(error: unknown): number | undefined {
  const status = (error as { statusCode?: unknown } | null)?.statusCode;
  return typeof status === 'number' && status >= 400 && status < 600 ? status : undefined;
}

/** The plugin: see the module's documentation. */
const plugin: FastifyPluginAsync<FastifyIdempotencyOptions> = async (fastify, options) => {
  const library = await Idempotency.create<FastifyRequest>(options);
  fastify.decorate('idempotency', library);
  fastify.decorateRequest('idempotency', null);

  const send = (reply: FastifyReply, answer: Answer): FastifyReply =>
    reply.code(answer.response.status).headers(answer.response.headers).send(answer.response.body);

  const preParsing: preParsingAsyncHookHandler = async (request, reply, payload) => {
    const bytes = await readStream(payload, library.bodyLimit);
    if (bytes === null) {
      await send(reply, library.problem('payload-too-large'));
      return payload;
    }
    (request as WithRawBody)[rawBodyKey] = bytes;
    const replay = Readable.from([bytes]) as Readable & { receivedEncodedLength?: number };
    replay.receivedEncodedLength = (payload as { receivedEncodedLength?: number }).receivedEncodedLength ?? bytes.length;
    return replay;
  };

  const preHandlerFor = (route: ResolvedRoute<FastifyRequest>): preHandlerAsyncHookHandler => async (request, reply) => {
    try {
      return await reserve(route, request, reply);
    } catch (error) {
      // before the handler (the scope function): an error that names its
      // own 4xx is Fastify's to render; any other is answered from the
      // mapping, never with its text
      if (request.idempotency !== null || (ownStatus(error) ?? 500) < 500) throw error;
      return send(reply, library.errorAnswer(error));
    }
  };

  const reserve = async (route: ResolvedRoute<FastifyRequest>, request: FastifyRequest, reply: FastifyReply): Promise<FastifyReply | undefined> => {
    const parsed = library.parseKey(headerFields(request.raw.rawHeaders, 'idempotency-key'));
    if (parsed.kind === 'missing') {
      if (route.keyRequired) return send(reply, library.problem('missing-key'));
      return undefined;
    }
    if (parsed.kind === 'invalid') return send(reply, library.problem('invalid-key', parsed.reason));
    const scope = await library.scope(request);
    if (scope === null || scope === undefined || scope === '') return send(reply, library.problem('unauthenticated'));
    if (typeof scope !== 'string') throw new TypeError('the scope function must return a string');

    const fingerprintRequest = {
      method: request.method,
      path: request.raw.url ?? request.url,
      contentType: request.headers['content-type'],
      rawBody: (request as WithRawBody)[rawBodyKey],
    };
    let document: string;
    try {
      document = requestDocument(fingerprintRequest, route.fingerprint, requestBody(fingerprintRequest));
    } catch (error) {
      if (error instanceof FingerprintError) return send(reply, library.problem('invalid-request', error.message));
      throw error;
    }
    const operation = typeof route.operation === 'function'
      ? route.operation(request)
      : (route.operation ?? `${request.method.toUpperCase()} ${pathTemplate(request.routeOptions.url ?? request.url)}`);

    const begun = await library.begin({ operation, key: parsed.key, scope, request: document, ttl: route.ttl }, route);
    if (begun.kind === 'answer') return send(reply, begun);
    request.idempotency = {
      client: begun.transaction.client,
      key: parsed.key,
      scope,
      operation,
      transaction: begun.transaction,
      isFinal: route.isFinal,
    };
    begun.transaction.onTimeLimit = (answer) => {
      void send(reply, answer);
    };
    return undefined;
  };

  const onSendFor = (route: ResolvedRoute<FastifyRequest>): onSendHookHandler => async (request, reply, payload) => {
    const context = request.idempotency;
    if (context === null || context.transaction.done) return payload;
    let final: CapturedResponse | Answer;
    if (context.error !== undefined) {
      // the route failed: nothing is kept; an error that names its own
      // 4xx is answered as the application rendered it
      final = await context.transaction.fail(context.error);
      if (ownStatus(context.error) !== undefined && ownStatus(context.error)! < 500) return payload;
    } else {
      const headers: Record<string, string> = {};
      for (const [name, value] of Object.entries(reply.getHeaders())) {
        if (value !== undefined) headers[name.toLowerCase()] = headerString(value);
      }
      const captured: CapturedResponse = { status: reply.statusCode, headers, body: await payloadBytes(payload) };
      final = await context.transaction.finish(captured);
      if (final === captured) return captured.body;
    }
    const response = 'kind' in final ? final.response : final;
    for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
    reply.code(response.status).headers(response.headers);
    return response.body;
  };

  fastify.addHook('onRoute', (routeOptions: FastifyRouteOptions) => {
    const config = (routeOptions.config as { idempotency?: RouteOptions<FastifyRequest> | false } | undefined)?.idempotency;
    if (config === false) return;
    const methods = Array.isArray(routeOptions.method) ? routeOptions.method : [routeOptions.method];
    if (!methods.some((method) => library.methods.has(String(method).toUpperCase()))) return;
    const route = resolveRoute(config ?? {}, library.route);
    const append = <T>(existing: T | T[] | undefined, hook: T): T[] =>
      existing === undefined ? [hook] : Array.isArray(existing) ? [...existing, hook] : [existing, hook];
    routeOptions.preParsing = append(routeOptions.preParsing as never, (async (request: FastifyRequest, reply: FastifyReply, payload: NodeJS.ReadableStream) =>
      library.methods.has(request.method.toUpperCase()) ? preParsing.call(fastify, request, reply, payload as never) : payload) as never);
    routeOptions.preHandler = append(routeOptions.preHandler as never, (async (request: FastifyRequest, reply: FastifyReply) =>
      library.methods.has(request.method.toUpperCase()) ? preHandlerFor(route).call(fastify, request, reply) : undefined) as never);
    routeOptions.onError = append(routeOptions.onError as never, (async (request: FastifyRequest, _reply: FastifyReply, error: Error) => {
      // a final error's answer, as the error handler resolves it, is completed
      if (request.idempotency !== null && !request.idempotency.isFinal(error)) request.idempotency.error = error;
    }) as never);
    routeOptions.onSend = append(routeOptions.onSend as never, onSendFor(route) as never);
    routeOptions.onResponse = append(routeOptions.onResponse as never, (async (request: FastifyRequest) => {
      // a response that never went through onSend (a hijacked reply): roll back
      const context = request.idempotency;
      if (context !== null && !context.transaction.done) {
        await context.transaction.fail(new Error('the response was sent without passing onSend'));
      }
    }) as never);
  });
};

/**
 * The pg-idempotency Fastify plugin, wrapped with fastify-plugin so that its
 * decorators (`fastify.idempotency`, `request.idempotency`) and hooks reach
 * the routes of the scope it is registered in.
 */
export const fastifyIdempotency = fp(plugin, { fastify: '5.x', name: 'pg-idempotency' });
export default fastifyIdempotency;
export { Idempotency } from './core.js';
export type { RouteOptions, IdempotencyOptions } from './core.js';
