"""Fixtures: test databases on the server of libpq's environment (a superuser), with the extension.

The session creates three databases: one with the extension (the tests'),
one without it and one with the extension at 0.1.0 (for the version
check). Each test starts with empty tables; effects are counted in the
database, never taken from the responses.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

PREFIX = os.environ.get("PG_IDEMPOTENCY_TEST_DB", "pg_idempotency_test")
DB = PREFIX
DB_NOEXT = PREFIX + "_noext"
DB_OLD = PREFIX + "_old"

#: libpq ``options`` of the tests' other connections: read-only (as on a
#: standby), and a stack of the server's smallest ``max_stack_depth`` (about
#: 600 levels of JSON nesting, fewer than Python's parser takes)
READ_ONLY = "-c default_transaction_read_only=on"
SHALLOW_STACK = "-c max_stack_depth=100kB"

SCHEMA = """
CREATE EXTENSION idempotency;
CREATE TABLE effects (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, k text NOT NULL);
"""


def conninfo(dbname: str) -> str:
    """A libpq connection string for ``dbname`` (the rest from the environment)."""
    return psycopg.conninfo.make_conninfo(dbname=dbname)


def _recreate(admin: psycopg.Connection[Any], name: str) -> None:
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@pytest.fixture(scope="session", autouse=True)
def databases() -> Iterator[None]:
    with psycopg.connect(conninfo(os.environ.get("PGDATABASE", "postgres")), autocommit=True) as admin:
        for name in (DB, DB_NOEXT, DB_OLD):
            _recreate(admin, name)
    with psycopg.connect(conninfo(DB), autocommit=True) as conn:
        conn.execute(SCHEMA)
        demo_schema = os.path.join(os.path.dirname(__file__), "..", "..", "demo", "schema.sql")
        with open(demo_schema) as f:
            conn.execute(f.read())
        conn.execute("CREATE TABLE bench_effects (id bigserial PRIMARY KEY, k text)")
    with psycopg.connect(conninfo(DB_OLD), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION idempotency VERSION '0.1.0'")
    yield
    with psycopg.connect(conninfo(os.environ.get("PGDATABASE", "postgres")), autocommit=True) as admin:
        for name in (DB, DB_NOEXT, DB_OLD):
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(autouse=True)
def clean(databases: None) -> None:
    with psycopg.connect(conninfo(DB), autocommit=True) as conn:
        conn.execute("TRUNCATE idem_keys, effects, payments, bench_effects")


class Db:
    """Reads the test database's state on a connection of its own."""

    def __init__(self) -> None:
        self.conn = psycopg.connect(conninfo(DB), autocommit=True)

    def value(self, query: str, *params: Any) -> Any:
        row = self.conn.execute(query, params).fetchone()
        return row[0] if row else None

    def effects(self) -> int:
        return int(self.value("SELECT count(*) FROM effects"))

    def records(self, status: str | None = None) -> int:
        if status is None:
            return int(self.value("SELECT count(*) FROM idem_keys"))
        return int(self.value("SELECT count(*) FROM idem_keys WHERE status = %s", status))

    def execute(self, query: str, *params: Any) -> None:
        self.conn.execute(query, params)


@pytest.fixture
def db() -> Iterator[Db]:
    d = Db()
    yield d
    d.conn.close()
