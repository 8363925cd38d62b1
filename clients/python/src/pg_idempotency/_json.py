"""Strict JSON parsing and jsonb-style output, shared by the fingerprint and the envelope.

Numbers are read as :class:`int` and :class:`decimal.Decimal`, never as
:class:`float`, so that a body's numbers reach PostgreSQL (and come back from
a replay) digit for digit.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

__all__ = ["MAX_BODY_DEPTH", "parse_json", "dump_json"]

#: The deepest nesting of arrays and objects a body may have and still be
#: JSON to the library, the same in every language (doc/clients.md, "The
#: fingerprint"): a body nested deeper is bytes (``body_base64``).
MAX_BODY_DEPTH = 256


class _NotJson(ValueError):
    """The text is not JSON as RFC 8259 defines it."""


def _reject_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not JSON")


_decoder = json.JSONDecoder(parse_float=Decimal, parse_constant=_reject_constant)


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether a parsed value has arrays and objects nested more than ``limit`` levels deep."""
    level: list[tuple[Any, int]] = [(value, 1)]
    while level:
        container, depth = level.pop()
        members = container.values() if isinstance(container, dict) else container
        for member in members:
            if isinstance(member, (dict, list)):
                if depth == limit:
                    return True
                level.append((member, depth + 1))
    return False


def parse_json(data: bytes | str, max_depth: int | None = None) -> tuple[bool, Any]:
    """Parse UTF-8 JSON text: ``(True, value)``, or ``(False, None)`` when it is not JSON.

    ``NaN`` and ``Infinity`` (which Python's :mod:`json` accepts) are refused,
    as PostgreSQL's ``jsonb`` refuses them. With ``max_depth``, so is text
    whose arrays and objects are nested more than ``max_depth`` levels deep
    (:mod:`json` itself goes about 1000 levels before Python 3.12, and
    further since), so that every Python, and every language, draws the line
    at the same depth.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return False, None
    else:
        text = data
    try:
        value = _decoder.decode(text)
    except (ValueError, RecursionError):
        return False, None
    if max_depth is not None and isinstance(value, (dict, list)) and _nested_deeper(value, max_depth):
        return False, None
    return True, value


def dump_json(value: Any) -> str:
    """JSON text of a value as ``jsonb`` prints it (``", "`` and ``": "`` separators).

    :class:`decimal.Decimal` values are written with their own digits.
    """
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value} is not a JSON number")
        return str(value)
    if isinstance(value, float):
        return json.dumps(value, allow_nan=False)
    if isinstance(value, dict):
        return "{" + ", ".join(
            json.dumps(str(k), ensure_ascii=False) + ": " + dump_json(v) for k, v in value.items()
        ) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(dump_json(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
