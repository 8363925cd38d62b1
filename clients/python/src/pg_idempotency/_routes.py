"""Path templates of the frameworks, as doc/clients.md's default operation spells them."""

from __future__ import annotations

import re

_ANGLE = re.compile(r"<(?:[^<>:]+:)?([^<>:]+)>")


def angle_template(route: str) -> str:
    """``payments/<int:pk>`` (Django, Flask) as ``/payments/{pk}``."""
    path = _ANGLE.sub(r"{\1}", route)
    return path if path.startswith("/") else "/" + path
