"""The runners on psycopg 3 pools: :class:`Idempotency` and :class:`AsyncIdempotency`.

Both are callers of the core runner (:mod:`pg_idempotency._core_runner`):
:meth:`Idempotency.run_under_key` runs any function under a key and
returns new, replay or raises a typed error; :meth:`Idempotency.run` is the
HTTP request on top of it (the key, the scope, the envelope, the mapping).
The async runner shields the transaction from cancellation: once the
handler has started, the client going away does not stop the commit, so
its retry replays.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any, TypeVar, overload

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from ._core_runner import Completion, Policy, Result, run_async, run_sync
from ._json import dump_json
from .core import (
    REPLAYED_HEADER,
    TIME_LIMIT_SQL,
    TimeLimitExceeded,
    time_limit_params,
    KeyOutcomeError,
    Plan,
    ProblemError,
    error_response,
    logger,
    plan,
    problem,
    read_key,
    scope_value,
)
from .envelope import UnsupportedEnvelope, build_envelope, read_envelope
from .http import RequestData, ResponseData, UnsendableResponse, check_sendable
from .settings import IdempotencySettings
from .version import VERSION_SQL, require_version

__all__ = [
    "AsyncIdempotency",
    "Idempotency",
    "answer_error",
    "answer_result",
    "completion_of",
    "library_answer",
    "policy_of",
]

R = TypeVar("R")
T = TypeVar("T")


def _identity(response: ResponseData) -> ResponseData:
    return response


# --- the HTTP request on the core runner (pure, shared by every integration) ---


def policy_of(settings: IdempotencySettings) -> Policy:
    """The core runner's policy of the settings: retryable statuses, final errors."""
    return Policy(settings.retryable_statuses, settings.is_final)


def completion_of(
    settings: IdempotencySettings, response: T, describe: Callable[[T], ResponseData], keyed: bool = True
) -> Completion[T]:
    """The completion of a framework's response: checked as it will be sent, and its envelope.

    A response that cannot be sent raises :class:`~pg_idempotency.http.UnsendableResponse`
    (rolled back, 500 ``internal-error``), whatever its status, and so does
    an envelope over ``max_response_bytes``; a retryable status is rolled
    back, so it needs no envelope.
    """
    described = describe(response)
    check_sendable(described)
    if settings.is_retryable(described.status) or not keyed:
        return Completion(described.status, None, response)
    envelope = build_envelope(described, settings.replay_headers)
    limit = settings.max_response_bytes
    if limit is not None and len(envelope) > limit and len(envelope.encode()) > limit:
        raise UnsendableResponse(f"the response to store is over max_response_bytes ({limit})")
    return Completion(described.status, envelope, response)


def answer_result(settings: IdempotencySettings, result: Result[T]) -> T | ResponseData:
    """The answer of a run: the handler's response, or the replay of the stored one."""
    if result.outcome != "replay":
        return result.value  # type: ignore[return-value]
    try:
        replay = read_envelope(result.status, result.response, settings.replay_headers)
    except UnsupportedEnvelope as e:
        logger.error("cannot replay: %s", e)
        return problem(settings, "unsupported-envelope")
    replay.headers.append(REPLAYED_HEADER)
    return replay


def _sqlstate(e: BaseException) -> tuple[str | None, str | None] | None:
    """The SQLSTATE and primary message of a database error (psycopg's, or Django's wrapping it)."""
    for error in (e, e.__cause__):
        if isinstance(error, psycopg.Error):
            return error.sqlstate, error.diag.message_primary or str(error)
    return None


#: SQLSTATEs of a server going away: shutdown, crash, not accepting connections yet.
_GONE = frozenset({"57P01", "57P02", "57P03"})


def _connection_lost(e: BaseException) -> bool:
    """Whether a database error is the connection failing or lost (not an error of a statement)."""
    for error in (e, e.__cause__):
        if isinstance(error, psycopg.OperationalError):
            state = error.sqlstate
            return state is None or state.startswith("08") or state in _GONE
    return False


