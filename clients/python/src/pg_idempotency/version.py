"""The extension version check done at start-up."""

from __future__ import annotations

__all__ = ["MINIMUM_VERSION", "VERSION_SQL", "ExtensionVersionError", "parse_version", "require_version"]

#: The first release with the ``scope`` and ``ttl`` arguments the library uses.
MINIMUM_VERSION = "0.2.0"

#: The query of the check.
VERSION_SQL = "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'"


class ExtensionVersionError(RuntimeError):
    """The ``idempotency`` extension is missing from the database or older than 0.2.0."""


def parse_version(version: str) -> tuple[int, ...]:
    """``"0.2.0"`` as ``(0, 2, 0)``; a suffix after the digits of a part is ignored."""
    parts: list[int] = []
    for part in version.split("."):
        digits = ""
        for c in part:
            if not c.isdigit():
                break
            digits += c
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def require_version(found: str | None) -> str:
    """Return ``found`` when it is at least :data:`MINIMUM_VERSION`; else raise :class:`ExtensionVersionError`."""
    if found is None:
        raise ExtensionVersionError(
            "pg_idempotency: the idempotency extension is not installed in this database "
            f"(CREATE EXTENSION idempotency; version {MINIMUM_VERSION} or later is needed)"
        )
    if parse_version(found) < parse_version(MINIMUM_VERSION):
        raise ExtensionVersionError(
            f"pg_idempotency: the idempotency extension is version {found}, older than {MINIMUM_VERSION} "
            f"(ALTER EXTENSION idempotency UPDATE)"
        )
    return found
