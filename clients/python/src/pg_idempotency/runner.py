"""The transaction runner on psycopg 3: :class:`Idempotency` and its twin :class:`AsyncIdempotency`.

Each request takes one connection from the pool and runs, in one
transaction: ``idem_reserve``; on ``new`` the handler, given that
connection; ``idem_complete`` with the response envelope; COMMIT. A handler
that raises, or returns a retryable status, is rolled back. The async twin
shields the transaction from cancellation: once the handler has started,
the client going away does not stop the commit, so its retry replays.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar, overload

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from .core import (
    COMPLETE_SQL,
    RESERVE_SQL,
    Plan,
    ProblemError,
    answer_reservation,
    error_response,
    logger,
    plan,
    problem,
    read_key,
    scope_value,
    should_complete,
)
from .http import RequestData, ResponseData
from .settings import IdempotencySettings
from .version import VERSION_SQL, require_version

__all__ = ["AsyncIdempotency", "Idempotency"]

R = TypeVar("R")


def _identity(response: ResponseData) -> ResponseData:
    return response


class _Rolled(Exception):
    """Carries a retryable response out of the transaction block, which rolls back."""

    def __init__(self, response: Any) -> None:
        super().__init__("rolled back")
        self.response = response


class Idempotency:
    """Runs handlers idempotently on a psycopg :class:`~psycopg_pool.ConnectionPool`.

    ::

        idem = Idempotency(pool, IdempotencySettings(scope=lambda req: req.header("x-user")))
        response = idem.run(request, lambda conn: handler(conn, request))

    The constructor checks the extension's version (``check=False`` skips it).
    ``passthrough`` names exceptions that are rolled back and re-raised (a
    framework's HTTP errors) instead of being answered ``internal-error``.
    """

    #: An integration's framework errors, always passed through (before ``passthrough``).
    framework_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init__(
        self,
        pool: ConnectionPool[Any],
        settings: IdempotencySettings,
        *,
        check: bool = True,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.pool = pool
        self.settings = settings.validate()
        self.passthrough = (*self.framework_errors, *passthrough)
        self.extension_version: str | None = None
        if check:
            self.check_version()

    def check_version(self) -> str:
        """The extension's version; raises :class:`~pg_idempotency.ExtensionVersionError` below 0.2.0."""
        with self.pool.connection() as conn:
            row = conn.execute(VERSION_SQL).fetchone()
            conn.rollback()
        self.extension_version = require_version(row[0] if row else None)
        return self.extension_version

    @overload
    def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.Connection[Any]], ResponseData],
        *,
        scope_arg: object = ...,
        settings: IdempotencySettings | None = ...,
    ) -> ResponseData: ...

    @overload
    def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.Connection[Any]], R],
        describe: Callable[[R], ResponseData],
        *,
        scope_arg: object = ...,
        settings: IdempotencySettings | None = ...,
    ) -> R | ResponseData: ...

    def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.Connection[Any]], Any],
        describe: Callable[[Any], ResponseData] = _identity,
        *,
        scope_arg: object = None,
        settings: IdempotencySettings | None = None,
    ) -> Any:
        """Run ``handler(conn)`` for ``request`` idempotently, and return its response or the library's.

        ``describe`` turns the handler's own response type into
        :class:`ResponseData` (for the envelope); the result is the handler's
        response or a :class:`ResponseData` (replay, problem). The scope
        function gets ``scope_arg`` (default: ``request``); ``settings``
        overrides the runner's for this call.
        """
        s = settings or self.settings
        if s.scope is None:
            s.validate()
        assert s.scope is not None
        try:
            key = read_key(s, request)
            if key is None:
                return self._plain(s, handler, describe)
            principal = s.scope(request if scope_arg is None else scope_arg)
            if inspect.isawaitable(principal):
                raise TypeError("the scope function of a sync runner returned an awaitable")
            p = plan(s, request, key, scope_value(principal))
        except ProblemError as e:
            return problem(s, e.code, e.detail)
        return self._guarded(s, p, handler, describe)

    def transaction(
        self,
        handler: Callable[[psycopg.Connection[Any]], Any],
        describe: Callable[[Any], ResponseData] = _identity,
        *,
        settings: IdempotencySettings | None = None,
    ) -> Any:
        """Run ``handler(conn)`` in a plain transaction, without a key.

        Committed unless the handler raises or returns a retryable status,
        and its errors answered as :meth:`run` answers them.
        """
        return self._plain(settings or self.settings, handler, describe)

    def _plain(
        self, s: IdempotencySettings, handler: Callable[[psycopg.Connection[Any]], Any], describe: Callable[[Any], Any]
    ) -> Any:
        try:
            with self.pool.connection() as conn:
                try:
                    with conn.transaction():
                        response = handler(conn)
                        if s.is_retryable(describe(response).status):
                            raise _Rolled(response)
                except _Rolled as r:
                    return r.response
                return response
        except self.passthrough:
            raise
        except BaseException as e:
            return self._failure(s, e)

    def _guarded(
        self,
        s: IdempotencySettings,
        p: Plan,
        handler: Callable[[psycopg.Connection[Any]], Any],
        describe: Callable[[Any], ResponseData],
    ) -> Any:
        try:
            with self.pool.connection() as conn:
                try:
                    with conn.transaction():
                        row = conn.execute(RESERVE_SQL, p.reserve_params()).fetchone()
                        answer = answer_reservation(s, row)
                        if answer is not None:
                            return answer
                        response = handler(conn)
                        envelope = should_complete(s, described := describe(response))
                        if envelope is None:
                            raise _Rolled(response)
                        conn.execute(COMPLETE_SQL, p.complete_params(envelope, described.status))
                except _Rolled as r:
                    return r.response
                return response
        except self.passthrough:
            raise
        except BaseException as e:
            return self._failure(s, e)

    @staticmethod
    def _failure(s: IdempotencySettings, e: BaseException) -> ResponseData:
        return _failure(s, e)


