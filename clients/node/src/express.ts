/**
 * The Express middleware: reserve, run the route's handler with the
 * transaction's client, complete and COMMIT, then send the response.
 *
 * ```ts
 * import { idempotency } from 'pg-idempotency/express';
 * const idem = await idempotency({ pool, scope: (req) => req.user?.id });
 * app.post('/payments', express.json(), idem.route({ operation: 'create-payment' }), async (req, res) => {
 *   const { client } = req.idempotency!;
 *   const { rows } = await client.query('INSERT INTO payments ... RETURNING id', [...]);
 *   res.status(201).location(`/payments/${rows[0].id}`).json(rows[0]);
 * });
 * app.use(idem.errorHandler());
 * ```
 *
 * @module
 */

import type { ErrorRequestHandler, NextFunction, Request, RequestHandler, Response } from 'express';
import { type Answer, Idempotency, type IdempotencyContext, type IdempotencyOptions, type ResolvedRoute, resolveRoute, type RouteOptions } from './core.js';
import type { CapturedResponse } from './envelope.js';
import { FingerprintError, type FingerprintRequest, type RequestBody, requestBody, requestDocument } from './fingerprint.js';
import { BodyTooLargeError, captureResponse, readBody, sendResponse } from './http.js';
import { headerFields } from './key.js';

export type { IdempotencyContext } from './core.js';

declare global {
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /** Set by pg-idempotency's middleware on a request it reserved; undefined otherwise. */
      idempotency?: IdempotencyContext;
    }
  }
}

/** The middleware's settings: {@link IdempotencyOptions} on Express requests. */
export type ExpressIdempotencyOptions = IdempotencyOptions<Request>;

/** The middleware, with route-level variants and its error handler. */
export interface IdempotencyMiddleware extends RequestHandler {
  /** The library behind it (settings, mapping, the transaction runner). */
  readonly idempotency: Idempotency<Request>;
  /** A middleware for one route, with settings of its own over the shared ones. */
  route(options: RouteOptions<Request>): RequestHandler;
  /**
   * An Express error handler (mount it after the routes; without it an
   * error is not seen, and the answer your error handlers give it is
   * completed like a returned one): an error of a request under
   * idempotency rolls its transaction back and is answered from the
   * mapping (503 `retry` for a serialization failure, 500
   * `internal-error` for any other). An error that names its own 4xx
   * (`status`/`statusCode`, as http-errors does) and the errors of other
   * requests go on to `next(err)`; the response your error handlers send
   * for a request under idempotency is rolled back, not stored, unless
   * the error is one of the route's `finalErrors`: then it goes on to
   * `next(err)` and your error handlers' answer is completed and
   * committed (and replayed).
   */
  errorHandler(): ErrorRequestHandler;
}

/** Whether an error names its own 4xx (`status`/`statusCode`, as http-errors does). */
function ownClientError(error: unknown): boolean {
  const status = (error as { statusCode?: unknown } | null)?.statusCode ?? (error as { status?: unknown } | null)?.status;
  return typeof status === 'number' && status >= 400 && status < 500;
}

/** `:id` to `{id}`: an Express route path as the default operation's template. */
function pathTemplate(path: string): string {
  return path.replace(/:([A-Za-z0-9_]+)(\([^)]*\))?\??/g, '{$1}');
}

/** The default operation of a request: `METHOD path-template`. */
function defaultOperation(req: Request): string {
  const routePath: unknown = req.route?.path;
  const template = typeof routePath === 'string' ? req.baseUrl + routePath : req.baseUrl + req.path;
  return `${req.method.toUpperCase()} ${pathTemplate(template)}`;
}

/** The fingerprint's view of an Express request (reads the body when no parser has). */
async function fingerprintRequest(req: Request, limit: number): Promise<FingerprintRequest> {
  const base = { method: req.method, path: req.originalUrl, contentType: req.headers['content-type'] };
  if (req.readableEnded || (req as { _body?: unknown })._body === true) {
    // a body parser ran before: only what it kept is left
    return { ...base, parsedBody: { value: req.body } };
  }
  const rawBody = await readBody(req, limit);
  // what body parsers mounted after this middleware look at to skip
  (req as { _body?: unknown })._body = true;
  return { ...base, rawBody };
}

/**
 * Creates the middleware: checks the settings and the extension's version
 * (so an application without the extension, or with one older than
 * 0.2.0, refuses to start).
 */
