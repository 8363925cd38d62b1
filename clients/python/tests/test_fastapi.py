"""FastAPI/Starlette: the route class and dependency, through Starlette's TestClient."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import Response
from fastapi.testclient import TestClient
from pydantic import BaseModel
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from pg_idempotency import IdempotencySettings
from pg_idempotency.fastapi import FastAPIIdempotency, IdempotencyConnection, idempotency_exempt, idempotent
from pg_idempotency.starlette import StarletteIdempotency

from behaviour import DECLINED_BODY, Answer, Behaviour, Declined, Post, handler_answer, handler_sql, principal
from conftest import DB, Db, conninfo


class Item(BaseModel):
    order_id: str
    amount: int


def scope(request: Request) -> str | None:
    return principal(request.headers.get("authorization"))


async def effect(request: Request, conn: psycopg.AsyncConnection[Any]) -> Response:
    query, key = handler_sql(request.headers.get)
    cur = await conn.execute("INSERT INTO effects (k) VALUES (%s) RETURNING id", (key or "none",))
    row = await cur.fetchone()
    assert row is not None
    if query:
        await conn.execute(query)
    if request.headers.get("x-test-fail-first"):
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            await conn.execute("SELECT 1/0")
    if request.headers.get("x-test-http-error"):
        raise HTTPException(402, detail="payment required")
    if request.headers.get("x-test-sleep"):
        await asyncio.sleep(float(request.headers["x-test-sleep"]))
    status, headers, body = handler_answer(request.headers.get, row[0])
    response = Response(body, status_code=status)
    for name, value in headers:
        response.headers[name] = value
    return response


def build(dbname: str = DB, server_options: str | None = None, **settings: Any) -> tuple[FastAPI, FastAPIIdempotency]:
    kwargs: dict[str, Any] = {"autocommit": True}
    if server_options:
        kwargs["options"] = server_options
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(conninfo(dbname), min_size=1, max_size=4, kwargs=kwargs, open=False)
    idem = FastAPIIdempotency(pool, IdempotencySettings(scope=scope, **settings))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.open()
        try:
            await idem.check_version()
            yield
        finally:
            await pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.exception_handler(Declined)
    async def declined(request: Request, exc: Declined) -> Response:
        return Response(DECLINED_BODY, status_code=402, media_type="application/json")

    router = APIRouter(route_class=idem.route_class)

    @router.post("/effects")
    @idempotent(operation="create-effect")
    async def effects(request: Request, conn: IdempotencyConnection) -> Response:
        return await effect(request, conn)

    @router.post("/subset")
    @idempotent(operation="subset", fingerprint=["/order_id", "/amount"])
    async def subset(request: Request, conn: IdempotencyConnection) -> Response:
        return await effect(request, conn)

    @router.post("/optional")
    @idempotent(operation="optional", key_required=False)
    async def optional(request: Request, conn: IdempotencyConnection) -> Response:
        return await effect(request, conn)

    @router.post("/headers")
    @idempotent(operation="headers", replay_headers=["content-type", "location", "x-custom"])
    async def headers(request: Request, conn: IdempotencyConnection) -> Response:
        return await effect(request, conn)

    @router.post("/items/{id}")
    async def items(id: int, request: Request, conn: IdempotencyConnection) -> Response:
        return await effect(request, conn)

    @router.post("/exempt")
    @idempotency_exempt
    async def exempt(request: Request, conn: IdempotencyConnection) -> Response:
        return await effect(request, conn)

    @router.post("/model")
    @idempotent(operation="model")
    async def model(item: Item, request: Request, conn: IdempotencyConnection) -> Response:
        return await effect(request, conn)

    @router.get("/count")
    async def count(conn: IdempotencyConnection) -> dict[str, int]:
        cur = await conn.execute("SELECT count(*) FROM effects")
        row = await cur.fetchone()
        return {"count": row[0] if row else -1}

    app.include_router(router)
    return app, idem


def adapt(client: TestClient) -> Post:
    def post(path: str, body: bytes, headers: Sequence[tuple[str, str]]) -> Answer:
        r = client.post(path, content=body, headers=list(headers))
        return Answer(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content)

    return post


class TestFastAPI(Behaviour):
    def final_http_errors(self) -> Any:
        return StarletteHTTPException

    @pytest.fixture
    def make_client(self) -> Iterator[Callable[..., Post]]:
        with contextlib.ExitStack() as stack:

            def make(**options: Any) -> Post:
                app, _ = build(**options)
                client = stack.enter_context(TestClient(app))
                return adapt(client)

            yield make

    @pytest.fixture
    def client(self, make_client: Callable[..., Post]) -> Post:
        return make_client()

    def test_dependency_on_other_routes(self, db: Db) -> None:
        app, _ = build()
        with TestClient(app) as client:
            assert client.post("/exempt", headers={"Authorization": "Bearer user-a"}).status_code == 201
            assert client.get("/count").json() == {"count": 1}
        assert db.records() == 0

    def test_validation_error_rolls_back_and_reaches_fastapi(self, db: Db) -> None:
        app, _ = build()
        with TestClient(app) as client:
            h = {"Authorization": "Bearer user-a", "Idempotency-Key": "m"}
            assert client.post("/model", json={"order_id": "o"}, headers=h).status_code == 422
            assert db.records() == 0
            assert client.post("/model", json={"order_id": "o", "amount": 1}, headers=h).status_code == 201
            again = client.post("/model", json={"order_id": "o", "amount": 1}, headers=h)
            assert again.headers["idempotent-replayed"] == "true"
        assert db.effects() == 1

    def test_no_scope_function_is_an_error_at_start_up(self) -> None:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(conninfo(DB), open=False)
        with pytest.raises(ValueError, match="scope"):
            FastAPIIdempotency(pool, IdempotencySettings())

    def test_starlette_endpoint(self, db: Db) -> None:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(conninfo(DB), kwargs={"autocommit": True}, open=False)
        idem = StarletteIdempotency(pool, IdempotencySettings(scope=scope, operation="create-effect"))

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            await pool.open()
            yield
            await pool.close()

        app = Starlette(routes=[Route("/effects", idem.endpoint(effect), methods=["POST"])], lifespan=lifespan)
        with TestClient(app) as client:
            post = adapt(client)
            Behaviour().post(post)
            again = Behaviour().post(post)
        assert again.headers["idempotent-replayed"] == "true"
        assert db.effects() == 1


def test_commit_survives_the_client_going_away(db: Db) -> None:
    """The ASGI call is cancelled (the client went away) during the handler: the transaction still commits."""
    app, idem = build()

    async def scenario() -> None:
        await idem.pool.open()
        try:
            started = asyncio.Event()

            async def receive() -> dict[str, Any]:
                if not started.is_set():
                    started.set()
                    return {"type": "http.request", "body": b'{"order_id": "o-1", "amount": 100}', "more_body": False}
                await asyncio.sleep(3600)
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                pass

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": "/effects",
                "raw_path": b"/effects",
                "root_path": "",
                "query_string": b"",
                "headers": [
                    (b"idempotency-key", b"gone"),
                    (b"authorization", b"Bearer user-a"),
                    (b"content-type", b"application/json"),
                    (b"x-test-sql-error", b"00000"),
                ],
                "client": ("127.0.0.1", 1),
                "server": ("127.0.0.1", 80),
                "app": app,
            }
            # the handler's extra SQL (SQLSTATE 00000 raises nothing) is replaced by a slow one
            task = asyncio.ensure_future(app(scope, receive, send))
            for _ in range(1000):
                if db.value("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%%'"):
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the handler's SQL never ran")
            assert not task.done()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for _ in range(200):
                if db.records("completed"):
                    break
                await asyncio.sleep(0.05)
        finally:
            await idem.pool.close()

    import behaviour

    original = behaviour.handler_sql

    def slow(headers: Callable[[str], str | None]) -> tuple[str | None, str | None]:
        return "SELECT pg_sleep(1)", headers("idempotency-key")

    globals()["handler_sql"] = slow
    try:
        asyncio.run(scenario())
    finally:
        globals()["handler_sql"] = original
    assert db.effects() == 1
    assert db.records("completed") == 1


def test_chunked_body_over_the_limit(db: Db) -> None:
    """A body without Content-Length (chunked) over the limit is 413 too."""
    app, _ = build(max_body_bytes=64)

    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b"x" * 50

    with TestClient(app) as client:
        h = {"Idempotency-Key": "c", "Authorization": "Bearer user-a", "Content-Type": "text/plain"}
        r = client.post("/effects", content=chunks(), headers=h)
        assert r.status_code == 413 and r.json()["code"] == "payload-too-large"
    assert db.records() == 0 and db.effects() == 0
