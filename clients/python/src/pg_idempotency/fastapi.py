"""FastAPI: a route class, a route decorator and a dependency.

::

    from pg_idempotency.fastapi import FastAPIIdempotency, IdempotencyConnection, idempotent

    idem = FastAPIIdempotency(pool, IdempotencySettings(scope=account_of))
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
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import psycopg
from fastapi import Depends, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from .starlette import _MARK, StarletteIdempotency, connection, idempotency_exempt, idempotent

__all__ = ["FastAPIIdempotency", "IdempotencyConnection", "connection", "idempotency_exempt", "idempotent"]

#: The handler's parameter type: ``conn: IdempotencyConnection``.
IdempotencyConnection = Annotated[psycopg.AsyncConnection[Any], Depends(connection)]


class FastAPIIdempotency(StarletteIdempotency):
    """:class:`~pg_idempotency.starlette.StarletteIdempotency` with FastAPI's route class.

    ``HTTPException``, request validation errors and any exception with a
    handler of the application (``app.exception_handler``) raised by a
    handler are rolled back (completed, when final) and answered as those
    handlers resolve them; any other exception is rolled back and answered
    ``internal-error``.
    """

    @functools.cached_property
    def route_class(self) -> type[APIRoute]:
        """The ``route_class`` of an ``APIRouter`` whose routes run in the request's transaction."""
        idem = self

        class IdempotentRoute(APIRoute):
            """A FastAPI route whose handler runs in the request's transaction."""

            def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
                original = super().get_route_handler()
                return idem.wrap(original, getattr(self.endpoint, _MARK, None), self.path_format)

        return IdempotentRoute
