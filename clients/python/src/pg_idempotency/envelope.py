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
from typing import Any

from ._json import MAX_BODY_DEPTH, dump_json, parse_json
from .fingerprint import is_json_media_type
from .http import ResponseData

__all__ = ["ENVELOPE_VERSION", "UnsupportedEnvelope", "build_envelope", "read_envelope"]

#: The version of the envelope this library writes and the highest it reads.
ENVELOPE_VERSION = 1


class UnsupportedEnvelope(ValueError):
    """A stored envelope has a version this library cannot read (500 ``unsupported-envelope``)."""


def build_envelope(response: ResponseData, replay_headers: Collection[str]) -> str:
    """The JSON text of the envelope of ``response``.

    ``headers`` keeps the response headers whose lower-cased names are in
    ``replay_headers`` (several values joined with ``", "``); ``body`` is the
    body as JSON when its content type is JSON and it parses, otherwise
    ``body_base64``; neither for an empty body.
    """
    allow = {h.lower() for h in replay_headers}
    headers: dict[str, str] = {}
    for name, value in response.headers:
        lname = name.lower()
        if lname in allow:
            headers[lname] = headers[lname] + ", " + value if lname in headers else value
    text = '{"v": ' + str(ENVELOPE_VERSION) + ', "headers": ' + json.dumps(headers, ensure_ascii=False)
    body = response.body
    if body:
        if is_json_media_type(response.header("content-type")) and parse_json(body, MAX_BODY_DEPTH)[0]:
            return text + ', "body": ' + body.decode("utf-8") + "}"
        return text + ', "body_base64": "' + base64.b64encode(body).decode("ascii") + '"}'
    return text + "}"


def read_envelope(status: int, response: str | None) -> ResponseData:
    """The response to replay from a record's ``response_status`` and ``response`` (as JSON text).

    A ``response`` without ``v`` (a record completed by plain SQL) is
    replayed as a JSON body with ``content-type: application/json``; a NULL
    one as an empty body. Raises :class:`UnsupportedEnvelope` for a ``v``
    other than 1.
    """
    if response is None:
        return ResponseData(status, [], b"")
    ok, value = parse_json(response)
    if not ok:
        raise UnsupportedEnvelope("The stored response is not JSON.")
    if not isinstance(value, dict) or "v" not in value:
        return ResponseData(status, [("content-type", "application/json")], dump_json(value).encode())
    version = value["v"]
    if not isinstance(version, int) or isinstance(version, bool) or version != ENVELOPE_VERSION:
        raise UnsupportedEnvelope(f"The stored response envelope has version {version}.")
    headers: list[tuple[str, str]] = []
    stored: Any = value.get("headers") or {}
    if not isinstance(stored, dict):
        raise UnsupportedEnvelope("The stored response envelope's headers are not an object.")
    for name, header in stored.items():
        if not isinstance(header, str):
            raise UnsupportedEnvelope("The stored response envelope has a header that is not a string.")
        headers.append((str(name), header))
    if "body" in value:
        body = dump_json(value["body"]).encode()
    elif "body_base64" in value:
        try:
            body = base64.b64decode(str(value["body_base64"]), validate=True)
        except binascii.Error as e:
            raise UnsupportedEnvelope("The stored response envelope's body_base64 is not base64.") from e
    else:
        body = b""
    return ResponseData(status, headers, body)
