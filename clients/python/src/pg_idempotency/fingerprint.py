"""The request document sent as ``idem_reserve``'s ``request``, whose ``idem_hash`` is the fingerprint.

The server canonicalizes the document (RFC 8785) before hashing it, so
member order and number spelling do not change the fingerprint, and every
language's library computes the same one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from ._json import MAX_BODY_DEPTH, dump_json, parse_json

__all__ = [
    "InvalidFingerprint",
    "is_json_media_type",
    "request_document",
    "resolve_pointer",
    "validate_pointer",
]


class InvalidFingerprint(ValueError):
    """A fingerprint subset was named for a body that is not JSON (400 ``invalid-request``)."""


_MISSING: Any = object()


def is_json_media_type(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` is ``application/json`` or ``*/*+json`` (parameters ignored)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json":
        return True
    kind, slash, subtype = media.partition("/")
    return bool(kind) and slash == "/" and subtype.endswith("+json")


def validate_pointer(pointer: str) -> None:
    """Raise :class:`ValueError` unless ``pointer`` is an RFC 6901 JSON Pointer."""
    if pointer and not pointer.startswith("/"):
        raise ValueError(f"JSON Pointer {pointer!r} must be empty or begin with '/'")
    i = pointer.find("~")
    while i >= 0:
        if pointer[i + 1 : i + 2] not in ("0", "1"):
            raise ValueError(f"JSON Pointer {pointer!r} has a '~' not followed by 0 or 1")
        i = pointer.find("~", i + 2)


def resolve_pointer(document: Any, pointer: str) -> tuple[bool, Any]:
    """The value an RFC 6901 JSON Pointer finds: ``(True, value)``, or ``(False, None)``."""
    if pointer == "":
        return True, document
    value = document
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            if token not in value:
                return False, None
            value = value[token]
        elif isinstance(value, list):
            if not token.isdigit() or not token.isascii() or (len(token) > 1 and token[0] == "0"):
                return False, None
            index = int(token)
            if index >= len(value):
                return False, None
            value = value[index]
        else:
            return False, None
    return True, value


def request_document(
    method: str,
    path: str,
    content_type: str | None,
    body: bytes,
    fingerprint: Sequence[str] | None = None,
) -> str:
    """The JSON text of the request document::

        {"method": "POST", "path": "/payments", "body": {"order_id": "o-1", "amount": 100}}

    ``method`` upper case, ``path`` without the query string; a body whose
    ``Content-Type`` is JSON and that parses is ``body``, any other
    non-empty body is ``body_base64`` (padded RFC 4648 base64), an empty
    body neither. With ``fingerprint`` (JSON Pointers), ``body`` is an object
    from each pointer to the value it finds, ``null`` where it finds none;
    a subset on a body that is not JSON raises :class:`InvalidFingerprint`.
    """
    head = '{"method": ' + json.dumps(method.upper()) + ', "path": ' + json.dumps(path, ensure_ascii=False)
    is_json, value = (False, None)
    if body and is_json_media_type(content_type):
        is_json, value = parse_json(body, MAX_BODY_DEPTH)
    if fingerprint is not None:
        if not is_json:
            raise InvalidFingerprint("A fingerprint subset needs a JSON request body.")
        subset: dict[str, Any] = {}
        for pointer in fingerprint:
            found, member = resolve_pointer(value, pointer)
            subset[pointer] = member if found else None
        return head + ', "body": ' + dump_json(subset) + "}"
    if is_json:
        # the body's own text: its numbers reach the server digit for digit
        return head + ', "body": ' + body.decode("utf-8") + "}"
    if body:
        return head + ', "body_base64": "' + base64.b64encode(body).decode("ascii") + '"}'
    return head + "}"
