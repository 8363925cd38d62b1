"""FastAPI and Starlette: a route class, a route decorator and a dependency.

FastAPI::

    from pg_idempotency.fastapi import IdempotencyConnection, StarletteIdempotency, idempotent

    idem = StarletteIdempotency(pool, IdempotencySettings(scope=account_of))
    router = APIRouter(route_class=idem.route_class)

    @router.post("/payments")
    @idempotent(operation="create-payment")
    async def create(request: Request, conn: IdempotencyConnection) -> Response:
        await conn.execute("INSERT ...")
        return JSONResponse(..., status_code=201)

Every route of ``router`` runs in a transaction on one pooled connection,
which :data:`IdempotencyConnection` hands to the handler; its POST and PATCH
routes (the settings' ``methods``) are idempotent: the key is reserved, the
handler run and the key completed in that transaction, committed before the
response leaves. The transaction is shielded from cancellation, so a client
that goes away does not stop the commit.

Starlette: ``Route("/payments", idem.endpoint(create), methods=["POST"])``,
where ``create(request, conn)`` returns a response.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Annotated, Any, TypeVar

import psycopg
from fastapi import Depends, Request
from fastapi.routing import APIRoute
from psycopg_pool import AsyncConnectionPool
from starlette.exceptions import HTTPException
from starlette.responses import Response, StreamingResponse

from .http import RequestData, ResponseData
from .runner import AsyncIdempotency
from .settings import IdempotencySettings

__all__ = ["IdempotencyConnection", "StarletteIdempotency", "connection", "idempotency_exempt", "idempotent"]

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
    """The dependency: the request's connection, in the transaction the route class opened."""
    conn: psycopg.AsyncConnection[Any] | None = getattr(request.state, _STATE, None)
    if conn is None:
        raise RuntimeError(
            "pg_idempotency: no connection for this request; use the route_class of a StarletteIdempotency"
        )
    return conn


#: The handler's parameter type: ``conn: IdempotencyConnection``.
IdempotencyConnection = Annotated[psycopg.AsyncConnection[Any], Depends(connection)]


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


def _passthrough() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = [HTTPException]
    try:
        from fastapi.exceptions import RequestValidationError

        kinds.append(RequestValidationError)
    except ImportError:  # pragma: no cover - Starlette without FastAPI
        pass
    return tuple(kinds)


class StarletteIdempotency(AsyncIdempotency):
    """:class:`~pg_idempotency.AsyncIdempotency` for FastAPI and Starlette.

    A framework HTTP error raised by a handler (``HTTPException``, FastAPI's
    validation error) is rolled back and re-raised to the framework's
    handlers; any other exception is rolled back and answered
    ``internal-error``. Await :meth:`check_version` in the application's
    lifespan to refuse to start on a missing or old extension; otherwise
    the first request checks it.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        settings: IdempotencySettings,
        *,
        check: bool = True,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> None:
        super().__init__(pool, settings, check=check, passthrough=_passthrough() + passthrough)
        idem = self

        class IdempotentRoute(APIRoute):
            """A FastAPI route whose handler runs in the request's transaction."""

            def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
                original = super().get_route_handler()
                return idem.wrap(original, getattr(self.endpoint, _MARK, None), self.path_format)

        self.route_class: type[APIRoute] = IdempotentRoute
        """The ``route_class`` of the ``APIRouter`` (or ``FastAPI(route_class=...)``... see README)."""

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
            body = await request.body()

            async def run(conn: psycopg.AsyncConnection[Any]) -> Response:
                setattr(request.state, _STATE, conn)
                try:
                    return await _buffered(await call(request))
                finally:
                    setattr(request.state, _STATE, None)

            if exempt or request.method.upper() not in settings.methods:
                result = await self.transaction(run, _describe, settings=settings)
            else:
                result = await self.run(
                    _request_data(request, route, body), run, _describe, scope_arg=request, settings=settings
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
