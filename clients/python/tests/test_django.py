"""Django: the middleware and the view decorator, through Django's test client.

Django is configured here (no test database of Django's: the tests commit
for real on the session's database, as a TransactionTestCase would). The
views run their SQL on Django's own connection, inside the library's
``transaction.atomic()``.
"""

from __future__ import annotations

import contextlib
import time
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import django
import pytest
from django.conf import settings

from conftest import DB, DB_NOEXT, DB_OLD, READ_ONLY, SHALLOW_STACK, Db

_db = {"ENGINE": "django.db.backends.postgresql", "NAME": DB, "HOST": os.environ.get("PGHOST", ""),
       "PORT": os.environ.get("PGPORT", ""), "USER": os.environ.get("PGUSER", "")}
settings.configure(
    DEBUG=False,
    SECRET_KEY="tests",
    ALLOWED_HOSTS=["testserver"],
    ROOT_URLCONF=__name__,
    INSTALLED_APPS=[],
    MIDDLEWARE=["pg_idempotency.django.IdempotencyMiddleware"],
    DATABASES={
        "default": _db,
        "readonly": {**_db, "OPTIONS": {"options": READ_ONLY}},
        "shallow": {**_db, "OPTIONS": {"options": SHALLOW_STACK}},
        "noext": {**_db, "NAME": DB_NOEXT},
        "old": {**_db, "NAME": DB_OLD},
    },
    IDEMPOTENCY={"SCOPE": __name__ + ".scope"},
)
django.setup()

from django.core.exceptions import PermissionDenied  # noqa: E402
from django.db import DataError, connections  # noqa: E402
from django.http import HttpRequest, HttpResponse, Http404, StreamingHttpResponse  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from django.urls import path  # noqa: E402

from pg_idempotency.django import idempotency_exempt, idempotent  # noqa: E402

from behaviour import Answer, Behaviour, Post, handler_answer, handler_sql, principal  # noqa: E402


def scope(request: HttpRequest) -> str | None:
    return principal(request.headers.get("Authorization"))


def _alias() -> str:
    return str(settings.IDEMPOTENCY.get("DATABASE", "default"))


def effect(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    query, key = handler_sql(request.headers.get)
    with connections[_alias()].cursor() as cur:
        cur.execute("INSERT INTO effects (k) VALUES (%s) RETURNING id", [key or "none"])
        effect_id = cur.fetchone()[0]
        if query:
            cur.execute(query)
        if request.headers.get("X-Test-Fail-First"):
            with contextlib.suppress(DataError):
                cur.execute("SELECT 1/0")
    if request.headers.get("X-Test-Abort"):
        raise Http404("no such thing")
    if request.headers.get("X-Test-Http-Error"):
        raise PermissionDenied("not yours")
    if request.headers.get("X-Test-Sleep"):
        time.sleep(float(request.headers["X-Test-Sleep"]))
    status, headers, body = handler_answer(request.headers.get, effect_id)
    response = HttpResponse(body, status=status)
    for name, value in headers:
        response[name] = value
    return response


@idempotent(operation="stream")
def stream(request: HttpRequest) -> StreamingHttpResponse:
    with connections[_alias()].cursor() as cur:
        cur.execute("INSERT INTO effects (k) VALUES ('s')")
    return StreamingHttpResponse(iter([b'{"parts": ', b"[1, 2]}"]), status=201, content_type="application/json")


@idempotency_exempt
def exempt(request: HttpRequest) -> HttpResponse:
    return effect(request)


urlpatterns = [
    path("effects", idempotent(operation="create-effect")(effect)),
    path("subset", idempotent(operation="subset", fingerprint=["/order_id", "/amount"])(effect)),
    path("optional", idempotent(operation="optional", key_required=False)(effect)),
    path("headers", idempotent(operation="headers", replay_headers=["content-type", "location", "x-custom"])(effect)),
    path("items/<int:id>", effect),  # made idempotent by the middleware alone
    path("stream", stream),
    path("exempt", exempt),
]


def adapt(client: Client) -> Post:
    def post(p: str, body: bytes, headers: Sequence[tuple[str, str]]) -> Answer:
        joined: dict[str, str] = {}
        content_type = "application/octet-stream"
        for name, value in headers:
            if name.lower() == "content-type":
                content_type = value
            else:  # a WSGI server joins repeated fields with ", "
                joined[name] = joined[name] + ", " + value if name in joined else value
        r = client.generic("POST", "/" + p.lstrip("/"), body, content_type=content_type, headers=joined)
        return Answer(r.status_code, {k.lower(): v for k, v in r.items()}, r.content)

    return post


class TestDjango(Behaviour):
    # Django has no exception of its own that answers 402, nor handlers of an
    # application's exceptions (its middleware's process_exception does not
    # see an exception of a view the idempotency middleware runs)
    http_error_status = 403
    resolves_declined = False
    # HttpResponse MIME-encodes a header value that Latin-1 cannot hold (RFC 2047: "=?utf-8?b?...?=")
    rewritten_headers = frozenset({"euro"})

    def final_http_errors(self) -> Any:
        return PermissionDenied

    @pytest.fixture
    def make_client(self) -> Iterator[Callable[..., Post]]:
        with contextlib.ExitStack() as stack:

            def make(dbname: str = DB, server_options: str | None = None, **options: Any) -> Post:
                alias = {DB: "default", DB_NOEXT: "noext", DB_OLD: "old"}[dbname]
                if server_options:
                    alias = {READ_ONLY: "readonly", SHALLOW_STACK: "shallow"}[server_options]
                conf = {"SCOPE": __name__ + ".scope", "DATABASE": alias, **{k.upper(): v for k, v in options.items()}}
                stack.enter_context(override_settings(IDEMPOTENCY=conf))
                client = Client(raise_request_exception=True)
                client.get("/none")  # loads the middleware, which checks the version
                return adapt(client)

            yield make

    @pytest.fixture
    def client(self, make_client: Callable[..., Post]) -> Post:
        return make_client()

    def test_http404_rolls_back_and_reaches_django(self, client: Post, db: Db) -> None:
        assert self.post(client, headers=[("X-Test-Abort", "1")]).status == 404
        assert db.effects() == 0
        assert db.records() == 0

    def test_streaming_response_is_stored_whole(self, client: Post, db: Db) -> None:
        first = self.post(client, "/stream")
        again = self.post(client, "/stream")
        assert first.status == again.status == 201
        assert again.headers["idempotent-replayed"] == "true"
        assert again.body == b'{"parts": [1, 2]}' and first.body == again.body
        assert db.effects() == 1

    def test_exempt_view(self, client: Post, db: Db) -> None:
        assert self.post(client, "/exempt", key=None).status == 201
        assert db.records() == 0 and db.effects() == 1

    def test_middleware_needs_a_scope(self) -> None:
        from django.core.exceptions import ImproperlyConfigured

        with override_settings(IDEMPOTENCY={}):
            with pytest.raises(ImproperlyConfigured, match="scope"):
                Client().get("/none")
        with override_settings(IDEMPOTENCY={"SCOPE": scope, "TTLX": 1}):
            with pytest.raises(ImproperlyConfigured, match="TTLX"):
                Client().get("/none")

    def test_ttl_setting(self, make_client: Callable[..., Post], db: Db) -> None:
        client = make_client(ttl=3600)
        self.post(client)
        assert db.value("SELECT ttl = interval '1 hour' FROM idem_keys") is True

    def test_async_view_is_refused(self) -> None:
        async def view(request: HttpRequest) -> HttpResponse:
            return HttpResponse()

        with pytest.raises(TypeError, match="sync views"):
            idempotent(operation="x")(view)
