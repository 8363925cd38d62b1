"""The core runner by itself: a plain function under a key, no web framework.

``run_under_key`` of both psycopg runners: new, replay, mismatch, in_progress
with two concurrent calls, a raise rolls back, a final error is completed,
a retryable status is rolled back, a completion PostgreSQL cannot store is
rolled back; and the sync and async shells are the same statements.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pg_idempotency import (
    AsyncIdempotency,
    Completion,
    Idempotency,
    IdempotencySettings,
    InProgressError,
    MismatchError,
    Policy,
    StuckError,
    UnsendableResponse,
)
from pg_idempotency import _core_runner

from conftest import DB, Db, conninfo

SETTINGS = IdempotencySettings(scope=lambda request: "unused")
DOC = {"charge": "c-1", "amount": 5}


class Declined(Exception):
    pass


@pytest.fixture
def idem() -> Iterator[Idempotency]:
    with ConnectionPool(conninfo(DB), min_size=2, max_size=4, kwargs={"autocommit": True}) as pool:
        yield Idempotency(pool, SETTINGS)


def insert(conn: psycopg.Connection[Any], status: int = 201) -> Completion[int]:
    row = conn.execute("INSERT INTO effects (k) VALUES ('runner') RETURNING id").fetchone()
    assert row is not None
    return Completion(status, '{"id": %d}' % row[0], row[0])


def test_new_then_replay(idem: Idempotency, db: Db) -> None:
    first = idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=insert)
    assert (first.outcome, first.status, first.value) == ("new", 201, first.value)
    assert first.response == '{"id": %d}' % first.value
    calls: list[int] = []

    def again_fn(conn: psycopg.Connection[Any]) -> Completion[int]:
        calls.append(1)
        return insert(conn)

    again = idem.run_under_key(operation="charge", key="k1", scope="s", request={"amount": 5, "charge": "c-1"}, fn=again_fn)
    assert (again.outcome, again.status, again.value) == ("replay", 201, None)
    assert again.response == first.response
    assert calls == []
    assert db.effects() == 1
    assert db.value("SELECT request_hash = idem_hash(%s::jsonb) FROM idem_keys", '{"charge": "c-1", "amount": 5}')


def test_mismatch(idem: Idempotency, db: Db) -> None:
    idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=insert)
    with pytest.raises(MismatchError):
        idem.run_under_key(operation="charge", key="k1", scope="s", request={"charge": "c-2"}, fn=insert)
    assert db.effects() == 1


def test_stuck(idem: Idempotency, db: Db) -> None:
    db.execute("SELECT idem_reserve('charge', 'k1', %s::jsonb, scope => 's')", '{"charge": "c-1", "amount": 5}')
    db.execute("UPDATE idem_keys SET updated_at = '-infinity'")
    with pytest.raises(StuckError):
        idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=insert)
    assert db.effects() == 0


def test_in_progress_with_two_concurrent_calls(idem: Idempotency, db: Db) -> None:
    inside, release = threading.Event(), threading.Event()
    results: list[Any] = []

    def slow(conn: psycopg.Connection[Any]) -> Completion[int]:
        completion = insert(conn)
        inside.set()
        assert release.wait(10)
        return completion

    first = threading.Thread(
        target=lambda: results.append(idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=slow))
    )
    first.start()
    try:
        assert inside.wait(10)
        with pytest.raises(InProgressError):
            idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=insert)
    finally:
        release.set()
        first.join(10)
    assert results[0].outcome == "new"
    assert db.effects() == 1
    assert db.records("completed") == 1


def test_a_raise_rolls_back(idem: Idempotency, db: Db) -> None:
    def fails(conn: psycopg.Connection[Any]) -> Completion[int]:
        insert(conn)
        raise Declined("no")

    with pytest.raises(Declined):
        idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=fails)
    assert db.effects() == 0
    assert db.records() == 0
    assert idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=insert).outcome == "new"


def test_a_final_error_is_completed(idem: Idempotency, db: Db) -> None:
    def fails(conn: psycopg.Connection[Any]) -> Completion[int]:
        insert(conn)
        raise Declined("no")

    policy = Policy(final=lambda e: isinstance(e, Declined))
    first = idem.run_under_key(
        operation="charge", key="k1", scope="s", request=DOC, fn=fails, policy=policy,
        resolve=lambda e: Completion(402, '{"declined": true}', -1),
    )
    assert (first.outcome, first.status, first.value) == ("new", 402, -1)
    again = idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=fails, policy=policy)
    assert (again.outcome, again.status, again.response) == ("replay", 402, '{"declined": true}')
    assert db.effects() == 1


def test_a_retryable_status_rolls_back(idem: Idempotency, db: Db) -> None:
    result = idem.run_under_key(
        operation="charge", key="k1", scope="s", request=DOC, fn=lambda conn: insert(conn, 503),
        policy=Policy(retryable={503}),
    )
    assert (result.outcome, result.status) == ("rolled_back", 503)
    assert db.effects() == 0
    assert db.records() == 0


@pytest.mark.parametrize("response", ['{"a": "\\u0000"}', '{"a": "\\ud800"}'])
def test_a_completion_postgresql_cannot_store_rolls_back(idem: Idempotency, db: Db, response: str) -> None:
    def unstorable(conn: psycopg.Connection[Any]) -> Completion[int]:
        insert(conn)
        return Completion(200, response, 0)

    with pytest.raises(UnsendableResponse):
        idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=unstorable)
    assert db.effects() == 0
    assert db.records() == 0


async def ainsert(conn: psycopg.AsyncConnection[Any]) -> Completion[int]:
    cur = await conn.execute("INSERT INTO effects (k) VALUES ('runner') RETURNING id")
    row = await cur.fetchone()
    assert row is not None
    return Completion(201, '{"id": %d}' % row[0], row[0])


def test_async_runner(db: Db) -> None:
    async def scenario() -> None:
        async with AsyncConnectionPool(conninfo(DB), min_size=2, max_size=4, kwargs={"autocommit": True}) as pool:
            idem = AsyncIdempotency(pool, SETTINGS)
            first = await idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=ainsert)
            assert first.outcome == "new"
            again = await idem.run_under_key(operation="charge", key="k1", scope="s", request=DOC, fn=ainsert)
            assert (again.outcome, again.response) == ("replay", first.response)
            with pytest.raises(MismatchError):
                await idem.run_under_key(operation="charge", key="k1", scope="s", request={}, fn=ainsert)

            inside, release = asyncio.Event(), asyncio.Event()

            async def slow(conn: psycopg.AsyncConnection[Any]) -> Completion[int]:
                completion = await ainsert(conn)
                inside.set()
                await release.wait()
                return completion

            held = asyncio.ensure_future(
                idem.run_under_key(operation="charge", key="k2", scope="s", request=DOC, fn=slow)
            )
            await asyncio.wait_for(inside.wait(), 10)
            with pytest.raises(InProgressError):
                await idem.run_under_key(operation="charge", key="k2", scope="s", request=DOC, fn=ainsert)
            release.set()
            assert (await held).outcome == "new"

            async def fails(conn: psycopg.AsyncConnection[Any]) -> Completion[int]:
                await ainsert(conn)
                raise Declined("no")

            with pytest.raises(Declined):
                await idem.run_under_key(operation="charge", key="k3", scope="s", request=DOC, fn=fails)

            async def declined(e: Exception) -> Completion[int] | None:
                return Completion(402, "null", -1)

            final = await idem.run_under_key(
                operation="charge", key="k4", scope="s", request=DOC, fn=fails,
                policy=Policy(final=lambda e: isinstance(e, Declined)), resolve=declined,
            )
            assert (final.outcome, final.status) == ("new", 402)

    asyncio.run(scenario())
    assert db.effects() == 3
    assert db.records("completed") == 3


def _statements(func: Any) -> str:
    """The body of a function without its docstring, with ``async`` and ``await`` taken away."""
    tree = ast.parse(inspect.getsource(func))
    definition = tree.body[0]
    assert isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef))
    body = definition.body[1:] if isinstance(definition.body[0], ast.Expr) else definition.body
    text = "\n".join(ast.unparse(statement) for statement in body)
    return text.replace("async with ", "with ").replace("await ", "")


def test_the_sync_and_async_shells_do_not_drift() -> None:
    """run_sync and run_async are one source: the same statements but for async and await."""
    sync, asynchronous = _statements(_core_runner.run_sync), _statements(_core_runner.run_async)
    assert "await " in ast.unparse(ast.parse(inspect.getsource(_core_runner.run_async)))
    assert sync == asynchronous


def test_no_connection_in_time_is_503_unavailable_async(db: Db) -> None:
    """The HTTP run on the async runner: the pool's only connection is held, so the request is 503."""
    from pg_idempotency import RequestData, ResponseData

    async def scenario() -> ResponseData:
        async with AsyncConnectionPool(conninfo(DB), min_size=1, max_size=1, timeout=0.5) as pool:
            idem = AsyncIdempotency(pool, SETTINGS, check=False)

            async def handler(conn: psycopg.AsyncConnection[Any]) -> ResponseData:
                return ResponseData(201)

            async with pool.connection():
                request = RequestData("POST", "/x", [("Idempotency-Key", "k")], b"")
                answer: ResponseData = await idem.run(request, handler)
                return answer

    answer = asyncio.run(scenario())
    assert answer.status == 503
    assert answer.header("retry-after") == "1"
    assert b'"unavailable"' in answer.body
    assert db.records() == 0
