"""The test apps under real servers (uvicorn, Werkzeug's WSGI server), read with http.client.

The frameworks' test clients do not write responses as a server does:
Starlette's decodes header bytes itself, Flask's never encodes headers as
WSGI does. Here the server writes them: a response it could not write is
refused before the commit (500 ``internal-error``, nothing kept), and a
replay of a record with framing headers is framed by the server alone.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from werkzeug.serving import make_server

import test_fastapi
import test_flask
from conftest import Db

HEADERS = {"Authorization": "Bearer user-a", "Content-Type": "application/json"}
BODY = b'{"order_id": "o-1", "amount": 100}'


@contextlib.contextmanager
def uvicorn_app() -> Iterator[int]:
    app, _ = test_fastapi.build()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            if server.started:
                break
            time.sleep(0.05)
        assert server.started, "uvicorn did not start"
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextlib.contextmanager
def werkzeug_app() -> Iterator[int]:
    with contextlib.ExitStack() as stack:
        server = make_server("127.0.0.1", 0, test_flask.build(stack), threaded=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.server_port
        finally:
            server.shutdown()
            thread.join(10)


SERVERS = {"uvicorn": uvicorn_app, "werkzeug": werkzeug_app}


def post(port: int, key: str, extra: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/effects", BODY, {**HEADERS, "Idempotency-Key": key, **(extra or {})})
        r = conn.getresponse()
        raw_headers = str(r.msg)
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read(), raw_headers
    finally:
        conn.close()


@pytest.mark.parametrize("server", sorted(SERVERS))
@pytest.mark.parametrize("case", ["latin1", "euro", "crlf", "nul"])
def test_what_the_server_cannot_write_is_not_committed(server: str, case: str, db: Db) -> None:
    with SERVERS[server]() as port:
        status, headers, body, _ = post(port, "k1", {"X-Test-Bad-Header": case})
        assert status == 500, (status, body)
        assert headers["content-type"] == "application/problem+json"
        assert json.loads(body)["code"] == "internal-error"
        assert db.effects() == 0 and db.records() == 0
        status, _, _, _ = post(port, "k1")
        assert status == 201
    assert db.effects() == 1


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_the_server_frames_a_replay(server: str, db: Db) -> None:
    with SERVERS[server]() as port:
        assert post(port, "k1")[0] == 201
        db.execute(
            "UPDATE idem_keys SET response = jsonb_set(response, '{headers}', response->'headers' || %s::jsonb)",
            json.dumps({"content-length": "3", "transfer-encoding": "chunked", "connection": "close",
                        "set-cookie": "session=stolen"}),
        )
        status, headers, body, raw = post(port, "k1")
    assert status == 201 and headers["idempotent-replayed"] == "true"
    assert json.loads(body)["status"] == "made"
    assert headers["content-length"] == str(len(body))
    assert "transfer-encoding" not in headers and "set-cookie" not in headers
    assert raw.lower().count("content-length") == 1
    assert db.effects() == 1
