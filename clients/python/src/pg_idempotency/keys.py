"""The ``Idempotency-Key`` header, parsed as draft-ietf-httpapi-idempotency-key-header defines it."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["InvalidKey", "parse_key"]


class InvalidKey(ValueError):
    """The ``Idempotency-Key`` header is malformed (answered 400 ``invalid-key``)."""


def parse_key(fields: Sequence[str]) -> str | None:
    """The key of the request's ``Idempotency-Key`` fields, or ``None`` when there is none.

    ``fields`` holds the value of each ``Idempotency-Key`` field of the
    request, in order. The value is an RFC 8941 sf-string (``"..."``, printable
    ASCII with ``\\"`` and ``\\\\`` as its only escapes); the bare form (the
    value without quotes, trimmed of spaces and tabs) is accepted too, so
    ``"abc"`` and ``abc`` are one key.

    Raises :class:`InvalidKey` for more than one field, a list, a malformed
    sf-string (unclosed, a bad escape, a character outside 0x20 to 0x7E,
    parameters or anything else after the closing quote) and an empty key.
    """
    if not fields:
        return None
    if len(fields) > 1:
        raise InvalidKey("The request has more than one Idempotency-Key field.")
    value = fields[0].strip(" \t")
    if value.startswith('"'):
        key = _sf_string(value)
    else:
        if "," in value:
            raise InvalidKey("The Idempotency-Key field holds a list.")
        key = value
    if not key:
        raise InvalidKey("The Idempotency-Key is empty.")
    return key


def _sf_string(value: str) -> str:
    """The characters of an sf-string that begins at value[0] and ends at its last character."""
    out: list[str] = []
    i, n = 1, len(value)
    while True:
        if i >= n:
            raise InvalidKey("The quoted Idempotency-Key is not closed.")
        c = value[i]
        if c == "\\":
            if i + 1 >= n or value[i + 1] not in '"\\':
                raise InvalidKey('The quoted Idempotency-Key has an escape other than \\" or \\\\.')
            out.append(value[i + 1])
            i += 2
            continue
        if c == '"':
            break
        if not " " <= c <= "~":
            raise InvalidKey("The quoted Idempotency-Key has a character outside printable ASCII.")
        out.append(c)
        i += 1
    if i + 1 != n:
        raise InvalidKey("The quoted Idempotency-Key is followed by something other than spaces.")
    return "".join(out)