def library_answer(settings: IdempotencySettings, e: BaseException) -> ResponseData | None:
    """The mapping's answer to an error of the library or the database, or ``None`` for any other error.

    The errors it answers are the library's to map, before a framework's
    handlers: a handler's SQL error with SQLSTATE ``40001`` is 503 ``retry``.
    """
    if isinstance(e, ProblemError):
        return problem(settings, e.code, e.detail)
    if isinstance(e, KeyOutcomeError):
        return problem(settings, e.code)
    if isinstance(e, TimeLimitExceeded):
        logger.warning("the handler ran past time_limit; its transaction was rolled back")
        return problem(settings, "time-limit")
    if isinstance(e, UnsendableResponse):
        logger.error("the response cannot be sent or stored; its transaction was rolled back: %s", e)
        return problem(settings, "internal-error")
    if isinstance(e, PoolTimeout) or _connection_lost(e):
        logger.warning("the database is unavailable: %s", e)
        return problem(settings, "unavailable")
    database = _sqlstate(e)
    if database is not None:
        return error_response(settings, *database)
    return None


def answer_error(settings: IdempotencySettings, e: BaseException) -> ResponseData:
    """The mapping's answer to an error that rolled the transaction back (re-raised unless an Exception)."""
    answer = library_answer(settings, e)
    if answer is not None:
        return answer
    if not isinstance(e, Exception):
        raise e
    logger.exception("the idempotent handler failed; its transaction was rolled back")
    return problem(settings, "internal-error")


def _scoped_plan(settings: IdempotencySettings, request: RequestData, principal: object, key: str) -> Plan:
    if inspect.isawaitable(principal):
        raise TypeError("the scope function of a sync runner returned an awaitable")
    return plan(settings, request, key, scope_value(principal))


def _document_plan(
    operation: str, key: str, scope: str, request: Any, ttl: timedelta | None
) -> Plan:
    if not operation or not key or not scope:
        raise ValueError("operation, key and scope must not be empty")
    return Plan(operation, key, scope, dump_json(request), ttl)


# --- psycopg pools ---


class _PoolTransactions:
    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self.pool = pool

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        with self.pool.connection() as conn, conn.transaction():
            yield conn

    def fetchone(self, conn: psycopg.Connection[Any], query: str, params: Sequence[Any]) -> Sequence[Any] | None:
        return conn.execute(query, params).fetchone()

    def can_commit(self, conn: psycopg.Connection[Any]) -> bool:
        return conn.info.transaction_status != pq.TransactionStatus.INERROR


