"""The settings object: one per application, with per-route overrides."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Union

from .fingerprint import validate_pointer
from .mapping import DEFAULT_MAPPING, Problem

__all__ = [
    "DEFAULT_REPLAY_HEADERS",
    "DEFAULT_RETRYABLE_STATUSES",
    "DEFAULT_SIZE_LIMIT",
    "FinalErrors",
    "IdempotencySettings",
    "ScopeFunction",
]

#: A function of the framework's request that returns the principal (the
#: key's scope), or ``None`` (or ``""``) when there is none (401).
#: Async integrations also accept a coroutine function.
ScopeFunction = Callable[[Any], "str | None | Awaitable[str | None]"]

#: Raised errors completed instead of rolled back: an exception class, a
#: tuple of them, or a predicate of the exception.
FinalErrors = Union[type[BaseException], tuple[type[BaseException], ...], Callable[[BaseException], bool]]

#: The response headers a replay gives back by default.
DEFAULT_REPLAY_HEADERS: frozenset[str] = frozenset({"content-type", "location"})

#: The default of ``max_body_bytes`` and ``max_response_bytes``: 1 MiB, as Node's ``bodyLimit``.
DEFAULT_SIZE_LIMIT = 1024 * 1024

#: The handler statuses that roll back instead of completing: every 5xx, 408 and 429.
DEFAULT_RETRYABLE_STATUSES: frozenset[int] = frozenset(range(500, 600)) | {408, 429}


@dataclass(frozen=True)
class IdempotencySettings:
    """How requests are made idempotent (doc/clients.md, "Settings every library has").

    Attributes:
        scope: the function of the request that returns the principal; required
            (:meth:`validate` raises without it). It is never taken from a header
            the client chooses.
        operation: the route's operation name; ``None`` means ``METHOD path-template``.
        fingerprint: JSON Pointers of the members that make two requests the same;
            ``None`` means the whole body.
        ttl: how long a completed record replays; ``None`` means the server's
            ``idempotency.default_ttl``.
        key_required: a missing key is 400 ``missing-key``; when false the handler
            runs without idempotency (in a transaction of its own).
        replay_headers: the allow-list of stored headers (lower-cased).
        retryable_statuses: handler statuses that roll back instead of completing.
        final_errors: raised errors that are completed with the status and body
            the framework resolves for them (and replayed), instead of rolled
            back: an exception class, a tuple of them, or a predicate of the
            exception. Default: none (every raised error is rolled back).
        time_limit: how long the key's transaction may take from the handler's
            start; past it the transaction is rolled back, the key freed and
            the request answered 503 ``time-limit`` (``None``: no limit). The
            async integrations cancel the handler; the sync ones set the
            transaction's ``statement_timeout`` and
            ``idle_in_transaction_session_timeout``, so that a handler that
            hangs in a statement or between statements cannot hold the key
            longer (the server ends its session; the handler's later SQL fails).
        max_body_bytes: the largest request body read on an idempotent route;
            a larger one is 413 ``payload-too-large`` before anything is
            reserved (``None``: no limit).
        max_response_bytes: the largest envelope stored (UTF-8 bytes); a larger
            response is rolled back and answered 500 ``internal-error``
            (``None``: no limit).
        mapping: the answer of each problem code (:data:`~pg_idempotency.DEFAULT_MAPPING`).
        retry_after: seconds of ``Retry-After``, for the rows that have it.
        methods: the methods made idempotent by a middleware (others pass through).
    """

    scope: ScopeFunction | None = None
    operation: str | None = None
    fingerprint: Sequence[str] | None = None
    ttl: timedelta | None = None
    key_required: bool = True
    replay_headers: Collection[str] = DEFAULT_REPLAY_HEADERS
    retryable_statuses: Collection[int] = DEFAULT_RETRYABLE_STATUSES
    final_errors: FinalErrors = ()
    time_limit: timedelta | None = None
    max_body_bytes: int | None = DEFAULT_SIZE_LIMIT
    max_response_bytes: int | None = DEFAULT_SIZE_LIMIT
    mapping: Mapping[str, Problem] = field(default_factory=lambda: DEFAULT_MAPPING)
    retry_after: int = 1
    methods: Collection[str] = frozenset({"POST", "PATCH"})

    def __post_init__(self) -> None:
        if self.fingerprint is not None:
            if isinstance(self.fingerprint, str):
                raise TypeError("fingerprint must be a sequence of JSON Pointers, not one string")
            for pointer in self.fingerprint:
                validate_pointer(pointer)
            object.__setattr__(self, "fingerprint", tuple(self.fingerprint))
        if self.ttl is not None and self.ttl <= timedelta(0):
            raise ValueError("ttl must be positive")
        for limit in (self.max_body_bytes, self.max_response_bytes):
            if limit is not None and limit < 0:
                raise ValueError("max_body_bytes and max_response_bytes must not be negative")
        if self.time_limit is not None and self.time_limit <= timedelta(0):
            raise ValueError("time_limit must be positive")
        if self.retry_after < 0:
            raise ValueError("retry_after must not be negative")
        final = self.final_errors
        if isinstance(final, type) or isinstance(final, tuple):
            classes = (final,) if isinstance(final, type) else final
            if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
                raise TypeError("final_errors must be exception classes or a predicate of the exception")
        elif not callable(final):
            raise TypeError("final_errors must be exception classes or a predicate of the exception")
        if self.operation is not None and not self.operation:
            raise ValueError("operation must not be empty")
        object.__setattr__(self, "replay_headers", frozenset(h.lower() for h in self.replay_headers))
        object.__setattr__(self, "retryable_statuses", frozenset(self.retryable_statuses))
        object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))
        merged = dict(DEFAULT_MAPPING)
        merged.update(self.mapping)
        object.__setattr__(self, "mapping", merged)

    def replace(self, **changes: Any) -> IdempotencySettings:
        """A copy with ``changes`` applied (the per-route overrides)."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> IdempotencySettings:
        """Raise :class:`ValueError` when a setting needed at start-up is missing; return self."""
        if self.scope is None:
            raise ValueError(
                "pg_idempotency: no scope function is configured; a route needs one "
                "(the function of the request that returns the authenticated principal)"
            )
        return self

    def is_retryable(self, status: int) -> bool:
        """Whether a handler status rolls back instead of completing."""
        return status in self.retryable_statuses

    def is_final(self, error: BaseException) -> bool:
        """Whether a raised error is completed (``final_errors``) instead of rolled back."""
        final = self.final_errors
        if isinstance(final, (type, tuple)):
            return isinstance(error, final)
        return bool(final(error))
