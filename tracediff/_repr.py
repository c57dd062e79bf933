"""Reprs that can be compared across processes: memory addresses masked.

Used where reprs are written (capture) and where they are compared (align),
so it lives below both.
"""

from __future__ import annotations

import re

__all__ = ["sanitize_repr"]

_ADDRESS = re.compile(r"object at 0x[0-9A-Fa-f]+")


def sanitize_repr(text: str) -> str:
    """``text`` with every ``object at 0x...`` address masked as ``object at 0xXXXXXXXX``, so two traces diff."""
    return _ADDRESS.sub("object at 0xXXXXXXXX", text)