class _AsyncPoolTransactions:
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    async def fetchone(
        self, conn: psycopg.AsyncConnection[Any], query: str, params: Sequence[Any]
    ) -> Sequence[Any] | None:
        cur = await conn.execute(query, params)
        return await cur.fetchone()

    def can_commit(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        return conn.info.transaction_status != pq.TransactionStatus.INERROR


class Idempotency:
    """Runs functions and HTTP handlers idempotently on a psycopg :class:`~psycopg_pool.ConnectionPool`.

    ::

        idem = Idempotency(pool, IdempotencySettings(scope=lambda req: req.header("x-user")))
        response = idem.run(request, lambda conn: handler(conn, request))

    The constructor checks the extension's version (``check=False`` skips it).
    ``passthrough`` names exceptions that are rolled back and re-raised (to
    a framework's own handlers) instead of being answered.
    """

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
        self.passthrough = passthrough
        self.extension_version: str | None = None
        self._tx = _PoolTransactions(pool)
        if check:
            self.check_version()

    def check_version(self) -> str:
        """The extension's version; raises :class:`~pg_idempotency.ExtensionVersionError` below 0.2.0."""
        with self.pool.connection() as conn:
            row = conn.execute(VERSION_SQL).fetchone()
            conn.rollback()
        self.extension_version = require_version(row[0] if row else None)
        return self.extension_version

    def run_under_key(
        self,
        *,
        operation: str,
        key: str,
        scope: str,
        request: Any,
        fn: Callable[[psycopg.Connection[Any]], Completion[T]],
        ttl: timedelta | None = None,
        policy: Policy = Policy(),
        resolve: Callable[[Exception], Completion[T] | None] | None = None,
    ) -> Result[T]:
        """The core runner: ``fn(conn)`` under ``key``, in one transaction with its record.

        ``request`` is the request document (any JSON value; its
        ``idem_hash`` is the fingerprint). Returns ``new`` with ``fn``'s
        completion after COMMIT, ``replay`` with the stored status and
        response (``fn`` not called), or ``rolled_back`` for a retryable
        status; raises :class:`~pg_idempotency.InProgressError`,
        :class:`~pg_idempotency.StuckError`, :class:`~pg_idempotency.MismatchError`,
        and any other error after ROLLBACK. A raised error that ``policy``
        makes final is completed with ``resolve(error)``.
        """
        return run_sync(self._tx, _document_plan(operation, key, scope, request, ttl), fn, policy, resolve)

    @overload
    def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.Connection[Any]], ResponseData],
        *,
        resolve: Callable[[Exception], ResponseData | None] | None = ...,
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
        resolve: Callable[[Exception], R | None] | None = ...,
        scope_arg: object = ...,
        settings: IdempotencySettings | None = ...,
    ) -> R | ResponseData: ...

    def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.Connection[Any]], Any],
        describe: Callable[[Any], ResponseData] = _identity,
        *,
        resolve: Callable[[Exception], Any] | None = None,
        scope_arg: object = None,
        settings: IdempotencySettings | None = None,
    ) -> Any:
        """Run ``handler(conn)`` for ``request`` idempotently, and return its response or the library's.

        ``describe`` turns the handler's own response type into
        :class:`ResponseData` (for the envelope); the result is the handler's
        response or a :class:`ResponseData` (replay, problem). ``resolve``
        is the framework's response to a raised error, or ``None`` where
        the framework has none: a final error is completed with it, any
        other is rolled back and answered with it. The scope function gets
        ``scope_arg`` (default: ``request``); ``settings`` overrides the
        runner's for this call.
        """
        s = settings or self.settings
        if s.scope is None:
            s.validate()
        assert s.scope is not None
        try:
            key = read_key(s, request)
            p = None
            if key is not None:
                p = _scoped_plan(s, request, s.scope(request if scope_arg is None else scope_arg), key)
        except ProblemError as e:
            return problem(s, e.code, e.detail)
        except Exception as e:  # a scope function that fails: problem+json, never the framework's page
            return answer_error(s, e)
        return self._http(s, p, handler, describe, resolve)

    def transaction(
        self,
        handler: Callable[[psycopg.Connection[Any]], Any],
        describe: Callable[[Any], ResponseData] = _identity,
        *,
        resolve: Callable[[Exception], Any] | None = None,
        settings: IdempotencySettings | None = None,
    ) -> Any:
        """Run ``handler(conn)`` in a plain transaction, without a key.

        Committed unless the handler raises or returns a retryable status,
        and its errors answered as :meth:`run` answers them.
        """
        return self._http(settings or self.settings, None, handler, describe, resolve)

    def _http(
        self,
        s: IdempotencySettings,
        p: Plan | None,
        handler: Callable[[psycopg.Connection[Any]], Any],
        describe: Callable[[Any], ResponseData],
        resolve: Callable[[Exception], Any] | None,
    ) -> Any:
        limit = time_limit_params(s)

        def fn(conn: psycopg.Connection[Any]) -> Completion[Any]:
            if limit is not None:
                conn.execute(TIME_LIMIT_SQL, limit)
            return completion_of(s, handler(conn), describe, p is not None)

        def resolved(e: Exception) -> Completion[Any] | None:
            response = resolve(e) if resolve is not None else None
            return None if response is None else completion_of(s, response, describe, p is not None)

        try:
            return answer_result(s, run_sync(self._tx, p, fn, policy_of(s), resolved))
        except self.passthrough:
            raise
        except Exception as e:
            answer = library_answer(s, e)
            if answer is None and resolve is not None:
                answer = resolve(e)
            return answer if answer is not None else answer_error(s, e)


