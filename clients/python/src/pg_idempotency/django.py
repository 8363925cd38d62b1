"""Django: a middleware and a view decorator, inside ``transaction.atomic()`` on Django's connection.

settings.py::

    IDEMPOTENCY = {
        "SCOPE": "payments.auth.account_of",   # a callable or its dotted path: request -> str | None
        "TTL": timedelta(days=1),
    }
    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "pg_idempotency.django.IdempotencyMiddleware",   # after authentication
    ]

The middleware makes every POST and PATCH view idempotent (``METHODS``),
except those marked :func:`idempotency_exempt`; :func:`idempotent` marks a
view with per-view settings, and works without the middleware too. The
view runs in ``transaction.atomic(using=DATABASE)``, between ``idem_reserve``
and ``idem_complete``: the ORM's writes and the key commit together.

Keys of ``IDEMPOTENCY``: ``SCOPE`` (required), ``OPERATION``,
``FINGERPRINT``, ``TTL`` (a ``timedelta`` or seconds), ``KEY_REQUIRED``,
``REPLAY_HEADERS``, ``RETRYABLE_STATUSES``, ``FINAL_ERRORS`` (exception
classes or their dotted paths, or a predicate), ``MAX_BODY_BYTES``,
``MAX_RESPONSE_BYTES``, ``MAPPING``, ``RETRY_AFTER``,
``METHODS``, ``DATABASE`` (default ``"default"``), ``CHECK_VERSION``
(default true).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any, TypeVar, cast

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.core.exceptions import (
    BadRequest,
    ImproperlyConfigured,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.core.handlers.exception import response_for_exception
from django.db import connections, transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.http.multipartparser import MultiPartParserError
from django.utils.module_loading import import_string

from ._core_runner import Completion, run_sync
from ._routes import angle_template
from .core import (
    TIME_LIMIT_SQL,
    Plan,
    ProblemError,
    check_body_size,
    plan,
    problem,
    read_key,
    scope_value,
    time_limit_params,
)
from .runner import answer_error, answer_result, completion_of, library_answer, policy_of
from .http import RequestData, ResponseData
from .settings import IdempotencySettings
from .version import VERSION_SQL, require_version

__all__ = ["IdempotencyMiddleware", "check_version", "idempotency_exempt", "idempotent", "load_settings"]

V = TypeVar("V", bound=Callable[..., HttpResponseBase])

_MARK = "pg_idempotency"
_EXEMPT = "exempt"
#: The exceptions Django itself answers (``response_for_exception``): rolled back and re-raised to
#: Django (its middleware's ``process_exception``, ``handler404``...), or completed when final.
_DJANGO_ERRORS: tuple[type[BaseException], ...] = (
    Http404,
    PermissionDenied,
    SuspiciousOperation,
    BadRequest,
    MultiPartParserError,
)
_KEYS = {
    "SCOPE": "scope",
    "OPERATION": "operation",
    "FINGERPRINT": "fingerprint",
    "TTL": "ttl",
    "KEY_REQUIRED": "key_required",
    "REPLAY_HEADERS": "replay_headers",
    "RETRYABLE_STATUSES": "retryable_statuses",
    "FINAL_ERRORS": "final_errors",
    "TIME_LIMIT": "time_limit",
    "MAX_BODY_BYTES": "max_body_bytes",
    "MAX_RESPONSE_BYTES": "max_response_bytes",
    "MAPPING": "mapping",
    "RETRY_AFTER": "retry_after",
    "METHODS": "methods",
}
_checked: set[str] = set()
_generation = [0]


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    """Settings changed (override_settings): decorated views read IDEMPOTENCY again."""
    if setting in ("IDEMPOTENCY", "DATABASES"):
        _generation[0] += 1
        _checked.clear()


setting_changed.connect(_on_setting_changed)


def load_settings(**overrides: Any) -> tuple[IdempotencySettings, str, bool]:
    """The settings of ``settings.IDEMPOTENCY`` with ``overrides``: (settings, database alias, check version)."""
    conf: dict[str, Any] = dict(getattr(django_settings, "IDEMPOTENCY", {}))
    alias = str(conf.pop("DATABASE", "default"))
    check = bool(conf.pop("CHECK_VERSION", True))
    unknown = set(conf) - set(_KEYS)
    if unknown:
        raise ImproperlyConfigured(f"IDEMPOTENCY has unknown keys: {', '.join(sorted(unknown))}")
    kwargs = {_KEYS[k]: v for k, v in conf.items()}
    if isinstance(kwargs.get("scope"), str):
        kwargs["scope"] = import_string(kwargs["scope"])
    final = kwargs.get("final_errors")
    if isinstance(final, (list, tuple)):
        kwargs["final_errors"] = tuple(import_string(c) if isinstance(c, str) else c for c in final)
    elif isinstance(final, str):
        kwargs["final_errors"] = import_string(final)
    if isinstance(kwargs.get("time_limit"), (int, float)):
        kwargs["time_limit"] = timedelta(seconds=kwargs["time_limit"])
    if isinstance(kwargs.get("ttl"), (int, float)):
        kwargs["ttl"] = timedelta(seconds=kwargs["ttl"])
    kwargs.update(overrides)
    try:
        return IdempotencySettings(**kwargs).validate(), alias, check
    except (TypeError, ValueError) as e:
        raise ImproperlyConfigured(f"IDEMPOTENCY: {e}") from e


def check_version(alias: str = "default") -> str:
    """The extension's version in database ``alias``; raises ExtensionVersionError below 0.2.0."""
    with connections[alias].cursor() as cur:
        cur.execute(VERSION_SQL)
        row = cur.fetchone()
    version = require_version(row[0] if row else None)
    _checked.add(alias)
    return version


