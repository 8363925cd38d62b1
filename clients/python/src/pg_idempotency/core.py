"""The steps of one idempotent request, shared by every integration.

An integration (or your own code) runs them in this order, in one database
transaction on one connection:

1. :func:`read_key` — the ``Idempotency-Key``; :func:`plan` — the scope, the
   operation and the fingerprint document (both raise :class:`ProblemError`);
2. ``RESERVE_SQL`` with :meth:`Plan.reserve_params`, then
   :func:`answer_reservation`: a replay or a problem, or ``None`` for ``new``;
3. the handler, on the same connection and transaction;
4. :func:`should_complete`: ``COMPLETE_SQL`` with :meth:`Plan.complete_params`
   and COMMIT, or ROLLBACK for a retryable status;
5. :func:`error_response` for a database error (by SQLSTATE).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .envelope import UnsupportedEnvelope, build_envelope, read_envelope
from .fingerprint import InvalidFingerprint, request_document
from .http import RequestData, ResponseData
from .keys import InvalidKey, parse_key
from .mapping import OUTCOME_CODES, SQLSTATE_CODES, problem_response
from .settings import IdempotencySettings

__all__ = [
    "COMPLETE_SQL",
    "REPLAYED_HEADER",
    "RESERVE_SQL",
    "Plan",
    "ProblemError",
    "answer_reservation",
    "error_response",
    "logger",
    "plan",
    "problem",
    "read_key",
    "should_complete",
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

#: The header a replay carries.
REPLAYED_HEADER = ("Idempotent-Replayed", "true")


class ProblemError(Exception):
    """A request answered with a problem of the mapping, by its code."""

    def __init__(self, code: str, detail: str | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.detail = detail


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

    def complete_params(self, envelope: str, status: int) -> tuple[Any, ...]:
        """The parameters of :data:`COMPLETE_SQL`."""
        return (self.operation, self.key, envelope, status, self.scope)


def problem(settings: IdempotencySettings, code: str, detail: str | None = None) -> ResponseData:
    """The mapping's answer for ``code``."""
    return problem_response(settings.mapping, code, settings.retry_after, detail)


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
    """The scope of a scope function's result; raises ``unauthenticated`` for none."""
    if principal is None or principal == "":
        raise ProblemError("unauthenticated")
    if not isinstance(principal, str):
        raise TypeError(f"the scope function returned {type(principal).__name__}, not str or None")
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


def answer_reservation(settings: IdempotencySettings, row: Sequence[Any] | None) -> ResponseData | None:
    """The answer to a reservation row ``(outcome, response_status, response)``; ``None`` for ``new``."""
    if row is None:
        raise RuntimeError("idem_reserve returned no row")
    outcome, status, response = row[0], row[1], row[2]
    if outcome == "new":
        return None
    if outcome == "replay":
        try:
            replay = read_envelope(int(status), response)
        except UnsupportedEnvelope as e:
            logger.error("cannot replay: %s", e)
            return problem(settings, "unsupported-envelope")
        replay.headers.append(REPLAYED_HEADER)
        return replay
    code = OUTCOME_CODES.get(str(outcome))
    if code is None:
        logger.error("idem_reserve returned the unknown outcome %r", outcome)
        return problem(settings, "internal-error")
    return problem(settings, code)


def should_complete(settings: IdempotencySettings, response: ResponseData) -> str | None:
    """The envelope to complete with, or ``None`` when the status is retryable (roll back)."""
    if settings.is_retryable(response.status):
        return None
    return build_envelope(response, settings.replay_headers)


def error_response(settings: IdempotencySettings, sqlstate: str | None, message: str | None) -> ResponseData:
    """The mapping's answer to a database error (rolled back), by its SQLSTATE.

    ``22023`` carries the server's message as its detail; every other error
    its row's sentence, never the error's text.
    """
    code = SQLSTATE_CODES.get(sqlstate or "", "internal-error")
    if code == "internal-error":
        logger.error("database error %s: %s", sqlstate, message)
    return problem(settings, code, message if code == "invalid-request" else None)