class AsyncIdempotency:
    """The async runner, on an :class:`~psycopg_pool.AsyncConnectionPool`.

    The version is checked by :meth:`check_version` (await it at start-up)
    or, at the latest, on the first :meth:`run`. The transaction of a run
    goes on in a task of its own: cancelling the caller (a client that went
    away) does not cancel it, so it commits and the retry replays.
    """

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
        self.passthrough = passthrough
        self.extension_version: str | None = None
        self._check = check
        self._tx = _AsyncPoolTransactions(pool)
        self._tasks: set[asyncio.Task[Any]] = set()

    async def check_version(self) -> str:
        """The extension's version; raises :class:`~pg_idempotency.ExtensionVersionError` below 0.2.0."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(VERSION_SQL)
            row = await cur.fetchone()
            await conn.rollback()
        self.extension_version = require_version(row[0] if row else None)
        return self.extension_version

    async def run_under_key(
        self,
        *,
        operation: str,
        key: str,
        scope: str,
        request: Any,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Completion[T]]],
        ttl: timedelta | None = None,
        policy: Policy = Policy(),
        resolve: Callable[[Exception], Awaitable[Completion[T] | None]] | None = None,
    ) -> Result[T]:
        """The core runner, as :meth:`Idempotency.run_under_key`, shielded from cancellation."""
        p = _document_plan(operation, key, scope, request, ttl)
        result: Result[T] = await self._shielded(run_async(self._tx, p, fn, policy, resolve))
        return result

    @overload
    async def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[ResponseData]],
        *,
        resolve: Callable[[Exception], Awaitable[ResponseData | None]] | None = ...,
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
        resolve: Callable[[Exception], Awaitable[R | None]] | None = ...,
        scope_arg: object = ...,
        settings: IdempotencySettings | None = ...,
    ) -> R | ResponseData: ...

    async def run(
        self,
        request: RequestData,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]],
        describe: Callable[[Any], ResponseData] = _identity,
        *,
        resolve: Callable[[Exception], Awaitable[Any]] | None = None,
        scope_arg: object = None,
        settings: IdempotencySettings | None = None,
    ) -> Any:
        """Run ``await handler(conn)`` for ``request`` idempotently (see :meth:`Idempotency.run`).

        The scope function may be a coroutine function.
        """
        s = settings or self.settings
        if self._check and self.extension_version is None:
            try:
                await self.check_version()
            except (PoolTimeout, psycopg.OperationalError) as e:
                return answer_error(s, e)
        if s.scope is None:
            s.validate()
        assert s.scope is not None
        try:
            key = read_key(s, request)
            p = None
            if key is not None:
                principal = s.scope(request if scope_arg is None else scope_arg)
                if inspect.isawaitable(principal):
                    principal = await principal
                p = _scoped_plan(s, request, principal, key)
        except ProblemError as e:
            return problem(s, e.code, e.detail)
        except Exception as e:  # a scope function that fails: problem+json, never the framework's page
            return answer_error(s, e)
        return await self._shielded(self._http(s, p, handler, describe, resolve))

    async def transaction(
        self,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]],
        describe: Callable[[Any], ResponseData] = _identity,
        *,
        resolve: Callable[[Exception], Awaitable[Any]] | None = None,
        settings: IdempotencySettings | None = None,
    ) -> Any:
        """Run ``await handler(conn)`` in a plain transaction (no key), shielded like :meth:`run`."""
        return await self._shielded(self._http(settings or self.settings, None, handler, describe, resolve))

    async def _shielded(self, work: Awaitable[Any]) -> Any:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(task)

    async def _http(
        self,
        s: IdempotencySettings,
        p: Plan | None,
        handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]],
        describe: Callable[[Any], ResponseData],
        resolve: Callable[[Exception], Awaitable[Any]] | None,
    ) -> Any:
        limit = s.time_limit

        async def fn(conn: psycopg.AsyncConnection[Any]) -> Completion[Any]:
            if limit is None:
                return completion_of(s, await handler(conn), describe, p is not None)
            try:
                response = await asyncio.wait_for(handler(conn), limit.total_seconds())
            except asyncio.TimeoutError as e:
                raise TimeLimitExceeded(f"the handler ran past {limit}") from e
            return completion_of(s, response, describe, p is not None)

        async def resolved(e: Exception) -> Completion[Any] | None:
            response = await resolve(e) if resolve is not None else None
            return None if response is None else completion_of(s, response, describe, p is not None)

        try:
            return answer_result(s, await run_async(self._tx, p, fn, policy_of(s), resolved))
        except self.passthrough:
            raise
        except Exception as e:
            answer = library_answer(s, e)
            if answer is None and resolve is not None:
                answer = await resolve(e)
            return answer if answer is not None else answer_error(s, e)
