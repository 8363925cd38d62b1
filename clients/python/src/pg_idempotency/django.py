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
``REPLAY_HEADERS``, ``RETRYABLE_STATUSES``, ``MAPPING``, ``RETRY_AFTER``,
``METHODS``, ``DATABASE`` (default ``"default"``), ``CHECK_VERSION``
(default true).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar, cast

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.core.exceptions import BadRequest, ImproperlyConfigured, PermissionDenied, SuspiciousOperation
from django.db import DatabaseError, connections, transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.utils.module_loading import import_string

from ._routes import angle_template
from .core import (
    COMPLETE_SQL,
    RESERVE_SQL,
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

__all__ = ["IdempotencyMiddleware", "check_version", "idempotency_exempt", "idempotent", "load_settings"]

V = TypeVar("V", bound=Callable[..., HttpResponseBase])

_MARK = "pg_idempotency"
_EXEMPT = "exempt"
_PASSTHROUGH: tuple[type[BaseException], ...] = (Http404, PermissionDenied, SuspiciousOperation, BadRequest)
_KEYS = {
    "SCOPE": "scope",
    "OPERATION": "operation",
    "FINGERPRINT": "fingerprint",
    "TTL": "ttl",
    "KEY_REQUIRED": "key_required",
    "REPLAY_HEADERS": "replay_headers",
    "RETRYABLE_STATUSES": "retryable_statuses",
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
    return RequestData(request.method or "GET", request.path, headers, request.body, route)


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


def _sqlstate(e: DatabaseError) -> tuple[str | None, str | None]:
    cause = e.__cause__
    diag = getattr(cause, "diag", None)
    return getattr(cause, "sqlstate", None), getattr(diag, "message_primary", None) or str(e)


def _run(
    request: HttpRequest,
    view: Callable[[], HttpResponseBase],
    settings: IdempotencySettings,
    alias: str,
    check: bool,
) -> HttpResponseBase:
    """The protocol around ``view()`` in ``transaction.atomic(using=alias)``."""
    if check and alias not in _checked:
        check_version(alias)
    assert settings.scope is not None
    idempotent_method = (request.method or "").upper() in settings.methods
    try:
        data = _request_data(request)
        key = read_key(settings, data) if idempotent_method else None
        p = None
        if key is not None:
            p = plan(settings, data, key, scope_value(settings.scope(request)))
    except ProblemError as e:
        return to_response(problem(settings, e.code, e.detail))
    try:
        with transaction.atomic(using=alias):
            if p is not None:
                with connections[alias].cursor() as cur:
                    cur.execute(RESERVE_SQL, p.reserve_params())
                    answer = answer_reservation(settings, cur.fetchone())
                if answer is not None:
                    return to_response(answer)
            response = _buffered(view())
            described = _describe(response)
            envelope = should_complete(settings, described)
            if envelope is None:
                transaction.set_rollback(True, using=alias)
            elif p is not None:
                with connections[alias].cursor() as cur:
                    cur.execute(COMPLETE_SQL, p.complete_params(envelope, described.status))
        return response
    except _PASSTHROUGH:
        raise
    except DatabaseError as e:
        sqlstate, message = _sqlstate(e)
        return to_response(error_response(settings, sqlstate, message))
    except Exception:
        logger.exception("the idempotent view failed; its transaction was rolled back")
        return to_response(problem(settings, "internal-error"))


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
