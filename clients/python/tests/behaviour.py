"""The behaviour of doc/clients.md, checked through each framework's own test client.

Every integration's test module builds the same small application (see
``APP`` below) and a ``client`` fixture adapting its framework's test client
to :class:`Client`; its ``Test*`` class inherits :class:`Behaviour`. The
application's routes, all POST:

- ``/effects`` (operation ``create-effect``): inserts one row into ``effects``
  and answers 201 with ``Location: /effects/<id>``, ``X-Custom`` and
  ``X-Other`` headers. Test headers change what the handler does after its
  INSERT: ``X-Test-Status: N`` answers N; ``X-Test-Raise`` raises;
  ``X-Test-Sql-Error: S`` raises an SQL error with SQLSTATE S;
  ``X-Test-Text`` answers a binary ``application/octet-stream`` body.
- ``/subset`` (operation ``subset``): the same, fingerprinted on
  ``["/order_id", "/amount"]``.
- ``/optional`` (operation ``optional``): the key optional.
- ``/headers`` (operation ``headers``): ``x-custom`` on the replay allow-list.
- ``/items/{id}``: the default operation, ``POST /items/{id}``.

The scope function takes ``Authorization: Bearer user-...`` as the principal.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from pg_idempotency import ExtensionVersionError, request_document
from pg_idempotency.mapping import PROBLEM_TYPE_BASE

from conftest import DB_NOEXT, DB_OLD, READ_ONLY, SHALLOW_STACK, Db

SUBSET = ["/order_id", "/amount"]
BINARY = b"\x00\xffbinary"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Post = Callable[..., Answer]


def principal(authorization: str | None) -> str | None:
    """The test apps' scope: ``Bearer user-x`` is the principal ``user-x``."""
    if not authorization or not authorization.startswith("Bearer user-"):
        return None
    if authorization == "Bearer user-nul":
        return "user-\x00"
    if authorization == "Bearer user-boom":
        raise RuntimeError("secret text of a scope function failure")
    return authorization[len("Bearer ") :]


def handler_sql(headers: Callable[[str], str | None]) -> tuple[str | None, str | None]:
    """The SQL a test handler runs after its INSERT (for X-Test-Sql-Error), and its key."""
    state = headers("x-test-sql-error")
    query = None
    if headers("x-test-terminate") is not None:
        query = "SELECT pg_terminate_backend(pg_backend_pid())"
    if state is not None:
        assert len(state) == 5 and state.isalnum()
        query = f"DO $$BEGIN RAISE EXCEPTION 'secret text' USING ERRCODE = '{state}'; END$$"
    return query, headers("idempotency-key")


class Declined(Exception):
    """A test app's own error, which its handler registered with the framework answers 402."""


#: The body the test apps' handler of :class:`Declined` answers.
DECLINED_BODY = b'{"code": "card-declined"}'

#: What ``X-Test-Bad-Header`` makes a handler add to its response: headers no server may write.
BAD_HEADERS = {
    "crlf": ("Location", "/effects/1\r\nSet-Cookie: a=b"),
    "lf": ("X-Note", "a\nb"),
    "nul": ("X-Note", "a\x00b"),
    "latin1": ("Location", "/caf\xe9"),
    "name": ("X Note", "a"),
    "euro": ("X-Note", "5 \u20ac"),
}

#: What ``X-Test-Bad-Body`` makes a handler answer: JSON that PostgreSQL's jsonb cannot store.
BAD_BODIES = {"nul": b'{"note": "a\\u0000b"}', "surrogate": b'{"note": "\\ud800"}'}


def handler_answer(headers: Callable[[str], str | None], effect_id: int) -> tuple[int, list[tuple[str, str]], bytes]:
    """What a test handler answers after its INSERT (raises for X-Test-Raise and X-Test-Declined)."""
    if headers("x-test-raise") is not None:
        raise RuntimeError("secret text of a handler failure")
    if headers("x-test-declined") is not None:
        raise Declined()
    bad_body = headers("x-test-bad-body")
    if bad_body is not None:
        return 201, [("Content-Type", "application/json")], BAD_BODIES[bad_body]
    extra = [("X-Custom", "custom"), ("X-Other", "other")]
    bad_header = headers("x-test-bad-header")
    if bad_header is not None:
        extra.append(BAD_HEADERS[bad_header])
    if headers("x-test-text") is not None:
        return 200, [("Content-Type", "application/octet-stream"), *extra], BINARY
    status = headers("x-test-status")
    if status is not None:
        return int(status), [("Content-Type", "application/json"), *extra], json.dumps({"id": effect_id}).encode()
    body = json.dumps({"id": effect_id, "status": "made"}).encode()
    return 201, [("Content-Type", "application/json"), ("Location", f"/effects/{effect_id}"), *extra], body


