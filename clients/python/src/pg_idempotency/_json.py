"""Strict JSON parsing and jsonb-style output, shared by the fingerprint and the envelope.

Numbers are read as :class:`int` and :class:`decimal.Decimal`, never as
:class:`float`, so that a body's numbers reach PostgreSQL (and come back from
a replay) digit for digit.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

__all__ = ["parse_json", "dump_json"]


class _NotJson(ValueError):
    """The text is not JSON as RFC 8259 defines it."""


def _reject_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not JSON")


_decoder = json.JSONDecoder(parse_float=Decimal, parse_constant=_reject_constant)


def parse_json(data: bytes | str) -> tuple[bool, Any]:
    """Parse UTF-8 JSON text: ``(True, value)``, or ``(False, None)`` when it is not JSON.

    ``NaN`` and ``Infinity`` (which Python's :mod:`json` accepts) are refused,
    as PostgreSQL's ``jsonb`` refuses them; so is text nested deeper than
    :mod:`json` goes (the recursion limit, about 1000 levels).
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return False, None
    else:
        text = data
    try:
        return True, _decoder.decode(text)
    except (ValueError, RecursionError):
        return False, None


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
