"""pg-idempotency: the ``idempotency`` PostgreSQL extension in Python web services.

The record of a request and its effect commit together or not at all:
the library reserves the key, runs the handler and completes the key in one
database transaction, on one connection.

Core (psycopg 3): :class:`Idempotency` and :class:`AsyncIdempotency`; their
``run_under_key`` is the core runner, which every integration calls.
Any function: :func:`idempotent_function`; Celery tasks: :mod:`pg_idempotency.celery`.
Integrations: :mod:`pg_idempotency.django`, :mod:`pg_idempotency.fastapi`,
:mod:`pg_idempotency.starlette`, :mod:`pg_idempotency.flask`.
"""

from ._version import __version__
from ._core_runner import Completion, Policy, Result
from .core import COMPLETE_SQL, RESERVE_SQL, InProgressError, KeyOutcomeError, MismatchError, Plan, ProblemError, StuckError
from .envelope import ENVELOPE_VERSION, UnsupportedEnvelope, build_envelope, read_envelope
from .fingerprint import InvalidFingerprint, request_document
from .functions import idempotent_function
from .http import RequestData, ResponseData, UnsendableResponse
from .keys import InvalidKey, parse_key
from .mapping import DEFAULT_MAPPING, OUTCOME_CODES, PROBLEM_TYPE_BASE, SQLSTATE_CODES, Problem
from .runner import AsyncIdempotency, Idempotency
from .settings import (
    DEFAULT_REPLAY_HEADERS,
    DEFAULT_RETRYABLE_STATUSES,
    FinalErrors,
    IdempotencySettings,
    ScopeFunction,
)
from .version import MINIMUM_VERSION, ExtensionVersionError, require_version

__all__ = [
    "COMPLETE_SQL",
    "DEFAULT_MAPPING",
    "DEFAULT_REPLAY_HEADERS",
    "DEFAULT_RETRYABLE_STATUSES",
    "ENVELOPE_VERSION",
    "MINIMUM_VERSION",
    "OUTCOME_CODES",
    "PROBLEM_TYPE_BASE",
    "RESERVE_SQL",
    "SQLSTATE_CODES",
    "AsyncIdempotency",
    "Completion",
    "ExtensionVersionError",
    "FinalErrors",
    "Idempotency",
    "IdempotencySettings",
    "InProgressError",
    "InvalidFingerprint",
    "InvalidKey",
    "KeyOutcomeError",
    "MismatchError",
    "Plan",
    "Policy",
    "Problem",
    "ProblemError",
    "RequestData",
    "ResponseData",
    "Result",
    "ScopeFunction",
    "StuckError",
    "UnsendableResponse",
    "UnsupportedEnvelope",
    "__version__",
    "build_envelope",
    "idempotent_function",
    "parse_key",
    "read_envelope",
    "request_document",
    "require_version",
]
