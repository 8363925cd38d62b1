"""``idempotent_function``: any function under a key, sync and async, against the real extension.

New then replay (the first value returned, the function not called again),
a raise rolls back, two concurrent calls (one runs, the other is
``in_progress``), mismatch, a record written by ``idem_call`` replays
through the decorator, and the key and scope from a JSON Pointer or a
function. Effects are counted in the database.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pg_idempotency import (
    AsyncIdempotency,
    Idempotency,
    IdempotencySettings,
    InProgressError,
    MismatchError,
    idempotent_function,
)

from conftest import DB, Db, conninfo

SETTINGS = IdempotencySettings(scope=lambda request: "unused")


class Declined(Exception):
    pass


@pytest.fixture
def idem() -> Iterator[Idempotency]:
    with ConnectionPool(conninfo(DB), min_size=2, max_size=4, kwargs={"autocommit": True}) as pool:
        yield Idempotency(pool, SETTINGS)


def effect(conn: psycopg.Connection[Any], k: str) -> int:
    row = conn.execute("INSERT INTO effects (k) VALUES (%s) RETURNING id", (k,)).fetchone()
    assert row is not None
    return int(row[0])


def test_new_then_replay_returns_the_first_value(idem: Idempotency, db: Db) -> None:
    calls: list[dict[str, Any]] = []

    @idempotent_function(idem, key="/order_id", scope="shop", operation="charge")
    def charge(conn: psycopg.Connection[Any], order: dict[str, Any]) -> dict[str, Any]:
        calls.append(order)
        return {"id": effect(conn, order["order_id"]), "amount": Decimal("12.50")}

    first = charge({"order_id": "o-1", "amount": 5})
    again = charge({"amount": 5, "order_id": "o-1"})
    assert first == again == {"id": first["id"], "amount": Decimal("12.50")}
    assert len(calls) == 1
    assert db.effects() == 1
    assert db.value(
        "SELECT (operation, key, scope, status, response_status, response) = "
        "(%s, 'o-1', 'shop', 'completed', 200, %s::jsonb) FROM idem_keys",
        "charge",
        '{"id": %d, "amount": 12.50}' % first["id"],
    )
    assert db.value("SELECT request_hash = idem_hash('{\"order_id\": \"o-1\", \"amount\": 5}') FROM idem_keys")


def test_an_error_rolls_back_and_the_retry_runs(idem: Idempotency, db: Db) -> None:
    fail = [True]

    @idempotent_function(idem, key="/id", scope="shop", operation="pay")
    def pay(conn: psycopg.Connection[Any], message: dict[str, Any]) -> int:
        n = effect(conn, message["id"])
        if fail[0]:
            raise Declined("the card was declined")
        return n

    with pytest.raises(Declined):
        pay({"id": 7})
    assert (db.effects(), db.records()) == (0, 0)
    fail[0] = False
    n = pay({"id": 7})
    assert pay({"id": 7}) == n
    assert (db.effects(), db.records("completed")) == (1, 1)
    assert db.value("SELECT key FROM idem_keys") == "7"


def test_mismatch_and_key_and_scope_from_functions(idem: Idempotency, db: Db) -> None:
    @idempotent_function(
        idem,
        key=lambda user, order: order["ref"],
        scope=lambda user, order: user,
        payload="order",
        operation="order",
    )
    def place(conn: psycopg.Connection[Any], user: str, order: dict[str, Any]) -> None:
        effect(conn, order["ref"])

    assert place("alice", {"ref": "r1", "qty": 1}) is None
    assert place("bob", {"ref": "r1", "qty": 2}) is None  # another scope: another record
    with pytest.raises(MismatchError):
        place("alice", {"ref": "r1", "qty": 3})
    assert place("alice", order={"ref": "r1", "qty": 1}) is None
    assert (db.effects(), db.records()) == (2, 2)
    assert db.value("SELECT string_agg(scope, ',' ORDER BY scope) FROM idem_keys") == "alice,bob"


def test_two_concurrent_calls_one_runs_the_other_is_in_progress(idem: Idempotency, db: Db) -> None:
    inside, release = threading.Event(), threading.Event()

    @idempotent_function(idem, key="/id", scope="shop", operation="slow")
    def slow(conn: psycopg.Connection[Any], message: dict[str, Any]) -> str:
        effect(conn, "slow")
        inside.set()
        assert release.wait(10)
        return "done"

    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(slow({"id": "k"})))
    first.start()
    assert inside.wait(10)
    with pytest.raises(InProgressError):
        slow({"id": "k"})
    release.set()
    first.join(10)
    assert results == ["done"]
    assert slow({"id": "k"}) == "done"
    assert (db.effects(), db.records("completed")) == (1, 1)


def test_an_idem_call_record_replays_through_the_decorator(idem: Idempotency, db: Db) -> None:
    db.execute(
        "CREATE OR REPLACE FUNCTION pg_temp.handler(request jsonb) RETURNS jsonb LANGUAGE sql"
        " AS $$ INSERT INTO effects (k) VALUES (request->>'id') RETURNING jsonb_build_object('effect', id) $$"
    )
    stored = db.value(
        "SELECT idem_call('refund', 'r-9', '{\"id\": \"r-9\", \"cents\": 100}', 'pg_temp.handler(jsonb)'::regprocedure,"
        " scope => 'shop')"
    )
    calls: list[int] = []

    @idempotent_function(idem, key="/id", scope="shop", operation="refund")
    def refund(conn: psycopg.Connection[Any], message: dict[str, Any]) -> Any:
        calls.append(1)
        return {"effect": effect(conn, message["id"])}

    assert refund({"id": "r-9", "cents": 100}) == stored
    assert calls == []
    assert db.effects() == 1
    # and the other way: the decorator's record is a replay to idem_call
    first = refund({"id": "r-10", "cents": 5})
    again = db.value(
        "SELECT idem_call('refund', 'r-10', '{\"id\": \"r-10\", \"cents\": 5}', 'pg_temp.handler(jsonb)'::regprocedure,"
        " scope => 'shop')"
    )
    assert again == first
    assert db.effects() == 2


def test_async_function(db: Db) -> None:
    async def scenario() -> None:
        async with AsyncConnectionPool(conninfo(DB), min_size=2, max_size=4, kwargs={"autocommit": True}) as pool:
            idem = AsyncIdempotency(pool, SETTINGS)
            inside, release = asyncio.Event(), asyncio.Event()
            fail = [True]

            @idempotent_function(idem, key="/id", scope="shop", operation="async-pay")
            async def pay(conn: psycopg.AsyncConnection[Any], message: dict[str, Any]) -> dict[str, Any]:
                cur = await conn.execute("INSERT INTO effects (k) VALUES (%s) RETURNING id", (message["id"],))
                row = await cur.fetchone()
                assert row is not None
                if message.get("wait"):
                    inside.set()
                    await release.wait()
                if fail[0]:
                    raise Declined("declined")
                return {"id": row[0]}

            with pytest.raises(Declined):
                await pay({"id": "a"})
            assert db.effects() == 0
            fail[0] = False
            first = await pay({"id": "a"})
            assert await pay({"id": "a"}) == first
            with pytest.raises(MismatchError):
                await pay({"id": "a", "other": 1})
            running = asyncio.ensure_future(pay({"id": "b", "wait": True}))
            await inside.wait()
            with pytest.raises(InProgressError):
                await pay({"id": "b", "wait": True})
            release.set()
            second = await running
            assert await pay({"id": "b", "wait": True}) == second
            assert (db.effects(), db.records("completed")) == (2, 2)

    asyncio.run(scenario())


def test_misuse_is_refused_at_decoration(idem: Idempotency) -> None:
    async def coroutine(conn: Any, message: Any) -> None:
        pass

    with pytest.raises(TypeError, match="AsyncIdempotency"):
        idempotent_function(idem, key="/id", scope="s", operation="x")(coroutine)
    with pytest.raises(ValueError, match="JSON Pointer"):
        idempotent_function(idem, key="id", scope="s")
    with pytest.raises(ValueError, match="name it with operation="):
        idempotent_function(idem, key="/id", scope="s")(coroutine)
    with pytest.raises(ValueError, match="operation"):
        idempotent_function(idem, key="/id", scope="s", operation="x" * 64)(lambda conn, m: None)

    @idempotent_function(idem, key="/id", scope="s", operation="nokey")
    def nokey(conn: Any, message: Any) -> None:
        pass

    with pytest.raises(ValueError, match="finds nothing"):
        nokey({"other": 1})
    with pytest.raises(ValueError, match="string or an integer"):
        nokey({"id": {"nested": 1}})
