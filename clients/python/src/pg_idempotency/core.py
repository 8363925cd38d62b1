"""The steps of one idempotent request, shared by every integration.

An integration (or your own code) runs them in this order, in one database
transaction on one connection:

1. :func:`read_key` — the ``Idempotency-Key``; :func:`plan` — the scope, the
   operation and the fingerprint document (both raise :class:`ProblemError`);
2. ``RESERVE_SQL`` with :meth:`Plan.reserve_params`: ``new``, a replay, or
   an outcome raised as its typed error (:func:`outcome_error`);
3. the handler, on the same connection and transaction;
4. ``COMPLETE_SQL`` with :meth:`Plan.complete_params` and COMMIT, or
   ROLLBACK for a retryable status;
5. :func:`error_response` for a database error (by SQLSTATE).

:mod:`pg_idempotency.runner` runs steps 2 to 4 (its core runner is the only
code that reserves, completes and commits); the HTTP integrations add
steps 1 and 5 and the checks of what can be sent
(:func:`~pg_idempotency.http.check_sendable`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .fingerprint import InvalidFingerprint, request_document
from .http import RequestData, ResponseData
from .keys import InvalidKey, parse_key
from .mapping import SQLSTATE_CODES, problem_response
from .settings import IdempotencySettings

__all__ = [
    "COMPLETE_SQL",
    "REPLAYED_HEADER",
    "RESERVE_SQL",
    "Plan",
    "InProgressError",
    "KeyOutcomeError",
    "MismatchError",
    "ProblemError",
    "StuckError",
    "TIME_LIMIT_SQL",
    "TimeLimitExceeded",
    "check_body_size",
    "error_response",
    "time_limit_params",
    "outcome_error",
    "logger",
    "plan",
    "problem",
    "read_key",
    "scope_value",
]

logger = logging.getLogger("pg_idempotency")

#: Reserves the key; ``response`` comes back as text so that numbers keep their digits.
RESERVE_SQL = (
    "SELECT outcome, response_status, response::text"
    " FROM idem_reserve(%s, %s, %s::jsonb, scope => %s, ttl => %s::interval)"
)

#: Completes the key with the response envelope and status.
COMPLETE_SQL = "SELECT idem_complete(%s, %s, %s::jsonb, %s, scope => %s)"

#: Bounds the key's transaction on the server (the sync integrations' ``time_limit``), in milliseconds.
TIME_LIMIT_SQL = (
    "SELECT set_config('statement_timeout', %s, true), set_config('idle_in_transaction_session_timeout', %s, true)"
)


def time_limit_params(settings: IdempotencySettings) -> tuple[str, str] | None:
    """The parameters of :data:`TIME_LIMIT_SQL` for ``settings.time_limit``, or ``None`` without one."""
    if settings.time_limit is None:
        return None
    ms = str(max(1, int(settings.time_limit.total_seconds() * 1000)))
    return ms, ms


class TimeLimitExceeded(Exception):
    """The handler ran past ``time_limit``: rolled back, 503 ``time-limit``."""


#: The header a replay carries.
REPLAYED_HEADER = ("Idempotent-Replayed", "true")


class ProblemError(Exception):
    """A request answered with a problem of the mapping, by its code."""

    def __init__(self, code: str, detail: str | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.detail = detail


class KeyOutcomeError(Exception):
    """``idem_reserve`` answered an outcome other than ``new`` or ``replay``; ``code`` is its problem code."""

    code = "internal-error"
    outcome = ""

    def __init__(self, operation: str, key: str) -> None:
        super().__init__(f"{self.outcome}: operation {operation!r}, key {key!r}")


class InProgressError(KeyOutcomeError):
    """Another transaction holds the key right now (outcome ``in_progress``, 409)."""

    code = "in-progress"
    outcome = "in_progress"


class StuckError(KeyOutcomeError):
    """A first attempt's outcome is unknown (outcome ``stuck``, 409)."""

    code = "stuck"
    outcome = "stuck"


