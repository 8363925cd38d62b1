"""The response envelope stored in ``idem_keys.response``, written and read by every language.

::

    {"v": 1,
     "headers": {"content-type": "application/json", "location": "/payments/42"},
     "body": {"id": 42, "status": "paid"}}
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Collection
from decimal import Decimal
from typing import Any

from ._json import MAX_BODY_DEPTH, dump_json, parse_json
from .fingerprint import is_json_media_type
from .http import ResponseData, UnsendableResponse, header_problem

__all__ = ["ENVELOPE_VERSION", "NEVER_REPLAYED", "UnsupportedEnvelope", "build_envelope", "read_envelope"]

#: The version of the envelope this library writes and the highest it reads.
ENVELOPE_VERSION = 1


#: Framing and hop-by-hop headers: never stored or replayed, even when allow-listed
#: (the server frames the replayed body itself).
NEVER_REPLAYED: frozenset[str] = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade", "proxy-connection"}
)


class UnsupportedEnvelope(ValueError):
    """A stored envelope this library cannot read: a higher version, wrong types, bad base64 (500)."""


def _unstorable(value: Any) -> str | None:
    """What in a parsed JSON value PostgreSQL's ``jsonb`` cannot store (NUL, a lone surrogate), or ``None``."""
    level = [value]
    while level:
        item = level.pop()
        if isinstance(item, dict):
            level.extend(item.keys())
            level.extend(item.values())
        elif isinstance(item, list):
            level.extend(item)
        elif isinstance(item, str):
            for c in item:
                if c == "\x00":
                    return "a NUL character (\\u0000)"
                if "\ud800" <= c <= "\udfff":
                    return "a lone surrogate"
    return None


def build_envelope(response: ResponseData, replay_headers: Collection[str]) -> str:
    """The JSON text of the envelope of ``response``.

    ``headers`` keeps the response headers whose lower-cased names are in
    ``replay_headers`` (several values joined with ``", "``); ``body`` is the
    body as JSON when its content type is JSON and it parses, otherwise
    ``body_base64``; neither for an empty body. Raises
    :class:`~pg_idempotency.http.UnsendableResponse` for a JSON body that
    ``jsonb`` cannot store (``\\u0000``, a lone surrogate): it is never
    stored as something else.
    """
    allow = {h.lower() for h in replay_headers} - NEVER_REPLAYED
    headers: dict[str, str] = {}
    for name, field in response.headers:
        lname = name.lower()
        if lname in allow:
            headers[lname] = headers[lname] + ", " + field if lname in headers else field
    text = '{"v": ' + str(ENVELOPE_VERSION) + ', "headers": ' + json.dumps(headers, ensure_ascii=False)
    body = response.body
    if body:
        ok, parsed = False, None
        if is_json_media_type(response.header("content-type")):
            ok, parsed = parse_json(body, MAX_BODY_DEPTH)
        if ok:
            reason = _unstorable(parsed)
            if reason is not None:
                raise UnsendableResponse(f"the JSON body has {reason}, which PostgreSQL cannot store")
            return text + ', "body": ' + body.decode("utf-8") + "}"
        return text + ', "body_base64": "' + base64.b64encode(body).decode("ascii") + '"}'
    return text + "}"


def _version_is_one(version: Any) -> bool:
    """Whether ``v`` is the number 1 (``1.0`` too, as RFC 8785 reads it; not ``true``, ``"1"``)."""
    if isinstance(version, bool):
        return False
    if isinstance(version, int):
        return version == ENVELOPE_VERSION
    if isinstance(version, Decimal):
        return version.is_finite() and version == ENVELOPE_VERSION
    return False


def read_envelope(status: int, response: str | None, replay_headers: Collection[str] | None = None) -> ResponseData:
    """The response to replay from a record's ``response_status`` and ``response`` (as JSON text).

    A ``response`` without ``v`` (a record completed by plain SQL) is
    replayed as a JSON body with ``content-type: application/json``; a NULL
    one as an empty body. Only the stored headers on ``replay_headers`` are
    replayed (``None``: all), never those of :data:`NEVER_REPLAYED`.

    Raises :class:`UnsupportedEnvelope` for a record this library cannot
    read: ``v`` other than the number 1, ``headers`` that is not an object
    of strings, a header that cannot be sent, both ``body`` and
    ``body_base64``, a ``body_base64`` that is not padded base64.
    """
    if response is None:
        return ResponseData(status, [], b"")
    ok, value = parse_json(response)
    if not ok:
        raise UnsupportedEnvelope("The stored response is not JSON.")
    if not isinstance(value, dict) or "v" not in value:
        return ResponseData(status, [("content-type", "application/json")], dump_json(value).encode())
    version = value["v"]
    if not _version_is_one(version):
        raise UnsupportedEnvelope(f"The stored response envelope has version {dump_json(version)}.")
    stored: Any = value.get("headers", {})
    if not isinstance(stored, dict):
        raise UnsupportedEnvelope("The stored response envelope's headers are not an object.")
    allow = None if replay_headers is None else {h.lower() for h in replay_headers}
    headers: list[tuple[str, str]] = []
    for name, header in stored.items():
        if not isinstance(header, str):
            raise UnsupportedEnvelope(f"The stored response envelope's header {name!r} is not a string.")
        reason = header_problem(name, header)
        if reason is not None:
            raise UnsupportedEnvelope(f"The stored response envelope has a header that cannot be sent: {reason}.")
        lname = name.lower()
        if lname not in NEVER_REPLAYED and (allow is None or lname in allow):
            headers.append((lname, header))
    if "body" in value and "body_base64" in value:
        raise UnsupportedEnvelope("The stored response envelope has both body and body_base64.")
    if "body" in value:
        body = dump_json(value["body"]).encode()
    elif "body_base64" in value:
        encoded = value["body_base64"]
        if not isinstance(encoded, str):
            raise UnsupportedEnvelope("The stored response envelope's body_base64 is not a string.")
        try:
            body = base64.b64decode(encoded.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as e:
            raise UnsupportedEnvelope("The stored response envelope's body_base64 is not padded base64.") from e
    else:
        body = b""
    return ResponseData(status, headers, body)
