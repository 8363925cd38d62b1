"""The mapping of outcomes and SQLSTATEs to HTTP answers, as data the user can change.

Each case has a problem code; :data:`DEFAULT_MAPPING` gives each code its
status, title, detail and whether it carries ``Retry-After``. Replace rows
with :meth:`IdempotencySettings.replace <pg_idempotency.IdempotencySettings.replace>`::

    mapping = {**DEFAULT_MAPPING, "in-progress": Problem(425, "Too early", "...", retry_after=True)}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .http import ResponseData

__all__ = [
    "DEFAULT_MAPPING",
    "OUTCOME_CODES",
    "PROBLEM_TYPE_BASE",
    "SQLSTATE_CODES",
    "Problem",
    "problem_body",
    "problem_response",
]

#: The ``type`` of a problem is this URL followed by its code (doc/clients.md's anchors).
PROBLEM_TYPE_BASE = "https://github.com/pg-idempotency/idempotency/blob/main/doc/clients.md#"


@dataclass(frozen=True)
class Problem:
    """One row of the mapping: the answer to one case, as ``application/problem+json``.

    ``retry_after`` says whether the answer has a ``Retry-After`` header;
    its value is ``retry_after_seconds`` or, when that is ``None``, the
    settings' ``retry_after``.
    """

    status: int
    title: str
    detail: str
    retry_after: bool = False
    retry_after_seconds: int | None = None


#: The mapping of doc/clients.md, by problem code.
DEFAULT_MAPPING: Mapping[str, Problem] = MappingProxyType(
    {
        "missing-key": Problem(400, "Idempotency-Key missing", "This request needs an Idempotency-Key header."),
        "invalid-key": Problem(
            400,
            "Invalid Idempotency-Key",
            "The Idempotency-Key header must be one string of printable ASCII characters, quoted or bare.",
        ),
        "unauthenticated": Problem(401, "Unauthenticated", "This request needs an authenticated principal."),
        "invalid-request": Problem(400, "Invalid request", "The request has an invalid argument."),
        "payload-too-large": Problem(413, "Payload too large", "The request body is larger than this service takes."),
        "in-progress": Problem(
            409,
            "Request in progress",
            "A request with this Idempotency-Key is still being processed.",
            retry_after=True,
        ),
        "stuck": Problem(
            409,
            "Request outcome unknown",
            "The outcome of the request with this Idempotency-Key is unknown and is being checked.",
            retry_after=True,
        ),
        "mismatch": Problem(
            422,
            "Idempotency-Key reused",
            "This Idempotency-Key was already used with another request.",
        ),
        "read-only": Problem(503, "Database read-only", "The database is read-only; retry later.", retry_after=True),
        "retry": Problem(503, "Retry", "The request conflicted with another one; retry it.", retry_after=True),
        "time-limit": Problem(
            503,
            "Request time limit",
            "The request took longer than this service allows; nothing was kept. Retry it.",
            retry_after=True,
        ),
        "unavailable": Problem(
            503, "Database unavailable", "The database cannot be reached right now; retry later.", retry_after=True
        ),
        "unsupported-envelope": Problem(
            500,
            "Unsupported response envelope",
            "The stored response cannot be read by this service: a newer envelope version, or not a valid envelope.",
        ),
        "internal-error": Problem(500, "Internal error", "The request failed; retry it later."),
    }
)

#: The problem code of each SQLSTATE with its own row; any other is ``internal-error``.
#: ``22P02``, ``22P05``, ``22003``, ``22021`` and ``54001`` are the server refusing
#: the request document or the key as it reads them (doc/clients.md, "Requests
#: the server refuses").
SQLSTATE_CODES: Mapping[str, str] = MappingProxyType(
    {
        "22023": "invalid-request",
        "22P02": "invalid-request",
        "22P05": "invalid-request",
        "22003": "invalid-request",
        "22021": "invalid-request",
        "54001": "invalid-request",
        "25006": "read-only",
        "40001": "retry",
        "40P01": "retry",
        "57014": "time-limit",
        "25P03": "time-limit",
        "ID003": "in-progress",
        "ID004": "mismatch",
        "ID005": "stuck",
    }
)

#: The problem code of each ``idem_reserve`` outcome answered without the handler.
OUTCOME_CODES: Mapping[str, str] = MappingProxyType(
    {"in_progress": "in-progress", "stuck": "stuck", "mismatch": "mismatch"}
)


def problem_body(code: str, problem: Problem, detail: str | None = None) -> bytes:
    """The RFC 9457 body of a problem."""
    doc = {
        "type": PROBLEM_TYPE_BASE + code,
        "title": problem.title,
        "status": problem.status,
        "detail": detail if detail is not None else problem.detail,
        "code": code,
    }
    return json.dumps(doc, ensure_ascii=False).encode()


def problem_response(
    mapping: Mapping[str, Problem], code: str, retry_after: int, detail: str | None = None
) -> ResponseData:
    """The ``application/problem+json`` response of ``code`` under ``mapping``."""
    problem = mapping.get(code) or DEFAULT_MAPPING.get(code) or DEFAULT_MAPPING["internal-error"]
    headers = [("content-type", "application/problem+json")]
    if problem.retry_after:
        seconds = problem.retry_after_seconds if problem.retry_after_seconds is not None else retry_after
        headers.append(("retry-after", str(seconds)))
    return ResponseData(problem.status, headers, problem_body(code, problem, detail))
