"""Rename rules that cannot hang ``align``: checked when read, compiled once.

Python's ``re`` has no timeout, and a backtracking regex such as
``^([a-z0-9_.]+)+!$`` takes exponential time on a long module path that
almost matches. A rename map may come from someone else, so every rule is
checked before it is used:

* the regex must compile (``re.error``, and ``OverflowError`` from a repeat
  count such as ``a{4294967295}``, become one-line ``UsageError``\\ s);
* **nested quantifiers are refused**: a ``*``, ``+`` or ``{n,}`` applied to
  a group that itself contains a quantifier of variable count (``(a+)+``,
  ``(\\w*\\.)*``, ``(a{1,3})+``).
  These are the patterns that backtrack exponentially. The message says how
  to write the same rule safely: make the inner quantifier possessive
  (``a++``) or wrap it in an atomic group (``(?>a+)``), both of which never
  backtrack (Python 3.11+), or match one path component at a time
  (``[^.]+``);
* the replacement must be valid for the regex (no reference to a group the
  regex lacks, no trailing backslash).

Rules are compiled once per pattern (``compiled``) rather than through
``re``'s own cache of 512 entries, which a map of more rules would thrash.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from ..errors import UsageError

try:  # Python 3.11+: the parser moved here
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older Pythons
    import sre_parse as _sre_parse  # type: ignore[no-redef, unused-ignore]

_REPEATS = {name for name in ("MAX_REPEAT", "MIN_REPEAT") if hasattr(_sre_parse, name)}
_SAFE_WRAPPERS = {name for name in ("POSSESSIVE_REPEAT", "ATOMIC_GROUP") if hasattr(_sre_parse, name)}
_UNBOUNDED = getattr(_sre_parse, "MAXREPEAT", 1 << 32)
#: A repeat with more possible iterations than this counts as unbounded.
_LARGE_REPEAT = 100


@functools.cache
def compiled(pattern: str) -> re.Pattern[str]:
    """``re.compile(pattern)``, once per pattern for the life of the process."""
    return re.compile(pattern)


def _items(parsed: Any) -> list[tuple[str, Any]]:
    return [(str(op), av) for op, av in parsed]


def _any_repeat(parsed: Any, flagged: Callable[[int, int, Any], bool]) -> bool:
    """True when a backtracking repeat ``(low, high, sub)`` somewhere in ``parsed`` is ``flagged``.

    Possessive repeats and atomic groups are skipped: nothing backtracks into them.
    """
    stack = [parsed]
    while stack:
        for op, av in _items(stack.pop()):
            if op in _SAFE_WRAPPERS:
                continue
            if op in _REPEATS:
                low, high, sub = av
                if flagged(low, high, sub):
                    return True
                stack.append(sub)
            elif op == "SUBPATTERN":
                stack.append(av[-1])
            elif op == "BRANCH":
                stack.extend(av[1])
            elif op in ("ASSERT", "ASSERT_NOT"):
                stack.append(av[1])
    return False


def _has_variable_repeat(parsed: Any) -> bool:
    """True when ``parsed`` (a parsed subpattern) contains a backtracking repeat of variable count."""
    # a variable count: (a{1,3})+ splits a run of a's many ways too
    return _any_repeat(parsed, lambda low, high, sub: high > low and high > 1)


def nested_quantifier(pattern: str) -> bool:
    """True when ``pattern`` repeats without bound a group that itself repeats without bound (see above)."""
    return _any_repeat(_sre_parse.parse(pattern), lambda low, high, sub: (
        (high == _UNBOUNDED or high > _LARGE_REPEAT) and _has_variable_repeat(sub)))


def check_rule(pattern: str, replacement: str, *, source: str, index: int) -> None:
    """Raise ``UsageError`` naming ``source`` and the rule when it could fail or hang (see the module docstring)."""
    where = f"{source}: rule {index} regex {pattern!r}"
    try:
        regex = compiled(pattern)
    except re.error as e:
        raise UsageError(f"{where} does not compile ({e})") from None
    except (OverflowError, RecursionError, ValueError, MemoryError) as e:
        raise UsageError(f"{where} does not compile ({type(e).__name__}: {e})") from None
    try:
        nested = nested_quantifier(pattern)
    except (re.error, OverflowError, RecursionError, ValueError):
        nested = True
    if nested:
        raise UsageError(f"{where} nests unbounded quantifiers (like (a+)+), which can take exponential time; "
                         "make the inner one possessive (a++) or atomic ((?>a+)), or match one path component "
                         "at a time ([^.]+)")
    try:
        _check_template(regex, replacement)
    except (re.error, IndexError, ValueError) as e:
        raise UsageError(f"{source}: rule {index} replacement {replacement!r} is not valid for {pattern!r} "
                         f"({e})") from None


def _check_template(regex: re.Pattern[str], replacement: str) -> None:
    compile_template = getattr(re, "_compile_template", None)
    if compile_template is not None:  # Python 3.12+
        compile_template(regex, replacement)
    else:
        _sre_parse.parse_template(replacement, regex)
