"""The request and response as the library sees them, independent of any framework."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["RequestData", "ResponseData", "UnsendableResponse", "check_sendable", "header_problem"]


@dataclass(frozen=True)
class RequestData:
    """What the library reads of a request.

    ``headers`` holds every header field as sent, ``(name, value)`` pairs in
    order (so that two ``Idempotency-Key`` fields can be told from one);
    ``path`` is the request's path without the query string; ``route`` the
    framework's path template (``/payments/{id}``), used in the default
    operation, or ``None`` to use ``path``.
    """

    method: str
    path: str
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""
    route: str | None = None

    def header_values(self, name: str) -> list[str]:
        """The values of every field named ``name`` (case-insensitive)."""
        lname = name.lower()
        return [v for k, v in self.headers if k.lower() == lname]

    def header(self, name: str) -> str | None:
        """The first value of the field ``name``, or ``None``."""
        values = self.header_values(name)
        return values[0] if values else None


@dataclass
class ResponseData:
    """A response: status, header fields (``(name, value)`` pairs) and body bytes."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The first value of the header ``name`` (case-insensitive), or ``None``."""
        lname = name.lower()
        for k, v in self.headers:
            if k.lower() == lname:
                return v
        return None


class UnsendableResponse(Exception):
    """A response that cannot be sent or stored: rolled back, and answered 500 ``internal-error``."""


#: RFC 9110's ``token``: the characters of a header name.
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def header_problem(name: str, value: str) -> str | None:
    """Why a header cannot be sent, or ``None``: the name an RFC 9110 token, the value visible ASCII.

    A value may hold spaces and tabs, and nothing else outside 0x21 to
    0x7E (no CR, LF, NUL or other control character, nothing above 0x7E):
    the part of RFC 9110 that every server of the four languages writes.
    """
    if not name or not set(name) <= _TOKEN:
        return f"the header name {name!r} is not an RFC 9110 token"
    for c in value:
        if not (" " <= c <= "~" or c == "\t"):
            return f"the value of the header {name!r} has the character {c!r}"
    return None


def check_sendable(response: ResponseData) -> None:
    """Raise :class:`UnsendableResponse` for a response a server cannot write as it is.

    The status is 200 to 599; every header passes :func:`header_problem`.
    """
    if not 200 <= response.status <= 599:
        raise UnsendableResponse(f"the status {response.status} is not 200 to 599")
    for name, value in response.headers:
        reason = header_problem(name, value)
        if reason is not None:
            raise UnsendableResponse(reason)