export async function idempotency(options: ExpressIdempotencyOptions): Promise<IdempotencyMiddleware> {
  const library = await Idempotency.create<Request>(options);
  const send = (res: Response, answer: Answer | CapturedResponse): void => {
    sendResponse(res, 'kind' in answer ? answer.response : answer);
  };

  const make = (route: ResolvedRoute<Request>): RequestHandler => {
    const handler = (req: Request, res: Response, next: NextFunction): void => {
      if (!library.methods.has(req.method.toUpperCase())) {
        next();
        return;
      }
      handle(req, res, next, route).catch((error: unknown) => {
        // before the handler (the scope function, reading the body): an
        // error that names its own 4xx goes to your error handlers; any
        // other is answered from the mapping, never as a stack trace
        if (res.headersSent || req.idempotency !== undefined || ownClientError(error)) next(error);
        else send(res, library.errorAnswer(error));
      });
    };
    return handler;
  };

  const handle = async (req: Request, res: Response, next: NextFunction, route: ResolvedRoute<Request>): Promise<void> => {
    const parsed = library.parseKey(headerFields(req.rawHeaders, 'idempotency-key'));
    if (parsed.kind === 'missing') {
      if (route.keyRequired) send(res, library.problem('missing-key'));
      else next();
      return;
    }
    if (parsed.kind === 'invalid') {
      send(res, library.problem('invalid-key', parsed.reason));
      return;
    }
    const scope = await library.scope(req);
    if (scope === null || scope === undefined || scope === '') {
      send(res, library.problem('unauthenticated'));
      return;
    }
    if (typeof scope !== 'string') throw new TypeError('the scope function must return a string');

    let request: FingerprintRequest;
    try {
      request = await fingerprintRequest(req, library.bodyLimit);
    } catch (error) {
      if (error instanceof BodyTooLargeError) {
        send(res, library.problem('payload-too-large'));
        return;
      }
      throw error;
    }
    let body: RequestBody;
    let document: string;
    try {
      body = requestBody(request);
      document = requestDocument(request, route.fingerprint, body);
    } catch (error) {
      if (error instanceof FingerprintError) {
        send(res, library.problem('invalid-request', error.message));
        return;
      }
      throw error;
    }
    if (request.rawBody !== undefined) {
      // give the handler the body, as express.json() / express.raw() would
      req.body = body.value !== undefined ? body.value : body.kind === 'bytes' ? body.bytes : undefined;
    }
    const operation = typeof route.operation === 'function'
      ? route.operation(req)
      : (route.operation ?? defaultOperation(req));

    const begun = await library.begin({ operation, key: parsed.key, scope, request: document, ttl: route.ttl }, route);
    if (begun.kind === 'answer') {
      send(res, begun);
      return;
    }
    const { transaction } = begun;
    const context: IdempotencyContext = {
      client: transaction.client,
      key: parsed.key,
      scope,
      operation,
      transaction,
      isFinal: route.isFinal,
    };
    req.idempotency = context;
    res.locals.idempotency = context;
    const sendInstead = captureResponse(res, async (captured) => {
      if (context.error !== undefined) {
        // the error handler's answer goes out; nothing is kept
        await transaction.fail(context.error, false);
        return captured;
      }
      return transaction.finish(captured);
    });
    transaction.onTimeLimit = (answer) => sendInstead(answer.response);
    next();
  };

  const middleware = make(library.route) as IdempotencyMiddleware;
  Object.defineProperty(middleware, 'idempotency', { value: library });
  middleware.route = (routeOptions) => make(resolveRoute(routeOptions, library.route));
  middleware.errorHandler = () => (error: unknown, req: Request, res: Response, next: NextFunction) => {
    const context = req.idempotency;
    if (context !== undefined && context.transaction.done) {
      // thrown after the handler answered: that answer is being committed
      // and goes out then; the error is only reported
      library.onError(error);
      return;
    }
    if (context === undefined || res.headersSent) {
      next(error);
      return;
    }
    if (context.isFinal(error)) {
      // a final error: the application's error handlers answer it, and
      // that answer is completed and committed like a returned response
      next(error);
      return;
    }
    context.error = error;
    if (ownClientError(error)) {
      // an error that names its own 4xx (http-errors): the application's
      // error handlers answer it; the transaction still rolls back
      next(error);
      return;
    }
    send(res, context.transaction.answerFor(error));
  };
  return middleware;
}

export { Idempotency } from './core.js';
export type { RouteOptions, IdempotencyOptions } from './core.js';
