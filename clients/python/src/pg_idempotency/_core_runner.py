"""The core runner: the only code that reserves, runs, completes or rolls back, and commits.

One pure part (what a reservation row means, whether a completion is
committed) and two thin shells over it, :func:`run_sync` and
:func:`run_async`, which differ only in ``await``: the drift between them
is checked by ``tests/test_runner.py`` (their statements, with ``async``
and ``await`` removed, must be the same). Every caller goes through one of
them: the psycopg runners' :meth:`~pg_idempotency.Idempotency.run_under_key`,
the HTTP integrations (Django on its own connection, through
:class:`Transactions` of its ``atomic()``), and later consumers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from .core import COMPLETE_SQL, RESERVE_SQL, Plan, outcome_error
from .http import UnsendableResponse

__all__ = [
    "AsyncTransactions",
    "Completion",
    "Policy",
    "Result",
    "Transactions",
    "run_async",
    "run_sync",
]

T = TypeVar("T")
C = TypeVar("C")

#: SQLSTATEs of ``idem_complete`` for a response ``jsonb`` cannot store: the
#: completion is rolled back as one that cannot be stored, never changed.
_UNSTORABLE = frozenset({"22P02", "22P05", "22003", "22021", "54001"})


@dataclass(frozen=True)
class Completion(Generic[T]):
    """What the function run under a key returns: the status and JSON text to store, and its own value.

    ``response`` is the JSON text of ``idem_keys.response`` (``None``: NULL);
    ``value`` is handed back to the caller untouched (an HTTP response).
    """

    status: int
    response: str | None
    value: T


@dataclass(frozen=True)
class Result(Generic[T]):
    """What a run ended with.

    ``outcome`` is ``"new"`` (the function ran; its completion committed),
    ``"replay"`` (the stored ``status`` and ``response``; the function was
    not called; ``value`` is ``None``) or ``"rolled_back"`` (the function's
    completion had a retryable status, or was a final error's that its
    transaction could no longer commit: nothing was kept).
    """

    outcome: Literal["new", "replay", "rolled_back"]
    status: int
    response: str | None
    value: T | None = None


@dataclass(frozen=True)
class Policy:
    """Which completion statuses are rolled back, and which raised errors are completed.

    A raised error for which ``final`` is true is completed with what
    ``resolve`` (an argument of the run) makes of it, exactly as a returned
    completion; every other raised error is rolled back and raised again.
    """

    retryable: Collection[int] = frozenset()
    final: Callable[[BaseException], bool] = lambda error: False


class Transactions(Protocol[C]):
    """Where a sync run's transaction comes from: a pool's connection, Django's ``atomic()``."""

    def transaction(self) -> AbstractContextManager[C]:
        """A transaction, committed on a clean exit and rolled back on an exception."""

    def fetchone(self, conn: C, query: str, params: Sequence[Any]) -> Sequence[Any] | None:
        """The first row of ``query`` in the transaction."""

    def can_commit(self, conn: C) -> bool:
        """Whether the transaction can still commit (not aborted nor marked rollback-only)."""


class AsyncTransactions(Protocol[C]):
    """Where an async run's transaction comes from."""

    def transaction(self) -> AbstractAsyncContextManager[C]:
        """A transaction, committed on a clean exit and rolled back on an exception."""

    async def fetchone(self, conn: C, query: str, params: Sequence[Any]) -> Sequence[Any] | None:
        """The first row of ``query`` in the transaction."""

    def can_commit(self, conn: C) -> bool:
        """Whether the transaction can still commit."""


class _RolledBack(Exception):
    """Carries a completion out of the transaction block, which rolls back."""

    def __init__(self, completion: Completion[Any]) -> None:
        super().__init__("rolled back")
        self.completion = completion


def _reserved(plan: Plan, row: Sequence[Any] | None) -> Result[Any] | None:
    """The result of a reservation row: ``None`` for ``new``, a replay, or a typed error raised."""
    if row is None:
        raise RuntimeError("idem_reserve returned no row")
    outcome, status, response = row[0], row[1], row[2]
    if outcome == "new":
        return None
    if outcome == "replay":
        return Result("replay", int(status), response)
    raise outcome_error(str(outcome), plan.operation, plan.key)


