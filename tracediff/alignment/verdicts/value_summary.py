"""Describing how two large non-tensor values differ, in bounded time.

``deepdiff`` describes nested differences well, but its work grows with the
whole value (a 100,000-element list took minutes), and only the first 500
characters of its text are kept. Values with more than
:data:`DEEP_DIFF_LIMIT` items in all (counted without recursion, stopping at
the limit) are described here instead, in one pass: ``"differs (20000
elements, first difference at index 17: 3 vs 4)"``, or the lengths or keys
that differ.
"""

from __future__ import annotations

import reprlib
from typing import Any

#: The most items (list elements, dict entries, at every level) a value may hold to be diffed by deepdiff.
DEEP_DIFF_LIMIT = 2_000
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlevel = 40, 40, 4, 4, 2


def is_large(value: Any, limit: int = DEEP_DIFF_LIMIT) -> bool:
    """True when ``value`` holds more than ``limit`` items in all (counting stops at the limit)."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            count += len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            count += len(item)
            stack.extend(item.values())
        if count > limit:
            return True
    return False


def short(value: Any) -> str:
    return _SHORT.repr(value)


def describe_large(va: Any, vb: Any) -> str:
    """Where two large values first differ (their type, length, first differing index or key)."""
    if type(va) is not type(vb):
        return f"a {type(va).__name__} vs a {type(vb).__name__}"
    if isinstance(va, (list, tuple)):
        first = next((i for i, (x, y) in enumerate(zip(va, vb)) if x != y), None)
        if len(va) != len(vb):
            where = f"; first difference at index {first}" if first is not None else \
                f"; equal up to index {min(len(va), len(vb))}"
            return f"lengths differ: {len(va)} vs {len(vb)} elements{where}"
        if first is None:
            return f"differs ({len(va)} elements)"
        return (f"differs ({len(va)} elements, first difference at index {first}: "
                f"{short(va[first])} vs {short(vb[first])})")
    if isinstance(va, dict):
        only_a = [k for k in va if k not in vb]
        only_b = [k for k in vb if k not in va]
        if only_a or only_b:
            return (f"keys differ ({len(va)} vs {len(vb)} entries; only in A: {short(only_a[:3])}, "
                    f"only in B: {short(only_b[:3])})")
        key = next((k for k in va if va[k] != vb[k]), None)
        return f"differs ({len(va)} entries, first difference at key {short(key)}: {short(va[key])} vs " \
               f"{short(vb[key])})" if key is not None else f"differs ({len(va)} entries)"
    return f"{short(va)} vs {short(vb)}"
