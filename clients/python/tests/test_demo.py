"""The demo app (demo/app.py) through Starlette's TestClient, as its users see it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from psycopg_pool import AsyncConnectionPool

from conftest import DB, Db, conninfo

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "demo"))
import app as demo  # noqa: E402

A = {"Authorization": "Bearer token-a", "Content-Type": "application/json"}
B = {"Authorization": "Bearer token-b", "Content-Type": "application/json"}
PAY = b'{"order_id": "o-1", "amount": 100, "currency": "BRL"}'


@pytest.fixture
def client() -> Iterator[TestClient]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(conninfo(DB), kwargs={"autocommit": True}, open=False)
    with TestClient(demo.build_app(pool, bench=True)) as c:
        yield c


def test_payment_and_replay(client: TestClient, db: Db) -> None:
    r = client.post("/payments", content=PAY, headers={**A, "Idempotency-Key": '"p1"'})
    assert r.status_code == 201
    assert r.json()["status"] == "paid" and r.headers["location"] == f"/payments/{r.json()['id']}"
    again = client.post("/payments", content=PAY, headers={**A, "Idempotency-Key": "p1"})
    assert again.headers["idempotent-replayed"] == "true" and again.headers["location"] == r.headers["location"]
    assert db.value("SELECT count(*) FROM payments") == 1
    assert db.value("SELECT operation FROM idem_keys") == "create-payment"
    assert client.get(r.headers["location"], headers=A).json() == r.json()
    assert client.get(r.headers["location"], headers=B).status_code == 404
    assert client.get(r.headers["location"]).status_code == 401


def test_declined_and_bad_request_are_completed(client: TestClient, db: Db) -> None:
    big = b'{"order_id": "o-2", "amount": 1000001, "currency": "BRL"}'
    r = client.post("/payments", content=big, headers={**A, "Idempotency-Key": "d"})
    assert r.status_code == 402 and r.json()["code"] == "card-declined"
    assert client.post("/payments", content=big, headers={**A, "Idempotency-Key": "d"}).headers["idempotent-replayed"]
    assert db.value("SELECT status FROM payments") == "declined"
    bad = client.post("/payments", content=b'{"amount": -1}', headers={**A, "Idempotency-Key": "b"})
    assert bad.status_code == 400 and bad.json()["code"] == "bad-request"
    assert db.value("SELECT response_status FROM idem_keys WHERE key = 'b'") == 400
    assert db.value("SELECT count(*) FROM payments") == 1


def test_scope_and_auth(client: TestClient, db: Db) -> None:
    client.post("/payments", content=PAY, headers={**A, "Idempotency-Key": "s"})
    r = client.post("/payments", content=PAY, headers={**B, "Idempotency-Key": "s"})
    assert r.status_code == 201 and "idempotent-replayed" not in r.headers
    r = client.post("/payments", content=PAY, headers={"Idempotency-Key": "s", "Authorization": "Bearer x"})
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    assert db.value("SELECT count(*) FROM payments") == 2


def test_bench_routes(client: TestClient, db: Db) -> None:
    for route in ("/bench/middleware", "/bench/by-hand"):
        for _ in range(2):
            r = client.post(route, content=b'{"n": 1}', headers={**A, "Idempotency-Key": "b"})
            assert r.status_code == 201
        assert r.headers["idempotent-replayed"] == "true"
    assert db.value("SELECT count(*) FROM bench_effects") == 2
    assert db.records("completed") == 2