def _problem(answer: Answer, status: int, code: str) -> dict[str, Any]:
    assert answer.status == status, (answer.status, answer.body)
    assert answer.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = answer.json()
    assert body["code"] == code
    assert body["status"] == status
    assert body["type"] == PROBLEM_TYPE_BASE + code
    assert body["title"] and body["detail"]
    return body


def _document(answer: Answer) -> Any:
    """A body as the replay gives it back: JSON as the document it is, other bodies as their bytes."""
    if "json" in answer.headers.get("content-type", ""):
        return answer.json()
    return answer.body


A = "Bearer user-a"
B = "Bearer user-b"
JSON = ("Content-Type", "application/json")


class Behaviour:
    """The shared tests; a subclass provides the ``client`` and ``make_client`` fixtures."""

    def post(
        self,
        client: Post,
        path: str = "/effects",
        body: Any = None,
        key: str | None = "k1",
        auth: str | None = A,
        headers: Sequence[tuple[str, str]] = (),
        raw: bytes | None = None,
        content_type: str | None = "application/json",
    ) -> Answer:
        h: list[tuple[str, str]] = []
        if key is not None:
            h.append(("Idempotency-Key", key))
        if auth is not None:
            h.append(("Authorization", auth))
        if content_type is not None:
            h.append(("Content-Type", content_type))
        h.extend(headers)
        data = raw if raw is not None else json.dumps(body if body is not None else {"order_id": "o-1", "amount": 100}).encode()
        return client(path, data, h)

    # --- the key ---------------------------------------------------------

    def test_new_then_replay(self, client: Post, db: Db) -> None:
        first = self.post(client, key='"k1"')
        assert first.status == 201
        assert "idempotent-replayed" not in first.headers
        again = self.post(client, key='"k1"')
        assert again.status == 201
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["location"] == first.headers["location"]
        assert again.headers["content-type"] == "application/json"
        assert again.json() == first.json()
        assert "x-custom" not in again.headers
        assert db.effects() == 1
        assert db.records("completed") == 1
        assert db.value("SELECT operation FROM idem_keys") == "create-effect"

    def test_quoted_and_bare_are_one_key(self, client: Post, db: Db) -> None:
        assert self.post(client, key='"same"').status == 201
        bare = self.post(client, key=" same\t")
        assert bare.headers.get("idempotent-replayed") == "true"
        assert db.effects() == 1
        assert db.value("SELECT key FROM idem_keys") == "same"

    def test_escapes(self, client: Post, db: Db) -> None:
        assert self.post(client, key='"a\\"b\\\\c"').status == 201
        assert db.value("SELECT key FROM idem_keys") == 'a"b\\c'

    @pytest.mark.parametrize(
        "key",
        ['"abc', '"a\\x"', '"a";p=1', '"a" x', '"a", "b"', "a, b", '""', "", '"a\tb"', '"a\\"'],
    )
    def test_malformed_key(self, client: Post, db: Db, key: str) -> None:
        _problem(self.post(client, key=key), 400, "invalid-key")
        assert db.effects() == 0
        assert db.records() == 0

    def test_two_key_fields(self, client: Post, db: Db) -> None:
        answer = self.post(client, key=None, headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
        _problem(answer, 400, "invalid-key")
        assert db.effects() == 0

    def test_missing_key(self, client: Post, db: Db) -> None:
        _problem(self.post(client, key=None), 400, "missing-key")
        assert db.effects() == 0

    def test_key_too_long(self, client: Post, db: Db) -> None:
        body = _problem(self.post(client, key="x" * 256), 400, "invalid-request")
        assert "too long" in body["detail"]
        assert db.effects() == 0

    def test_optional_key(self, client: Post, db: Db) -> None:
        assert self.post(client, "/optional", key=None).status == 201
        assert self.post(client, "/optional", key=None).status == 201
        assert db.effects() == 2
        assert db.records() == 0
        assert self.post(client, "/optional", key="o").status == 201
        assert self.post(client, "/optional", key="o").headers.get("idempotent-replayed") == "true"
        assert db.effects() == 3

    # --- the scope -------------------------------------------------------

    def test_unauthenticated(self, client: Post, db: Db) -> None:
        _problem(self.post(client, auth=None), 401, "unauthenticated")
        _problem(self.post(client, auth="Bearer nobody"), 401, "unauthenticated")
        assert db.effects() == 0
        assert db.records() == 0

    @pytest.mark.parametrize("auth", ["Bearer user-nul", "Bearer user-" + "x" * 300])
    def test_principal_the_server_cannot_take(self, client: Post, db: Db, auth: str) -> None:
        # a NUL (PostgreSQL's text has none), more than 255 bytes (the extension's 22023)
        _problem(self.post(client, auth=auth), 400, "invalid-request")
        assert db.effects() == 0
        assert db.records() == 0

    def test_scope_function_that_fails(self, client: Post, db: Db) -> None:
        body = _problem(self.post(client, auth="Bearer user-boom"), 500, "internal-error")
        assert "secret" not in body["detail"]
        assert db.effects() == 0
        assert db.records() == 0

    def test_user_b_cannot_replay_user_a(self, client: Post, db: Db) -> None:
        a = self.post(client, auth=A)
        b = self.post(client, auth=B)
        assert a.status == b.status == 201
        assert "idempotent-replayed" not in b.headers
        assert a.json()["id"] != b.json()["id"]
        assert db.effects() == 2
        assert db.value("SELECT string_agg(scope, ',' ORDER BY scope) FROM idem_keys") == "user-a,user-b"

    # --- the fingerprint -------------------------------------------------

    def test_fingerprint_of_json_body(self, client: Post, db: Db) -> None:
        self.post(client, raw=b'{"amount": 1.0, "order_id": "o-1"}')
        expected = '{"method": "POST", "path": "/effects", "body": {"order_id": "o-1", "amount": 1}}'
        assert db.value("SELECT request_hash = idem_hash(%s::jsonb) FROM idem_keys", expected) is True
        # member order and number spelling do not matter
        again = self.post(client, raw=b'{"order_id":"o-1","amount":1}')
        assert again.headers.get("idempotent-replayed") == "true"
        _problem(self.post(client, raw=b'{"order_id":"o-1","amount":2}'), 422, "mismatch")
        assert db.effects() == 1

    def test_fingerprint_of_other_body(self, client: Post, db: Db) -> None:
        self.post(client, raw=b"hello \xff", content_type="text/plain")
        expected = '{"method": "POST", "path": "/effects", "body_base64": "aGVsbG8g/w=="}'
        assert db.value("SELECT request_hash = idem_hash(%s::jsonb) FROM idem_keys", expected) is True
        self.post(client, key="empty", raw=b"", content_type=None)
        expected = '{"method": "POST", "path": "/effects"}'
        assert db.value("SELECT request_hash = idem_hash(%s::jsonb) FROM idem_keys WHERE key = 'empty'", expected)

    def test_fingerprint_subset(self, client: Post, db: Db) -> None:
        first = self.post(client, "/subset", body={"order_id": "o-1", "amount": 100, "note": "x"})
        assert first.status == 201
        expected = '{"method": "POST", "path": "/subset", "body": {"/order_id": "o-1", "/amount": 100}}'
        assert db.value("SELECT request_hash = idem_hash(%s::jsonb) FROM idem_keys", expected) is True
        other_note = self.post(client, "/subset", body={"amount": 100, "order_id": "o-1", "note": "y"})
        assert other_note.headers.get("idempotent-replayed") == "true"
        _problem(self.post(client, "/subset", body={"order_id": "o-1", "amount": 5}), 422, "mismatch")
        self.post(client, "/subset", key="k2", body={"order_id": "o-2"})
        expected = '{"method": "POST", "path": "/subset", "body": {"/order_id": "o-2", "/amount": null}}'
        assert db.value("SELECT request_hash = idem_hash(%s::jsonb) FROM idem_keys WHERE key = 'k2'", expected)
        _problem(self.post(client, "/subset", key="k3", raw=b"text", content_type="text/plain"), 400, "invalid-request")
        assert db.effects() == 2

    @pytest.mark.parametrize(
        ("path", "raw", "message"),
        [
            # 22P05: jsonb has no NUL
            ("/effects", b'{"order_id": "o-1", "note": "a\\u0000b"}', "unsupported Unicode escape sequence"),
            ("/effects", b'{"order_id": "o-1", "\\u0000": 1}', "unsupported Unicode escape sequence"),
            # 22P02: a lone surrogate
            ("/effects", b'{"order_id": "o-1", "note": "\\ud800"}', "invalid input syntax for type json"),
            # 22003: beyond a double (RFC 8785), beyond numeric (jsonb)
            ("/effects", b'{"order_id": "o-1", "amount": 1e400}', "out of range for canonical JSON"),
            ("/subset", b'{"order_id": "o-1", "amount": 1e400}', "out of range for canonical JSON"),
            ("/effects", b'{"order_id": "o-1", "amount": 1e1000000}', "value overflows numeric format"),
        ],
    )
    def test_fingerprint_the_server_refuses(self, client: Post, db: Db, path: str, raw: bytes, message: str) -> None:
        body = _problem(self.post(client, path, raw=raw), 400, "invalid-request")
        assert message in body["detail"]
        assert db.effects() == 0
        assert db.records() == 0

    def test_nesting_at_the_limit_on_the_smallest_stack(self, make_client: Callable[..., Post], db: Db) -> None:
        # 256 levels, the deepest that is JSON to the library, through a
        # server at its smallest max_stack_depth (100kB, about 600 levels)
        client = make_client(server_options=SHALLOW_STACK)
        raw = b'{"order_id": "o-1", "x": ' + b"[" * 255 + b"]" * 255 + b"}"
        assert self.post(client, raw=raw).status == 201
        expected = '{"method": "POST", "path": "/effects", "body": %s}' % raw.decode()
        assert db.value("SELECT request_hash = idem_hash(%s::jsonb) FROM idem_keys", expected) is True
        assert db.effects() == 1

    @pytest.mark.parametrize("levels", [257, 5000])
    def test_nesting_beyond_the_limit_is_bytes(self, client: Post, db: Db, levels: int) -> None:
        raw = b"[" * levels + b"]" * levels
        assert self.post(client, raw=raw).status == 201
        expected = '{"method": "POST", "path": "/effects", "body_base64": "%s"}' % base64.b64encode(raw).decode()
        assert db.value("SELECT request_hash = idem_hash(%s::jsonb) FROM idem_keys", expected) is True
        assert db.effects() == 1

    def test_default_operation(self, client: Post, db: Db) -> None:
        assert self.post(client, "/items/5").status == 201
        assert db.value("SELECT operation FROM idem_keys") == "POST /items/{id}"

    # --- the envelope ----------------------------------------------------

    def test_envelope(self, client: Post, db: Db) -> None:
        first = self.post(client)
        envelope = db.value("SELECT response FROM idem_keys")
        assert envelope == {
            "v": 1,
            "headers": {"content-type": "application/json", "location": first.headers["location"]},
            "body": first.json(),
        }
        assert db.value("SELECT response_status FROM idem_keys") == 201

    def test_binary_body_replayed(self, client: Post, db: Db) -> None:
        first = self.post(client, headers=[("X-Test-Text", "1")])
        assert first.status == 200 and first.body == BINARY
        again = self.post(client, headers=[("X-Test-Text", "1")])
        assert again.headers["idempotent-replayed"] == "true"
        assert again.body == BINARY
        assert again.headers["content-type"] == "application/octet-stream"
        assert db.value("SELECT response->>'body_base64' FROM idem_keys") == "AP9iaW5hcnk="
        assert db.effects() == 1

    def test_replay_header_allow_list(self, client: Post, db: Db) -> None:
        self.post(client, "/headers")
        again = self.post(client, "/headers")
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["x-custom"] == "custom"
        assert "x-other" not in again.headers
        assert "location" in again.headers

    def test_record_completed_by_plain_sql(self, client: Post, db: Db) -> None:
        doc = request_document("POST", "/effects", "application/json", b'{"order_id": "o-1", "amount": 100}')
        db.execute("SELECT idem_reserve('create-effect', 'sql', %s::jsonb, scope => 'user-a')", doc)
        db.execute("SELECT idem_complete('create-effect', 'sql', '{\"id\": 7}', 201, scope => 'user-a')")
        answer = self.post(client, key="sql")
        assert answer.status == 201
        assert answer.headers["idempotent-replayed"] == "true"
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {"id": 7}
        assert db.effects() == 0

    def test_higher_envelope_version(self, client: Post, db: Db) -> None:
        doc = request_document("POST", "/effects", "application/json", b'{"order_id": "o-1", "amount": 100}')
        db.execute("SELECT idem_reserve('create-effect', 'v2', %s::jsonb, scope => 'user-a')", doc)
        db.execute("SELECT idem_complete('create-effect', 'v2', '{\"v\": 2, \"body\": 1}', 201, scope => 'user-a')")
        _problem(self.post(client, key="v2"), 500, "unsupported-envelope")
        assert db.effects() == 0

    # --- the mapping -----------------------------------------------------

    def test_in_progress(self, client: Post, db: Db) -> None:
        doc = request_document("POST", "/effects", "application/json", b'{"order_id": "o-1", "amount": 100}')
        db.execute("SELECT idem_reserve('create-effect', 'k1', %s::jsonb, scope => 'user-a')", doc)
        answer = self.post(client)
        _problem(answer, 409, "in-progress")
        assert answer.headers["retry-after"] == "1"
        assert db.effects() == 0

    def test_stuck(self, client: Post, db: Db) -> None:
        doc = request_document("POST", "/effects", "application/json", b'{"order_id": "o-1", "amount": 100}')
        db.execute("SELECT idem_reserve('create-effect', 'k1', %s::jsonb, scope => 'user-a')", doc)
        db.execute("UPDATE idem_keys SET updated_at = '-infinity'")
        answer = self.post(client)
        _problem(answer, 409, "stuck")
        assert answer.headers["retry-after"] == "1"
        assert db.effects() == 0

    def test_handler_error_rolls_back(self, client: Post, db: Db) -> None:
        body = _problem(self.post(client, headers=[("X-Test-Raise", "1")]), 500, "internal-error")
        assert "secret" not in body["detail"]
        assert db.effects() == 0
        assert db.records() == 0
        assert self.post(client).status == 201  # the retry is new
        assert db.effects() == 1

    @pytest.mark.parametrize("status", [500, 503, 408, 429])
    def test_retryable_status_rolls_back(self, client: Post, db: Db, status: int) -> None:
        assert self.post(client, headers=[("X-Test-Status", str(status))]).status == status
        assert db.effects() == 0
        assert db.records() == 0
        retry = self.post(client)
        assert retry.status == 201 and "idempotent-replayed" not in retry.headers

    @pytest.mark.parametrize("status", [402, 400, 200])
    def test_final_failure_is_completed(self, client: Post, db: Db, status: int) -> None:
        first = self.post(client, headers=[("X-Test-Status", str(status))])
        assert first.status == status
        assert db.effects() == 1
        assert db.value("SELECT response_status FROM idem_keys WHERE status = 'completed'") == status
        again = self.post(client, headers=[("X-Test-Status", str(status))])
        assert again.status == status and again.headers["idempotent-replayed"] == "true"
        assert again.json() == first.json()
        assert db.effects() == 1

    # --- raised errors (doc/clients.md, "One transaction") --------------

    #: The status of the framework's own HTTP error that ``X-Test-Http-Error`` raises.
    http_error_status = 402
    #: Whether the framework answers :class:`Declined` with the app's handler (402).
    resolves_declined = True

    def final_http_errors(self) -> Any:
        """The ``final_errors`` setting that makes the framework's HTTP error final."""
        raise NotImplementedError

    def test_raised_http_error_rolls_back(self, client: Post, db: Db) -> None:
        first = self.post(client, headers=[("X-Test-Http-Error", "1")])
        assert first.status == self.http_error_status, (first.status, first.body)
        assert db.effects() == 0
        assert db.records() == 0
        retry = self.post(client)
        assert retry.status == 201 and "idempotent-replayed" not in retry.headers
        assert db.effects() == 1

    def test_raised_error_with_a_handler_rolls_back(self, client: Post, db: Db) -> None:
        if not self.resolves_declined:
            pytest.skip("the framework has no handler of its own for an application's exception")
        first = self.post(client, headers=[("X-Test-Declined", "1")])
        assert (first.status, first.body) == (402, DECLINED_BODY)
        assert db.effects() == 0
        assert db.records() == 0
        assert self.post(client).status == 201
        assert db.effects() == 1

    def test_final_http_error_is_completed(self, make_client: Callable[..., Post], db: Db) -> None:
        client = make_client(final_errors=self.final_http_errors())
        first = self.post(client, headers=[("X-Test-Http-Error", "1")])
        assert first.status == self.http_error_status
        assert db.effects() == 1
        assert db.value("SELECT response_status FROM idem_keys WHERE status = 'completed'") == self.http_error_status
        again = self.post(client, headers=[("X-Test-Http-Error", "1")])
        assert again.status == first.status
        assert _document(again) == _document(first)  # JSON in jsonb's formatting, other bodies as they were
        assert again.headers["idempotent-replayed"] == "true"
        assert db.effects() == 1

    def test_final_error_by_predicate(self, make_client: Callable[..., Post], db: Db) -> None:
        if not self.resolves_declined:
            pytest.skip("the framework has no handler of its own for an application's exception")
        client = make_client(final_errors=lambda e: isinstance(e, Declined))
        first = self.post(client, headers=[("X-Test-Declined", "1")])
        assert (first.status, first.body) == (402, DECLINED_BODY)
        again = self.post(client, headers=[("X-Test-Declined", "1")])
        assert (again.status, again.body) == (402, DECLINED_BODY)
        assert again.headers["idempotent-replayed"] == "true"
        assert db.effects() == 1
        assert db.records("completed") == 1
        # an error the predicate does not make final is still rolled back
        other = self.post(client, key="k2", headers=[("X-Test-Http-Error", "1")])
        assert other.status == self.http_error_status
        assert db.effects() == 1 and db.records() == 1

    def test_final_error_that_cannot_commit_is_rolled_back(self, make_client: Callable[..., Post], db: Db) -> None:
        # the handler's SQL failed (the transaction is aborted) and then it raised a final error
        client = make_client(final_errors=self.final_http_errors())
        first = self.post(client, headers=[("X-Test-Http-Error", "1"), ("X-Test-Fail-First", "1")])
        assert first.status == self.http_error_status
        assert db.effects() == 0
        assert db.records() == 0

    def test_unhandled_final_error_is_internal_error(self, make_client: Callable[..., Post], db: Db) -> None:
        client = make_client(final_errors=RuntimeError)
        body = _problem(self.post(client, headers=[("X-Test-Raise", "1")]), 500, "internal-error")
        assert "secret" not in body["detail"]
        assert db.effects() == 0
        assert db.records() == 0

    # --- only what can be sent is committed ------------------------------

    #: The cases of :data:`BAD_HEADERS` the framework rewrites into a value it can send.
    rewritten_headers: frozenset[str] = frozenset()

    @pytest.mark.parametrize("case", sorted(BAD_HEADERS))
    def test_unsendable_header_rolls_back(self, client: Post, db: Db, case: str) -> None:
        if case in self.rewritten_headers:
            # what the server writes is visible ASCII: committed and replayed as it was sent
            first = self.post(client, "/headers", headers=[("X-Test-Bad-Header", case)])
            assert first.status == 201 and db.records("completed") == 1
            return
        _problem(self.post(client, headers=[("X-Test-Bad-Header", case)]), 500, "internal-error")
        assert db.effects() == 0
        assert db.records() == 0
        retry = self.post(client)
        assert retry.status == 201 and "idempotent-replayed" not in retry.headers
        assert db.effects() == 1

    @pytest.mark.parametrize("case", sorted(BAD_BODIES))
    def test_unstorable_body_rolls_back(self, client: Post, db: Db, case: str) -> None:
        _problem(self.post(client, headers=[("X-Test-Bad-Body", case)]), 500, "internal-error")
        assert db.effects() == 0
        assert db.records() == 0
        assert self.post(client).status == 201
        assert db.effects() == 1

    def test_unsendable_header_on_a_retryable_status(self, client: Post, db: Db) -> None:
        # rolled back anyway, and answered 500 rather than with what the server cannot write
        answer = self.post(client, headers=[("X-Test-Status", "503"), ("X-Test-Bad-Header", "latin1")])
        _problem(answer, 500, "internal-error")
        assert db.effects() == 0 and db.records() == 0

    # --- bounded memory --------------------------------------------------

    def test_body_over_the_limit(self, make_client: Callable[..., Post], db: Db) -> None:
        client = make_client(max_body_bytes=64)
        head, tail = b'{"order_id": "o-1", "note": "', b'"}'
        at_limit = head + b"x" * (64 - len(head) - len(tail)) + tail
        _problem(self.post(client, raw=at_limit + b" "), 413, "payload-too-large")
        assert db.effects() == 0
        assert db.records() == 0
        assert self.post(client, raw=at_limit).status == 201
        assert db.effects() == 1

    def test_stored_response_over_the_limit(self, make_client: Callable[..., Post], db: Db) -> None:
        client = make_client(max_response_bytes=60)
        _problem(self.post(client), 500, "internal-error")
        assert db.effects() == 0
        assert db.records() == 0
        # a retryable status stores nothing, so the limit does not apply to it
        assert self.post(client, headers=[("X-Test-Status", "503")]).status == 503

    # --- bounded time ----------------------------------------------------

    def test_time_limit_frees_the_key(self, make_client: Callable[..., Post], db: Db) -> None:
        # the first handler hangs past the limit: its key is free for the retry while it still runs
        client = make_client(time_limit=timedelta(milliseconds=400))
        first: list[Answer] = []
        hung = threading.Thread(target=lambda: first.append(self.post(client, headers=[("X-Test-Sleep", "2.5")])))
        hung.start()
        try:
            time.sleep(1.2)
            retry = self.post(client)
        finally:
            hung.join(15)
        assert retry.status == 201 and "idempotent-replayed" not in retry.headers, retry.body
        answer = first[0]
        assert answer.status == 503 and answer.headers["retry-after"] == "1", answer.body
        assert answer.json()["code"] == "time-limit"
        assert db.effects() == 1
        assert db.records("completed") == 1

    # --- replay only what is allowed -------------------------------------

    def _stored(self, client: Post, db: Db, response: str) -> Answer:
        assert self.post(client).status == 201
        db.execute("UPDATE idem_keys SET response = %s::jsonb", response)
        return self.post(client)

    def test_replay_applies_the_allow_list_now(self, client: Post, db: Db) -> None:
        stored = json.dumps({"v": 1, "headers": {
            "content-type": "application/json", "location": "/effects/9", "x-custom": "injected",
            "set-cookie": "session=stolen", "content-length": "3", "transfer-encoding": "chunked",
            "connection": "close", "keep-alive": "timeout=5", "upgrade": "h2c"}, "body": {"id": 9}})
        again = self._stored(client, db, stored)
        assert again.status == 201 and again.headers["idempotent-replayed"] == "true"
        assert again.json() == {"id": 9}
        assert again.headers["location"] == "/effects/9"
        for name in ("x-custom", "set-cookie", "transfer-encoding", "connection", "keep-alive", "upgrade"):
            assert name not in again.headers, name
        assert again.headers.get("content-length", str(len(again.body))) == str(len(again.body))
        assert db.effects() == 1

    def test_replay_of_allow_listed_set_cookie_and_framing(self, make_client: Callable[..., Post], db: Db) -> None:
        client = make_client(replay_headers=["content-type", "set-cookie", "content-length", "transfer-encoding"])
        stored = json.dumps({"v": 1, "headers": {
            "content-type": "application/json", "set-cookie": "a=b", "content-length": "3",
            "transfer-encoding": "chunked"}, "body": {"id": 9}})
        again = self._stored(client, db, stored)
        assert again.headers["set-cookie"] == "a=b"
        assert "transfer-encoding" not in again.headers
        assert again.headers.get("content-length", str(len(again.body))) == str(len(again.body))
        assert again.json() == {"id": 9}

    @pytest.mark.parametrize(
        "response",
        [
            '{"v": "1", "body": 1}',
            '{"v": 2, "body": 1}',
            '{"v": null, "body": 1}',
            '{"v": true, "body": 1}',
            '{"v": 1, "headers": null}',
            '{"v": 1, "headers": ["content-type"]}',
            '{"v": 1, "headers": {"content-type": 1}}',
            '{"v": 1, "headers": {"location": "/a\\r\\nx: y"}}',
            '{"v": 1, "headers": {"location": "/caf\\u00e9"}}',
            '{"v": 1, "headers": {"bad name": "a"}}',
            '{"v": 1, "body": 1, "body_base64": "YQ=="}',
            '{"v": 1, "body_base64": "YQ"}',
            '{"v": 1, "body_base64": "Y Q=="}',
            '{"v": 1, "body_base64": 5}',
        ],
    )
    def test_unreadable_envelope(self, client: Post, db: Db, response: str) -> None:
        _problem(self._stored(client, db, response), 500, "unsupported-envelope")
        assert db.effects() == 1

    def test_envelope_version_one_point_zero(self, client: Post, db: Db) -> None:
        again = self._stored(client, db, '{"v": 1.0, "headers": {"content-type": "text/plain"}, "body_base64": "YQ=="}')
        assert (again.status, again.body) == (201, b"a")
        assert again.headers["idempotent-replayed"] == "true"

    @pytest.mark.parametrize("state", ["40001", "40P01"])
    def test_serialization_failure(self, client: Post, db: Db, state: str) -> None:
        answer = self.post(client, headers=[("X-Test-Sql-Error", state)])
        _problem(answer, 503, "retry")
        assert answer.headers["retry-after"] == "1"
        assert db.effects() == 0
        assert db.records() == 0

    @pytest.mark.parametrize("state", ["22P02", "22P05", "22003", "22021", "54001"])
    def test_data_exception_of_the_handler(self, client: Post, db: Db, state: str) -> None:
        # the rows of the requests the server refuses hold for the handler's own SQL too
        body = _problem(self.post(client, headers=[("X-Test-Sql-Error", state)]), 400, "invalid-request")
        assert body["detail"] == "secret text"
        assert db.effects() == 0
        assert db.records() == 0

    def test_other_sql_error(self, client: Post, db: Db) -> None:
        body = _problem(self.post(client, headers=[("X-Test-Sql-Error", "P0001")]), 500, "internal-error")
        assert "secret" not in body["detail"]
        assert db.effects() == 0
        assert db.records() == 0

    def test_connection_lost_in_the_handler(self, client: Post, db: Db) -> None:
        # the server ends the handler's session: rolled back, 503 unavailable, and the next request runs
        answer = self.post(client, headers=[("X-Test-Terminate", "1")])
        _problem(answer, 503, "unavailable")
        assert answer.headers["retry-after"] == "1"
        assert db.effects() == 0
        assert db.records() == 0
        assert self.post(client).status == 201
        assert db.effects() == 1

    def test_read_only(self, make_client: Callable[..., Post], db: Db) -> None:
        client = make_client(server_options=READ_ONLY)
        answer = self.post(client)
        _problem(answer, 503, "read-only")
        assert answer.headers["retry-after"] == "1"
        assert db.records() == 0

    def test_mapping_is_data(self, make_client: Callable[..., Post], db: Db) -> None:
        from pg_idempotency import DEFAULT_MAPPING, Problem

        mapping = {"mismatch": Problem(409, "Reused", "Reused key.", retry_after=True, retry_after_seconds=7)}
        client = make_client(mapping=mapping, retry_after=3)
        self.post(client)
        answer = self.post(client, body={"order_id": "o-9", "amount": 1})
        _problem(answer, 409, "mismatch")
        assert answer.headers["retry-after"] == "7"
        assert answer.json()["title"] == "Reused"
        answer = self.post(client, key="x" * 300)
        _problem(answer, 400, "invalid-request")
        assert DEFAULT_MAPPING["mismatch"].status == 422

    # --- the version check -----------------------------------------------

    def test_version_check(self, make_client: Callable[..., Post]) -> None:
        with pytest.raises(ExtensionVersionError, match="not installed"):
            make_client(dbname=DB_NOEXT)
        with pytest.raises(ExtensionVersionError, match="0.1.0"):
            make_client(dbname=DB_OLD)
