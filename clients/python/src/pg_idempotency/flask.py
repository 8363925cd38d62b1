"""Flask: an extension object whose decorator makes a view idempotent.

::

    from pg_idempotency.flask import FlaskIdempotency, connection

    idem = FlaskIdempotency(pool, IdempotencySettings(scope=lambda request: current_account()))
    idem.init_app(app)                      # checks the extension's version

    @app.post("/payments")
    @idem.idempotent(operation="create-payment")
    def create_payment():
        connection().execute("INSERT ...")  # the request's transaction
        return {"id": 1}, 201

The view runs in one transaction on one connection of the psycopg pool,
between ``idem_reserve`` and ``idem_complete``, committed before the
response leaves. The scope function gets Flask's ``request``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import psycopg
from flask import Flask, Response, current_app, g, make_response, request
from flask.typing import ResponseReturnValue
from psycopg_pool import ConnectionPool, PoolTimeout
from werkzeug.exceptions import RequestEntityTooLarge

from ._routes import angle_template
from .core import ProblemError, check_body_size, problem
from .http import RequestData, ResponseData
from .runner import Idempotency, answer_error
from .settings import IdempotencySettings

__all__ = ["FlaskIdempotency", "connection"]

F = TypeVar("F", bound=Callable[..., ResponseReturnValue])

_G = "pg_idempotency_connection"


def connection() -> psycopg.Connection[Any]:
    """The connection of the current idempotent view, in its transaction."""
    conn: psycopg.Connection[Any] | None = g.get(_G)
    if conn is None:
        raise RuntimeError("pg_idempotency: connection() outside a view decorated with FlaskIdempotency.idempotent")
    return conn


def _request_data(settings: IdempotencySettings) -> RequestData:
    """The request, its body read no further than ``max_body_bytes`` (``payload-too-large`` beyond it)."""
    rule = request.url_rule.rule if request.url_rule is not None else None
    check_body_size(settings, request.content_length)
    limit = settings.max_body_bytes
    if limit is not None and (request.max_content_length is None or request.max_content_length > limit):
        request.max_content_length = limit
    try:
        body = request.get_data(cache=True)
    except RequestEntityTooLarge:
        raise ProblemError("payload-too-large") from None
    return RequestData(
        request.method,
        request.root_path + request.path,
        list(request.headers.items()),
        body,
        angle_template(rule) if rule is not None else None,
    )


def _describe(response: Response) -> ResponseData:
    return ResponseData(response.status_code, list(response.headers.items()), response.get_data())


def _to_flask(data: ResponseData) -> Response:
    response = Response(data.body, status=data.status)
    response.headers.clear()
    for name, value in data.headers:
        response.headers.add(name, value)
    return response


def _resolve(exc: Exception) -> Response | None:
    """Flask's response to ``exc`` (Werkzeug's HTTP errors, the app's error handlers), or ``None``."""
    try:
        rv = current_app.handle_user_exception(exc)
    except Exception as raised:
        if raised is exc:
            return None
        raise
    return current_app.make_response(rv)


class FlaskIdempotency(Idempotency):
    """:class:`~pg_idempotency.Idempotency` for Flask; ``app`` (or :meth:`init_app`) checks the version.

    An exception raised by a view is rolled back and answered as Flask
    resolves it (Werkzeug's HTTP errors, ``abort(402)``, and the app's
    ``errorhandler`` functions), whatever its status; one of the settings'
    ``final_errors`` is completed with that answer instead. An exception
    Flask has no handler for is rolled back and answered ``internal-error``.
    """

    def __init__(
        self,
        pool: ConnectionPool[Any],
        settings: IdempotencySettings,
        app: Flask | None = None,
        *,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> None:
        super().__init__(pool, settings, check=False, passthrough=passthrough)
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Register on ``app`` and check the extension's version (refuses to start below 0.2.0)."""
        self.check_version()
        app.extensions["pg_idempotency"] = self

    def idempotent(self, **overrides: Any) -> Callable[[F], F]:
        """Decorate a view: it runs idempotently with the settings and these per-route ``overrides``."""
        settings = self.settings.replace(**overrides) if overrides else self.settings
        settings.validate()

        def decorate(view: F) -> F:
            @functools.wraps(view)
            def wrapper(*args: Any, **kwargs: Any) -> Response:
                if self.extension_version is None:
                    try:
                        self.check_version()
                    except (PoolTimeout, psycopg.OperationalError) as e:
                        return _to_flask(answer_error(settings, e))

                def run(conn: psycopg.Connection[Any]) -> Response:
                    g.setdefault(_G, None)
                    setattr(g, _G, conn)
                    try:
                        return make_response(view(*args, **kwargs))
                    finally:
                        setattr(g, _G, None)

                if request.method.upper() not in settings.methods:
                    result = self.transaction(run, _describe, resolve=_resolve, settings=settings)
                else:
                    try:
                        data = _request_data(settings)
                    except ProblemError as e:
                        return _to_flask(problem(settings, e.code, e.detail))
                    result = self.run(data, run, _describe, resolve=_resolve, scope_arg=request, settings=settings)
                return _to_flask(result) if isinstance(result, ResponseData) else result

            return cast(F, wrapper)

        return decorate