def _failure(s: IdempotencySettings, e: BaseException) -> ResponseData:
    """The answer to an exception that rolled the transaction back (re-raised unless an Exception)."""
    if isinstance(e, ProblemError):
        return problem(s, e.code, e.detail)
    if isinstance(e, PoolTimeout):
        logger.warning("no connection free in the pool: %s", e)
        return problem(s, "retry")
    if isinstance(e, psycopg.Error):
        return error_response(s, e.sqlstate, e.diag.message_primary or str(e))
    if not isinstance(e, Exception):
        raise e
    logger.exception("the idempotent handler failed; its transaction was rolled back")
    return problem(s, "internal-error")


class AsyncIdempotency:
    """The async twin of :class:`Idempotency`, on an :class:`~psycopg_pool.AsyncConnectionPool`.

    The version is checked by :meth:`check_version` (await it at start-up)
    or, at the latest, on the first :meth:`run`. The transaction of a run
    goes on in a task of its own: cancelling the caller (a client that went
    away) does not cancel it, so it commits and the retry replays.
    """

    framework_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        settings: IdempotencySettings,
        *,
        check: bool = True,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.pool = pool
        self.settings = settings.validate()
        self.passthrough = (*self.framework_errors, *passthrough)
        self.extension_version: str | None = None
        self._check = check
        self._tasks: set[asyncio.Task[Any]] = set()

    async def check_version(self) -> str:
        """The extension's version; raises :class:`~pg_idempotency.ExtensionVersionError` below 0.2.0."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(VERSION_SQL)
            row = await cur.fetchone()
            await conn.rollback()
        self.extension_version = require_version(row[0] if row else None)
        return self.extension_version

    @overload
    async def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[ResponseData]],
        *,
        scope_arg: object = ...,
        settings: IdempotencySettings | None = ...,
    ) -> ResponseData: ...

    @overload
    async def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[R]],
        describe: Callable[[R], ResponseData],
        *,
        scope_arg: object = ...,
        settings: IdempotencySettings | None = ...,
    ) -> R | ResponseData: ...

    async def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]],
        describe: Callable[[Any], ResponseData] = _identity,
        *,
        scope_arg: object = None,
        settings: IdempotencySettings | None = None,
    ) -> Any:
        """Run ``await handler(conn)`` for ``request`` idempotently (see :meth:`Idempotency.run`).

        The scope function may be a coroutine function.
        """
        if self._check and self.extension_version is None:
            await self.check_version()
        s = settings or self.settings
        if s.scope is None:
            s.validate()
        assert s.scope is not None
        try:
            key = read_key(s, request)
            if key is None:
                return await self._shielded(self._plain(s, handler, describe))
            principal = s.scope(request if scope_arg is None else scope_arg)
            if inspect.isawaitable(principal):
                principal = await principal
            p = plan(s, request, key, scope_value(principal))
        except ProblemError as e:
            return problem(s, e.code, e.detail)
        return await self._shielded(self._guarded(s, p, handler, describe))

    async def transaction(
        self,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]],
        describe: Callable[[Any], ResponseData] = _identity,
        *,
        settings: IdempotencySettings | None = None,
    ) -> Any:
        """Run ``await handler(conn)`` in a plain transaction (no key), shielded like :meth:`run`."""
        return await self._shielded(self._plain(settings or self.settings, handler, describe))

    async def _shielded(self, work: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _plain(
        self,
        s: IdempotencySettings,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]],
        describe: Callable[[Any], ResponseData],
    ) -> Any:
        try:
            async with self.pool.connection() as conn:
                try:
                    async with conn.transaction():
                        response = await handler(conn)
                        if s.is_retryable(describe(response).status):
                            raise _Rolled(response)
                except _Rolled as r:
                    return r.response
                return response
        except self.passthrough:
            raise
        except BaseException as e:
            return _failure(s, e)

    async def _guarded(
        self,
        s: IdempotencySettings,
        p: Plan,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]],
        describe: Callable[[Any], ResponseData],
    ) -> Any:
        try:
            async with self.pool.connection() as conn:
                try:
                    async with conn.transaction():
                        cur = await conn.execute(RESERVE_SQL, p.reserve_params())
                        answer = answer_reservation(s, await cur.fetchone())
                        if answer is not None:
                            return answer
                        response = await handler(conn)
                        envelope = should_complete(s, described := describe(response))
                        if envelope is None:
                            raise _Rolled(response)
                        await conn.execute(COMPLETE_SQL, p.complete_params(envelope, described.status))
                except _Rolled as r:
                    return r.response
                return response
        except self.passthrough:
            raise
        except BaseException as e:
            return _failure(s, e)