def _commits(policy: Policy, completion: Completion[Any], doomed: bool) -> bool:
    """Whether a completion is completed and committed (else rolled back); checks its types.

    ``doomed``: a final error's completion whose transaction can no longer
    commit (the handler's own transaction boundary marked it rollback-only).
    """
    if not isinstance(completion, Completion):
        raise TypeError(f"the function run under a key returned {type(completion).__name__}, not a Completion")
    if not isinstance(completion.status, int) or isinstance(completion.status, bool):
        raise UnsendableResponse(f"the completion's status {completion.status!r} is not an integer")
    if completion.response is not None and not isinstance(completion.response, str):
        raise UnsendableResponse("the completion's response is not JSON text")
    return completion.status not in policy.retryable and not doomed


def _unstorable(error: Exception) -> UnsendableResponse | None:
    """The error of an ``idem_complete`` that refused the response, or ``None`` for any other error."""
    for e in (error, error.__cause__):
        if getattr(e, "sqlstate", None) in _UNSTORABLE:
            return UnsendableResponse(f"PostgreSQL cannot store the response: {e}")
    return None


def _result(outcome: Literal["new", "rolled_back"], completion: Completion[T]) -> Result[T]:
    return Result(outcome, completion.status, completion.response, completion.value)


def run_sync(
    tx: Transactions[C],
    plan: Plan | None,
    fn: Callable[[C], Completion[T]],
    policy: Policy,
    resolve: Callable[[Exception], Completion[T] | None] | None = None,
) -> Result[T]:
    """Run ``fn`` in one transaction of ``tx``, under ``plan``'s key (``None``: a plain transaction).

    Raises :class:`~pg_idempotency.InProgressError`, ``StuckError`` or
    ``MismatchError`` for those outcomes, :class:`~pg_idempotency.http.UnsendableResponse`
    for a completion that cannot be stored, and any other error, after
    ROLLBACK, as it was raised.
    """
    try:
        with tx.transaction() as conn:
            if plan is not None:
                replay = _reserved(plan, tx.fetchone(conn, RESERVE_SQL, plan.reserve_params()))
                if replay is not None:
                    return replay
            final = False
            try:
                completion = fn(conn)
            except Exception as e:
                resolved = resolve(e) if resolve is not None and policy.final(e) else None
                if resolved is None:
                    raise
                completion, final = resolved, True
            if not _commits(policy, completion, final and not tx.can_commit(conn)):
                raise _RolledBack(completion)
            if plan is not None:
                try:
                    tx.fetchone(conn, COMPLETE_SQL, plan.complete_params(completion.response, completion.status))
                except Exception as e:
                    unstorable = _unstorable(e)
                    if unstorable is None:
                        raise
                    raise unstorable from e
    except _RolledBack as r:
        return _result("rolled_back", r.completion)
    return _result("new", completion)


async def run_async(
    tx: AsyncTransactions[C],
    plan: Plan | None,
    fn: Callable[[C], Awaitable[Completion[T]]],
    policy: Policy,
    resolve: Callable[[Exception], Awaitable[Completion[T] | None]] | None = None,
) -> Result[T]:
    """The async twin of :func:`run_sync`, statement for statement."""
    try:
        async with tx.transaction() as conn:
            if plan is not None:
                replay = _reserved(plan, await tx.fetchone(conn, RESERVE_SQL, plan.reserve_params()))
                if replay is not None:
                    return replay
            final = False
            try:
                completion = await fn(conn)
            except Exception as e:
                resolved = await resolve(e) if resolve is not None and policy.final(e) else None
                if resolved is None:
                    raise
                completion, final = resolved, True
            if not _commits(policy, completion, final and not tx.can_commit(conn)):
                raise _RolledBack(completion)
            if plan is not None:
                try:
                    await tx.fetchone(conn, COMPLETE_SQL, plan.complete_params(completion.response, completion.status))
                except Exception as e:
                    unstorable = _unstorable(e)
                    if unstorable is None:
                        raise
                    raise unstorable from e
    except _RolledBack as r:
        return _result("rolled_back", r.completion)
    return _result("new", completion)
