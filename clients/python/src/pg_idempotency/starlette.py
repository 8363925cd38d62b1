"""Starlette: an endpoint wrapper that runs a handler idempotently in the request's transaction.

::

    from pg_idempotency.starlette import StarletteIdempotency

    idem = StarletteIdempotency(pool, IdempotencySettings(scope=account_of))

    async def create(request: Request, conn: psycopg.AsyncConnection) -> Response:
        await conn.execute("INSERT ...")
        return JSONResponse(..., status_code=201)

    app = Starlette(routes=[Route("/payments", idem.endpoint(create, operation="create-payment"), methods=["POST"])],
                    lifespan=...)   # open the pool; await idem.check_version()

The handler runs between ``idem_reserve`` and ``idem_complete`` in one
transaction on one pooled connection, committed before the response
leaves, and shielded from cancellation (a client that goes away does not
stop the commit). FastAPI: :mod:`pg_idempotency.fastapi`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import psycopg
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .core import ProblemError, check_body_size, problem
from .http import RequestData, ResponseData
from .runner import AsyncIdempotency
from .settings import IdempotencySettings

__all__ = ["StarletteIdempotency", "connection", "idempotency_exempt", "idempotent", "to_response"]

F = TypeVar("F", bound=Callable[..., Any])

_STATE = "pg_idempotency_connection"
_MARK = "__pg_idempotency__"
_EXEMPT = "exempt"


def idempotent(**overrides: Any) -> Callable[[F], F]:
    """Mark an endpoint idempotent with per-route settings (``operation``, ``fingerprint``, ``ttl``, ...).

    The endpoint is returned unchanged (FastAPI still reads its signature);
    the route class reads the mark.
    """

    def mark(endpoint: F) -> F:
        setattr(endpoint, _MARK, dict(overrides))
        return endpoint

    return mark


def idempotency_exempt(endpoint: F) -> F:
    """Mark an endpoint that the route class runs in a plain transaction, never idempotently."""
    setattr(endpoint, _MARK, _EXEMPT)
    return endpoint


async def connection(request: Request) -> psycopg.AsyncConnection[Any]:
    """The request's connection, in the transaction the wrapper opened (FastAPI's dependency)."""
    conn: psycopg.AsyncConnection[Any] | None = getattr(request.state, _STATE, None)
    if conn is None:
        raise RuntimeError(
            "pg_idempotency: no connection for this request; use FastAPIIdempotency.route_class "
            "or StarletteIdempotency.endpoint"
        )
    return conn


def _request_data(request: Request, route: str | None, body: bytes) -> RequestData:
    raw_path = request.scope.get("raw_path")
    path = raw_path.decode("latin-1").split("?", 1)[0] if isinstance(raw_path, bytes) else request.url.path
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
    return RequestData(request.method, path, headers, body, route)


def _describe(response: Response) -> ResponseData:
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers]
    return ResponseData(response.status_code, headers, bytes(response.body))


def to_response(data: ResponseData) -> Response:
    """A Starlette response of a replay or problem."""
    response = Response(content=data.body, status_code=data.status)
    response.raw_headers.extend((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in data.headers)
    return response


async def _read_body(request: Request, settings: IdempotencySettings) -> bytes:
    """The request body, read no further than ``max_body_bytes`` (``payload-too-large`` beyond it)."""
    length = request.headers.get("content-length")
    check_body_size(settings, int(length) if length and length.isdigit() else None)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        check_body_size(settings, size)
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # what request.body() and request.json() read from now on
    return body


async def _buffered(response: Response) -> Response:
    """The response with its body in memory (a streaming body is read whole, as it is stored)."""
    if isinstance(response, StreamingResponse):
        chunks = [c if isinstance(c, bytes) else str(c).encode("utf-8") async for c in response.body_iterator]
        buffered = Response(content=b"".join(chunks), status_code=response.status_code)
        buffered.raw_headers = [h for h in response.raw_headers if h[0].lower() != b"content-length"]
        buffered.raw_headers.append((b"content-length", str(len(buffered.body)).encode()))
        return buffered
    if not hasattr(response, "body"):
        raise TypeError(f"pg_idempotency cannot store a {type(response).__name__}")
    return response


async def _resolve(request: Request, exc: Exception) -> Response | None:
    """The response of the application's exception handler for ``exc`` (as Starlette picks it), or ``None``.

    ``HTTPException`` by its status first, then by the exception's classes
    (FastAPI's handlers of its validation errors are among them); an
    exception without a handler is not resolved.
    """
    handlers, status_handlers = request.scope.get("starlette.exception_handlers", ({}, {}))
    handler = status_handlers.get(exc.status_code) if isinstance(exc, HTTPException) else None
    if handler is None:
        handler = next((handlers[cls] for cls in type(exc).__mro__ if cls in handlers), None)
    if handler is None:
        return None
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
        response = await handler(request, exc)
    else:
        response = await run_in_threadpool(handler, request, exc)
    return None if response is None else await _buffered(response)


class StarletteIdempotency(AsyncIdempotency):
    """:class:`~pg_idempotency.AsyncIdempotency` for FastAPI and Starlette.

    An exception raised by a handler is rolled back and answered as the
    application's exception handlers resolve it (Starlette's
    ``HTTPException``, FastAPI's validation errors, yours), whatever its
    status; one of the settings' ``final_errors`` is completed with that
    answer instead. An exception without a handler is rolled back and
    answered ``internal-error``. Await :meth:`check_version` in the
    application's lifespan to refuse to start on a missing or old
    extension; otherwise the first request checks it.
    """

    def wrap(
        self,
        call: Callable[[Request], Awaitable[Response]],
        mark: dict[str, Any] | str | None = None,
        route: str | None = None,
    ) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """An ASGI request handler that runs ``call(request)`` in the transaction (idempotently for its methods)."""
        settings = self.settings.replace(**mark) if isinstance(mark, dict) else self.settings
        settings.validate()
        exempt = mark == _EXEMPT

        async def handler(request: Request) -> Response:

            async def run(conn: psycopg.AsyncConnection[Any]) -> Response:
                setattr(request.state, _STATE, conn)
                try:
                    return await _buffered(await call(request))
                finally:
                    setattr(request.state, _STATE, None)

            async def resolve(exc: Exception) -> Response | None:
                return await _resolve(request, exc)

            if exempt or request.method.upper() not in settings.methods:
                result = await self.transaction(run, _describe, resolve=resolve, settings=settings)
            else:
                try:
                    body = await _read_body(request, settings)
                except ProblemError as e:
                    return to_response(problem(settings, e.code, e.detail))
                result = await self.run(
                    _request_data(request, route, body),
                    run,
                    _describe,
                    resolve=resolve,
                    scope_arg=request,
                    settings=settings,
                )
            return to_response(result) if isinstance(result, ResponseData) else result

        return handler

    def endpoint(
        self, func: Callable[[Request, psycopg.AsyncConnection[Any]], Awaitable[Response]], **overrides: Any
    ) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """A Starlette endpoint that runs ``func(request, conn)`` idempotently (the route decorator)."""

        async def call(request: Request) -> Response:
            return await func(request, await connection(request))

        return self.wrap(call, overrides or None)