class MismatchError(KeyOutcomeError):
    """The key was used with another request (outcome ``mismatch``, 422)."""

    code = "mismatch"
    outcome = "mismatch"


_OUTCOME_ERRORS: dict[str, type[KeyOutcomeError]] = {
    c.outcome: c for c in (InProgressError, StuckError, MismatchError)
}


@dataclass(frozen=True)
class Plan:
    """What one request reserves: operation, key, scope, request document (JSON text), ttl."""

    operation: str
    key: str
    scope: str
    document: str
    ttl: timedelta | None

    def reserve_params(self) -> tuple[Any, ...]:
        """The parameters of :data:`RESERVE_SQL`."""
        return (self.operation, self.key, self.document, self.scope, self.ttl)

    def complete_params(self, envelope: str | None, status: int) -> tuple[Any, ...]:
        """The parameters of :data:`COMPLETE_SQL`."""
        return (self.operation, self.key, envelope, status, self.scope)


def problem(settings: IdempotencySettings, code: str, detail: str | None = None) -> ResponseData:
    """The mapping's answer for ``code``."""
    return problem_response(settings.mapping, code, settings.retry_after, detail)


def check_body_size(settings: IdempotencySettings, length: int | None) -> None:
    """Raise ``payload-too-large`` for a body (or a ``Content-Length``) over ``max_body_bytes``."""
    if length is not None and settings.max_body_bytes is not None and length > settings.max_body_bytes:
        raise ProblemError("payload-too-large")


def read_key(settings: IdempotencySettings, request: RequestData) -> str | None:
    """The request's key; ``None`` when it has none and the key is optional.

    Raises :class:`ProblemError` ``missing-key`` or ``invalid-key``.
    """
    try:
        key = parse_key(request.header_values("idempotency-key"))
    except InvalidKey as e:
        raise ProblemError("invalid-key", str(e)) from None
    if key is None and settings.key_required:
        raise ProblemError("missing-key")
    return key


def scope_value(principal: object) -> str:
    """The scope of a scope function's result; raises ``unauthenticated`` for none, ``invalid-request`` for a NUL."""
    if principal is None or principal == "":
        raise ProblemError("unauthenticated")
    if not isinstance(principal, str):
        raise TypeError(f"the scope function returned {type(principal).__name__}, not str or None")
    if "\x00" in principal:
        # PostgreSQL's text cannot hold it; one over 255 bytes is the extension's 22023
        raise ProblemError("invalid-request", "The principal contains a NUL character.")
    return principal


def plan(settings: IdempotencySettings, request: RequestData, key: str, scope: str) -> Plan:
    """The reservation of a request whose key and scope are known.

    Raises :class:`ProblemError` ``invalid-request`` for a fingerprint subset
    on a body that is not JSON.
    """
    operation = settings.operation or f"{request.method.upper()} {request.route or request.path}"
    try:
        document = request_document(
            request.method, request.path, request.header("content-type"), request.body, settings.fingerprint
        )
    except InvalidFingerprint as e:
        raise ProblemError("invalid-request", str(e)) from None
    return Plan(operation, key, scope, document, settings.ttl)


def outcome_error(outcome: str, operation: str, key: str) -> KeyOutcomeError:
    """The typed error of an outcome of ``idem_reserve`` other than ``new`` and ``replay``."""
    cls = _OUTCOME_ERRORS.get(outcome)
    if cls is None:
        raise RuntimeError(f"idem_reserve returned the unknown outcome {outcome!r}")
    return cls(operation, key)


def error_response(settings: IdempotencySettings, sqlstate: str | None, message: str | None) -> ResponseData:
    """The mapping's answer to a database error (rolled back), by its SQLSTATE.

    ``22023`` carries the server's message as its detail; every other error
    its row's sentence, never the error's text.
    """
    code = SQLSTATE_CODES.get(sqlstate or "", "internal-error")
    if code == "internal-error":
        logger.error("database error %s: %s", sqlstate, message)
    return problem(settings, code, message if code == "invalid-request" else None)