def _request_data(request: HttpRequest) -> RequestData:
    match = request.resolver_match
    route = angle_template(match.route) if match is not None and match.route else None
    headers: list[tuple[str, str]] = []
    for name, value in request.META.items():
        if name.startswith("HTTP_"):
            headers.append((name[5:].replace("_", "-").lower(), str(value)))
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            headers.append((name.replace("_", "-").lower(), str(value)))
    return RequestData(request.method or "GET", request.path, headers, _body(request), route)


def _body(request: HttpRequest) -> bytes:
    """The body; over Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` it is ``payload-too-large`` too."""
    try:
        return request.body
    except RequestDataTooBig:
        raise ProblemError("payload-too-large") from None


def _buffered(response: HttpResponseBase) -> HttpResponseBase:
    """The response with its body in memory: rendered, or a streaming body read whole."""
    render = getattr(response, "render", None)
    if callable(render) and not getattr(response, "is_rendered", True):
        render()
    if isinstance(response, StreamingHttpResponse):
        buffered = HttpResponse(b"".join(response.streaming_content), status=response.status_code)  # type: ignore[arg-type]
        for name, value in response.items():
            buffered[name] = value
        buffered.cookies = response.cookies
        return buffered
    return response


def _describe(response: HttpResponseBase) -> ResponseData:
    body = response.content if isinstance(response, HttpResponse) else b""
    return ResponseData(response.status_code, list(response.items()), bytes(body))


def to_response(data: ResponseData) -> HttpResponse:
    """A Django response of a replay or problem."""
    response = HttpResponse(data.body, status=data.status)
    del response["Content-Type"]
    for name, value in data.headers:
        response[name] = value
    return response


