"""The core: pure parts (key, fingerprint document, envelope, version) and the psycopg runners."""

from __future__ import annotations

import asyncio
import base64
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pg_idempotency import (
    AsyncIdempotency,
    ExtensionVersionError,
    Idempotency,
    IdempotencySettings,
    InvalidFingerprint,
    InvalidKey,
    RequestData,
    ResponseData,
    UnsupportedEnvelope,
    build_envelope,
    parse_key,
    read_envelope,
    request_document,
    require_version,
)

from conftest import DB, DB_NOEXT, DB_OLD, Db, conninfo


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        (['"abc"'], "abc"),
        (["abc"], "abc"),
        ([' \t"abc" \t'], "abc"),
        (["  abc "], "abc"),
        (['"a\\"b"'], 'a"b'),
        (['"a\\\\b"'], "a\\b"),
        (['"a b"'], "a b"),
        (["a;p=1"], "a;p=1"),
        ([], None),
    ],
)
def test_parse_key(fields: list[str], key: str | None) -> None:
    assert parse_key(fields) == key


@pytest.mark.parametrize(
    "fields",
    [['"abc'], ['"a\\n"'], ['"a";p=1'], ['"a" b'], ['"a", "b"'], ["a,b"], ['""'], [""], ["  "],
     ['"\x7f"'], ['"é"'], ['"a\\'], ["a", "b"]],
)
def test_parse_key_refuses(fields: list[str]) -> None:
    with pytest.raises(InvalidKey):
        parse_key(fields)


def test_request_document() -> None:
    assert request_document("post", "/p", "application/json; charset=utf-8", b'{"a": 1.50}') == (
        '{"method": "POST", "path": "/p", "body": {"a": 1.50}}'
    )
    assert request_document("POST", "/p", "application/problem+json", b"[1]").endswith('"body": [1]}')
    assert request_document("POST", "/p", "application/json", b"NaN").endswith('"body_base64": "TmFO"}')
    assert request_document("POST", "/p", "text/plain", b"ab").endswith('"body_base64": "YWI="}')
    assert request_document("POST", "/p", None, b"") == '{"method": "POST", "path": "/p"}'
    subset = request_document("POST", "/p", "application/json", b'{"a": {"b/c": [5, 6]}, "d~": 1}',
                              ["/a/b~1c/1", "/d~0", "/x", "/a/b~1c/01", ""])
    assert subset == ('{"method": "POST", "path": "/p", "body": {"/a/b~1c/1": 6, "/d~0": 1, "/x": null, '
                      '"/a/b~1c/01": null, "": {"a": {"b/c": [5, 6]}, "d~": 1}}}')


def _nested(levels: int) -> bytes:
    return b'{"a": ' + b"[" * (levels - 1) + b"]" * (levels - 1) + b"}"


def test_nesting_limit() -> None:
    # 256 levels of arrays and objects are JSON, 257 are bytes, in every
    # language (doc/clients.md); 5000 too, which Python's json parses since 3.12
    at_limit, beyond, far = _nested(256), _nested(257), b"[" * 5000 + b"]" * 5000
    assert request_document("POST", "/p", "application/json", at_limit).endswith(', "body": ' + at_limit.decode() + "}")
    for body in (beyond, far):
        assert request_document("POST", "/p", "application/json", body).endswith(
            ', "body_base64": "' + base64.b64encode(body).decode() + '"}')
    # a subset needs a JSON body
    with pytest.raises(InvalidFingerprint):
        request_document("POST", "/p", "application/json", beyond, ["/a"])
    # a response body alike: JSON up to 256 levels, stored as bytes beyond,
    # and an envelope of a body at the limit (257 levels) is read back
    for body, key in ((at_limit, '"body": '), (beyond, '"body_base64": ')):
        text = build_envelope(ResponseData(201, [("Content-Type", "application/json")], body), {"content-type"})
        assert key in text
        assert read_envelope(201, text).body == body


def test_settings_refuse_bad_pointers() -> None:
    with pytest.raises(ValueError):
        IdempotencySettings(fingerprint=["amount"])
    with pytest.raises(ValueError):
        IdempotencySettings(fingerprint=["/a~2"])
    with pytest.raises(TypeError):
        IdempotencySettings(fingerprint="/amount")


def test_envelope_round_trip() -> None:
    response = ResponseData(201, [("Content-Type", "application/json"), ("Location", "/p/1"), ("Set-Cookie", "s=1"),
                                  ("Vary", "a"), ("vary", "b")], b'{"n": 1.10, "s": "\xc3\xa9"}')
    text = build_envelope(response, {"content-type", "location", "vary"})
    assert text == ('{"v": 1, "headers": {"content-type": "application/json", "location": "/p/1", "vary": "a, b"}, '
                    '"body": {"n": 1.10, "s": "\xe9"}}')
    replay = read_envelope(201, text)
    assert replay.body.decode() == '{"n": 1.10, "s": "\xe9"}'
    assert ("location", "/p/1") in replay.headers
    assert read_envelope(200, '{"id": 1}').headers == [("content-type", "application/json")]
    assert read_envelope(204, None).body == b""
    with pytest.raises(UnsupportedEnvelope):
        read_envelope(200, '{"v": 2}')


