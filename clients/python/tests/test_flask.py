"""Flask: the decorator of FlaskIdempotency, through Flask's test client."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from flask import Flask, Response, abort, request
from psycopg_pool import ConnectionPool
from werkzeug.exceptions import HTTPException

from pg_idempotency import IdempotencySettings
from pg_idempotency.flask import FlaskIdempotency, connection

from behaviour import DECLINED_BODY, Answer, Behaviour, Declined, Post, handler_answer, handler_sql, principal
from conftest import DB, Db, conninfo


class PaymentRequired(HTTPException):
    """Werkzeug has no exception of its own for 402."""

    code = 402
    description = "Payment required."


def scope(req: Any) -> str | None:
    return principal(req.headers.get("Authorization"))


def effect() -> Response:
    query, key = handler_sql(request.headers.get)
    conn = connection()
    row = conn.execute("INSERT INTO effects (k) VALUES (%s) RETURNING id", (key or "none",)).fetchone()
    assert row is not None
    if query:
        conn.execute(query)
    if request.headers.get("X-Test-Fail-First"):
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1/0")
    if request.headers.get("X-Test-Abort"):
        abort(404)
    if request.headers.get("X-Test-Http-Error"):
        raise PaymentRequired()
    if request.headers.get("X-Test-Sleep"):
        time.sleep(float(request.headers["X-Test-Sleep"]))
    status, headers, body = handler_answer(request.headers.get, row[0])
    return Response(body, status=status, headers=headers)


def build(stack: contextlib.ExitStack, dbname: str = DB, server_options: str | None = None, **settings: Any) -> Flask:
    kwargs: dict[str, Any] = {"autocommit": True}
    if server_options:
        kwargs["options"] = server_options
    pool: ConnectionPool[Any] = ConnectionPool(conninfo(dbname), min_size=1, max_size=4, kwargs=kwargs, open=True)
    stack.callback(pool.close)
    app = Flask(__name__)
    idem = FlaskIdempotency(pool, IdempotencySettings(scope=scope, **settings), app)

    @app.errorhandler(Declined)
    def declined(exc: Declined) -> Response:
        return Response(DECLINED_BODY, status=402, content_type="application/json")

    @app.post("/effects")
    @idem.idempotent(operation="create-effect")
    def effects() -> Response:
        return effect()

    @app.post("/subset")
    @idem.idempotent(operation="subset", fingerprint=["/order_id", "/amount"])
    def subset() -> Response:
        return effect()

    @app.post("/optional")
    @idem.idempotent(operation="optional", key_required=False)
    def optional() -> Response:
        return effect()

    @app.post("/headers")
    @idem.idempotent(operation="headers", replay_headers=["content-type", "location", "x-custom"])
    def headers() -> Response:
        return effect()

    @app.post("/items/<int:id>")
    @idem.idempotent()
    def items(id: int) -> Response:
        return effect()

    @app.route("/tuple", methods=["GET", "POST"])
    @idem.idempotent(operation="tuple")
    def as_tuple() -> Any:
        row = connection().execute("INSERT INTO effects (k) VALUES ('t') RETURNING id").fetchone()
        assert row is not None
        return {"id": row[0]}, 201, {"Location": f"/tuple/{row[0]}"}

    return app


class TestFlask(Behaviour):
    def final_http_errors(self) -> Any:
        return HTTPException

    @pytest.fixture
    def make_client(self) -> Iterator[Callable[..., Post]]:
        with contextlib.ExitStack() as stack:

            def make(**options: Any) -> Post:
                client = build(stack, **options).test_client()

                def post(path: str, body: bytes, headers: Sequence[tuple[str, str]]) -> Answer:
                    r = client.post(path, data=body, headers=list(headers))
                    return Answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.get_data())

                return post

            yield make

    @pytest.fixture
    def client(self, make_client: Callable[..., Post]) -> Post:
        return make_client()

    def test_abort_rolls_back_and_reaches_flask(self, client: Post, db: Db) -> None:
        assert self.post(client, headers=[("X-Test-Abort", "1")]).status == 404
        assert db.effects() == 0
        assert db.records() == 0

    def test_view_returning_a_tuple(self, db: Db) -> None:
        with contextlib.ExitStack() as stack:
            client = build(stack).test_client()
            h = {"Idempotency-Key": "t", "Authorization": "Bearer user-a"}
            first = client.post("/tuple", headers=h)
            again = client.post("/tuple", headers=h)
            assert first.status_code == again.status_code == 201
            assert again.headers["Location"] == first.headers["Location"]
            assert again.get_json() == first.get_json()
            # a GET is not idempotent: it runs in a plain transaction
            assert client.get("/tuple").status_code == 201
        assert db.effects() == 2
        assert db.records() == 1

    def test_no_scope_function_is_an_error_at_start_up(self) -> None:
        pool: ConnectionPool[Any] = ConnectionPool(conninfo(DB), open=False)
        with pytest.raises(ValueError, match="scope"):
            FlaskIdempotency(pool, IdempotencySettings())


def test_no_connection_in_time_is_503_unavailable(db: Db) -> None:
    # every pooled connection is held: the request waits for the pool's timeout, then 503
    with ConnectionPool(conninfo(DB), min_size=1, max_size=1, timeout=0.5, kwargs={"autocommit": True}) as pool:
        app = Flask(__name__)
        idem = FlaskIdempotency(pool, IdempotencySettings(scope=scope), app)

        @app.post("/effects")
        @idem.idempotent(operation="create-effect")
        def effects() -> Response:
            return effect()

        h = {"Idempotency-Key": "k1", "Authorization": "Bearer user-a"}
        with pool.connection():
            r = app.test_client().post("/effects", json={}, headers=h)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert r.get_json()["code"] == "unavailable"
        assert app.test_client().post("/effects", json={}, headers=h).status_code == 201
    assert db.effects() == 1


def test_database_unreachable_is_503_unavailable() -> None:
    # nothing listens: the version check of the first request cannot connect either
    dead = conninfo(DB) + " host=127.0.0.1 port=1 connect_timeout=1"
    with ConnectionPool(dead, min_size=0, max_size=1, timeout=0.5, open=True) as pool:
        app = Flask(__name__)
        idem = FlaskIdempotency(pool, IdempotencySettings(scope=scope))
        app.add_url_rule("/effects", view_func=idem.idempotent(operation="x")(effect), methods=["POST"])
        r = app.test_client().post("/effects", json={}, headers={"Idempotency-Key": "k", "Authorization": "Bearer user-a"})
        assert r.status_code == 503 and r.get_json()["code"] == "unavailable"