class _Atomic:
    """The core runner's transactions: ``transaction.atomic(using=alias)`` on Django's connection."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        with transaction.atomic(using=self.alias):
            yield None

    def fetchone(self, conn: None, query: str, params: Sequence[Any]) -> Sequence[Any] | None:
        with connections[self.alias].cursor() as cur:
            cur.execute(query, params)
            row: Sequence[Any] | None = cur.fetchone()
            return row

    def can_commit(self, conn: None) -> bool:
        if transaction.get_rollback(using=self.alias):
            return False
        raw = connections[self.alias].connection
        info = getattr(raw, "info", None)
        return info is None or str(getattr(info.transaction_status, "name", "")) != "INERROR"


def _run(
    request: HttpRequest,
    view: Callable[[], HttpResponseBase],
    settings: IdempotencySettings,
    alias: str,
    check: bool,
) -> HttpResponseBase:
    """The protocol around ``view()`` in ``transaction.atomic(using=alias)``, by the core runner."""
    if check and alias not in _checked:
        try:
            check_version(alias)
        except Exception as e:  # the database unreachable is 503 unavailable; an old extension raises
            unavailable = library_answer(settings, e)
            if unavailable is None:
                raise
            return to_response(unavailable)
    assert settings.scope is not None
    idempotent_method = (request.method or "").upper() in settings.methods
    try:
        if idempotent_method:
            length = request.META.get("CONTENT_LENGTH")
            check_body_size(settings, int(length) if length and str(length).isdigit() else None)
        data = _request_data(request)
        if idempotent_method:
            check_body_size(settings, len(data.body))
        key = read_key(settings, data) if idempotent_method else None
        p: Plan | None = None
        if key is not None:
            p = plan(settings, data, key, scope_value(settings.scope(request)))
    except ProblemError as e:
        return to_response(problem(settings, e.code, e.detail))
    except Exception as e:  # a scope function that fails: problem+json, never Django's page
        return to_response(answer_error(settings, e))

    limit = time_limit_params(settings)

    def fn(conn: None) -> Completion[HttpResponseBase]:
        if limit is not None:
            with connections[alias].cursor() as cur:
                cur.execute(TIME_LIMIT_SQL, limit)
        return completion_of(settings, _buffered(view()), _describe, p is not None)

    def resolve(e: Exception) -> Completion[HttpResponseBase] | None:
        if not isinstance(e, _DJANGO_ERRORS):
            return None
        return completion_of(settings, _buffered(response_for_exception(request, e)), _describe, p is not None)

    try:
        result = run_sync(_Atomic(alias), p, fn, policy_of(settings), resolve)
    except _DJANGO_ERRORS:
        raise
    except Exception as e:
        answer = library_answer(settings, e)
        return to_response(answer if answer is not None else answer_error(settings, e))
    response = answer_result(settings, result)
    return to_response(response) if isinstance(response, ResponseData) else response


def idempotent(view: V | None = None, **overrides: Any) -> Any:
    """Make a view idempotent, with per-view settings (``operation="create-payment"``, ...).

    Usable as ``@idempotent`` or ``@idempotent(**overrides)``; it does not
    need the middleware (which leaves a decorated view to it).
    """

    def decorate(func: V) -> V:
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"pg_idempotency.django.idempotent supports sync views; {func.__qualname__} is async")
        loaded: dict[int, tuple[IdempotencySettings, str, bool]] = {}

        @functools.wraps(func)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            generation = _generation[0]
            if generation not in loaded:
                loaded.clear()
                loaded[generation] = load_settings(**overrides)
            settings, alias, check = loaded[generation]
            return _run(request, lambda: func(request, *args, **kwargs), settings, alias, check)

        setattr(wrapper, _MARK, dict(overrides))
        return cast(V, wrapper)

    return decorate(view) if view is not None else decorate


def idempotency_exempt(view: V) -> V:
    """Leave a view out of the middleware's idempotency."""
    setattr(view, _MARK, _EXEMPT)
    return view


class IdempotencyMiddleware:
    """Makes every view idempotent for the settings' ``METHODS`` (POST, PATCH).

    Created when Django loads its middleware: it reads ``settings.IDEMPOTENCY``
    and checks the extension's version, refusing to start without a scope
    function or on a missing or older extension.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.settings, self.alias, check = load_settings()
        if check:
            check_version(self.alias)

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view_func: Callable[..., HttpResponseBase], view_args: Any, view_kwargs: Any
    ) -> HttpResponseBase | None:
        """Run the view idempotently unless it is decorated (or exempt) or its method is not idempotent."""
        if hasattr(view_func, _MARK) or (request.method or "").upper() not in self.settings.methods:
            return None
        if inspect.iscoroutinefunction(view_func):
            raise ImproperlyConfigured(
                f"pg_idempotency's middleware supports sync views; mark the async view "
                f"{getattr(view_func, '__qualname__', view_func)} with idempotency_exempt"
            )
        return _run(request, lambda: view_func(request, *view_args, **view_kwargs), self.settings, self.alias, False)