def test_require_version() -> None:
    assert require_version("0.2.0") == "0.2.0"
    assert require_version("0.10.1") == "0.10.1"
    with pytest.raises(ExtensionVersionError, match="0.1.0"):
        require_version("0.1.0")
    with pytest.raises(ExtensionVersionError, match="not installed"):
        require_version(None)


def _request(key: str = "k", body: bytes = b'{"n": 1}') -> RequestData:
    return RequestData("POST", "/effects", [("Idempotency-Key", key), ("Content-Type", "application/json")], body)


SETTINGS = IdempotencySettings(scope=lambda req: "user-a", operation="op")


def test_sync_runner(db: Db) -> None:
    with ConnectionPool(conninfo(DB), min_size=1, max_size=2, open=True) as pool:
        idem = Idempotency(pool, SETTINGS)
        assert idem.extension_version is not None

        def handler(conn: psycopg.Connection[Any]) -> ResponseData:
            row = conn.execute("INSERT INTO effects (k) VALUES ('x') RETURNING id").fetchone()
            assert row is not None
            return ResponseData(201, [("content-type", "application/json")], b'{"id": %d}' % row[0])

        first = idem.run(_request(), handler)
        again = idem.run(_request(), handler)
        assert first.status == again.status == 201
        assert again.header("idempotent-replayed") == "true"
        assert again.body == first.body
        assert db.effects() == 1

        def failing(conn: psycopg.Connection[Any]) -> ResponseData:
            conn.execute("INSERT INTO effects (k) VALUES ('y')")
            raise RuntimeError("boom")

        assert idem.run(_request("k2"), failing).status == 500
        assert db.effects() == 1 and db.records() == 1
        # the pool's connection is clean again
        assert idem.run(_request("k3"), handler).status == 201
        assert db.effects() == 2


def test_sync_runner_version_check() -> None:
    for name, match in ((DB_NOEXT, "not installed"), (DB_OLD, "0.1.0")):
        with ConnectionPool(conninfo(name), min_size=1, max_size=1, open=True) as pool:
            with pytest.raises(ExtensionVersionError, match=match):
                Idempotency(pool, SETTINGS)


def test_async_runner(db: Db) -> None:
    async def scenario() -> None:
        async with AsyncConnectionPool(conninfo(DB), min_size=1, max_size=2, open=False) as pool:
            idem = AsyncIdempotency(pool, SETTINGS)

            inserted = asyncio.Event()

            async def handler(conn: psycopg.AsyncConnection[Any]) -> ResponseData:
                await conn.execute("INSERT INTO effects (k) VALUES ('x')")
                inserted.set()
                await asyncio.sleep(0.3)
                return ResponseData(201, [("content-type", "application/json")], b'{"ok": true}')

            # a caller cancelled during the handler: the transaction still commits
            task = asyncio.ensure_future(idem.run(_request(), handler))
            await asyncio.wait_for(inserted.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert db.records("completed") == 0
            for _ in range(300):
                if db.records("completed"):
                    break
                await asyncio.sleep(0.05)
            replay = await idem.run(_request(), handler)
            assert replay.header("idempotent-replayed") == "true"
            assert replay.body == b'{"ok": true}'

            async def scoped(req: RequestData) -> str | None:
                return None

            answer = await idem.run(_request("k9"), handler, settings=SETTINGS.replace(scope=scoped))
            assert answer.status == 401

        async with AsyncConnectionPool(conninfo(DB_OLD), min_size=1, max_size=1, open=False) as pool:
            with pytest.raises(ExtensionVersionError, match="0.1.0"):
                await AsyncIdempotency(pool, SETTINGS).run(_request(), handler)

    asyncio.run(scenario())
    assert db.effects() == 1
    assert db.records("completed") == 1


def test_decimal_digits_survive(db: Db) -> None:
    with ConnectionPool(conninfo(DB), min_size=1, max_size=1, open=True) as pool:
        idem = Idempotency(pool, SETTINGS)
        body = b'{"x": 0.1000000000000000055511151231257827}'

        def handler(conn: psycopg.Connection[Any]) -> ResponseData:
            return ResponseData(200, [("content-type", "application/json")], body)

        idem.run(_request(body=body), handler)
        again = idem.run(_request(body=body), handler)
        assert again.body == b'{"x": 0.1000000000000000055511151231257827}'
        assert Decimal("0.1000000000000000055511151231257827") == Decimal(again.body[6:-1].decode())
