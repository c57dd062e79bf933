"""Globs over module paths, in transformers' convention (its ``tp_plan``: ``model.layers.*.self_attn.q_proj``).

A path is split at its dots into segments; a pattern is matched segment by segment:

* ``*`` matches any run of characters inside one segment, never a dot:
  ``model.layers.*`` matches ``model.layers.3``, not ``model.layers.3.mlp``;
  ``layers.*.mlp`` matches ``layers.0.mlp``; ``*_proj`` matches ``q_proj``.
* ``?`` matches one character other than a dot; ``[seq]`` and ``[!seq]`` one
  character in (or not in) ``seq``, as in ``fnmatch``.
* ``**`` as a whole segment matches any number of segments, none included:
  ``model.**`` matches ``model``, ``model.norm`` and ``model.layers.0.mlp``;
  ``**.q_proj`` matches every ``q_proj`` at any depth; ``a.**.b`` matches
  ``a.b`` and ``a.x.y.b``. Elsewhere (``x**``) it is two ``*``.
* Anything else matches itself; the whole path must match (case-sensitive).

Where a tracediff option selects a module *and what is under it* (tolerance
overrides, ``--ignore``), a pattern ``P`` applies to the paths ``P.**``
matches (:func:`covers`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache

__all__ = ["covers", "matcher", "matches", "matches_any"]

_SEGMENT = "[^.]*"


def _segment(text: str) -> str:
    """The regular expression of one segment (no dots in it): ``*``, ``?`` and ``[...]`` stay inside it."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        i += 1
        if c == "*":
            out.append(_SEGMENT)
        elif c == "?":
            out.append("[^.]")
        elif c == "[":
            j = i + 1 if i < len(text) and text[i] == "!" else i
            j = j + 1 if j < len(text) and text[j] == "]" else j  # a ']' first is part of the set
            end = text.find("]", j)
            if end < 0:
                out.append(re.escape(c))
                continue
            body = text[i:end]
            i = end + 1
            negated = body.startswith("!")
            chars = body[1:] if negated else body
            escaped = re.escape(chars).replace(r"\-", "-")  # keep ranges such as 0-9
            out.append(f"[^.{escaped}]" if negated else f"[{escaped}]")
        else:
            out.append(re.escape(c))
    return "".join(out)


def _translate(pattern: str) -> str:
    """The regular expression of a whole pattern (see the module docstring)."""
    segments: list[str] = []
    for segment in pattern.split("."):
        if not (segment == "**" and segments[-1:] == ["**"]):  # "**.**" is "**"
            segments.append(segment)
    if segments == ["**"]:
        return ".*"
    parts: list[str] = []
    for i, segment in enumerate(segments):
        if segment == "**":
            # none or more segments: before the rest ("x." each) when first, after what precedes (".x") otherwise
            parts.append(f"(?:{_SEGMENT}\\.)*" if i == 0 else f"(?:\\.{_SEGMENT})*")
            continue
        leading = i > 0 and not (i == 1 and segments[0] == "**")
        parts.append(("\\." if leading else "") + _segment(segment))
    return "".join(parts)


@lru_cache(maxsize=4096)
def matcher(pattern: str) -> Callable[[str], bool]:
    """``path -> bool`` for ``pattern``, compiled once; a pattern without wildcards is a plain comparison."""
    if not any(c in pattern for c in "*?["):
        return pattern.__eq__
    compiled = re.compile(_translate(pattern), re.DOTALL)
    return lambda path: compiled.fullmatch(path) is not None


def matches(path: str, pattern: str) -> bool:
    """Does module ``path`` match ``pattern`` (``*`` one segment, ``**`` any number)?"""
    return matcher(pattern)(path)


def matches_any(path: str, patterns: Iterable[str]) -> bool:
    """Does ``path`` match one of ``patterns``?"""
    return any(matcher(p)(path) for p in patterns)


def covers(pattern: str, path: str) -> bool:
    """Is ``path`` the module ``pattern`` names or under one (``pattern.**``, which matches ``pattern`` too)?"""
    return matches(path, f"{pattern}.**")
