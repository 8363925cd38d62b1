"""The request and response as the library sees them, independent of any framework."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["RequestData", "ResponseData"]


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
