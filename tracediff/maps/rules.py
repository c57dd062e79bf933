"""Rename maps: what ``align(map=...)``, ``replay(map=...)`` and the command line's ``--map`` accept, read once.

A map is one JSON object::

    {"rename": [["blocks\\.(\\d+)", "layers.\\1"], ...],          # A's module paths -> B's, in order (re.sub)
     "slots": [["attn$", "inputs.args.1", "inputs.kwargs.position_embeddings.0"], ...]}

``rename`` rules are applied in order to A's module paths (relative to the
root) before calls are paired by name. ``slots`` rules rename the tensor
slots of A's calls whose path (A's or B's) matches the regex; a rule to
``""`` (or ``null``) sets a slot aside. Other keys (a suggested map's
``layout``) are left to whoever reads them, never refused.

:func:`read_map` takes any of the forms of :data:`MapSpec`: ``None`` (no
rules), a list of ``(regex, replacement)`` rename rules, the object itself (a
mapping), or the path of a JSON file holding it. A file is read once, through
:func:`tracediff.files.confine.read_bounded` (a regular file of at most
``SMALL_JSON_LIMIT`` bytes), and every regex is checked by
:mod:`tracediff.maps.safety` (it compiles and cannot backtrack exponentially)
before it is used.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError, UsageError
from ..files.confine import SMALL_JSON_LIMIT, read_bounded
from .safety import check_rule, compiled

RenameRules = list[tuple[str, str]]
SlotRules = list[tuple[str, str, str]]

MapSpec = RenameRules | list[list[str]] | Mapping[str, Any] | str | os.PathLike[str] | None
"""A list of ``(regex, replacement)`` rules, a map object (``{"rename": [...], "slots": [...]}``), or a path to a
JSON map file."""


@dataclass(frozen=True)
class RenameMap:
    """The validated rules of one map: module-path renames and tensor-slot renames, in order."""

    rename: tuple[tuple[str, str], ...] = ()
    slots: tuple[tuple[str, str, str], ...] = ()


def read_map(spec: Any) -> RenameMap:
    """The rules of ``spec`` in any of the forms of :data:`MapSpec`, validated (``UsageError`` otherwise)."""
    if spec is None:
        return RenameMap()
    if isinstance(spec, (str, os.PathLike)):
        path = Path(os.fspath(spec))
        data = load_map_file(path)
        rules = data.get("rename") if isinstance(data, dict) else None
        if not isinstance(rules, list):
            raise TraceFormatError(f'{path}: expected {{"rename": [[regex, replacement], ...]}}')
        return RenameMap(tuple(check_rename(rules, source=str(path))), tuple(check_slots(data.get("slots"))))
    if isinstance(spec, Mapping):
        rules = spec.get("rename", [])
        if not isinstance(rules, (list, tuple)):
            raise UsageError(f'rename: the "rename" entry is {type(rules).__name__}; '
                             "expected a list of [regex, replacement]")
        return RenameMap(tuple(check_rename(rules, source="rename")), tuple(check_slots(spec.get("slots"))))
    if isinstance(spec, (list, tuple)):
        return RenameMap(tuple(check_rename(spec, source="rename")))
    raise UsageError(f"rename: got {type(spec).__name__}; expected a list of [regex, replacement] rules, "
                     '{"rename": [...]} or the path of a JSON map file')


def load_map_file(path: str | Path) -> Any:
    """The JSON value of a map file: the one place a map file is read (bounded, a regular file)."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise UsageError(f"{p}: rename map not found")
    text = read_bounded(p, limit=SMALL_JSON_LIMIT, what="rename map")  # a regular file, bounded
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deeply, a 5,000-digit integer
        reason = str(e).splitlines()[0] if str(e) else "nested too deeply"
        raise TraceFormatError(f"{p}: not a JSON rename map ({reason})") from None


def rename_rules(spec: Any) -> RenameRules:
    """The rename rules of ``spec`` (any form of :data:`MapSpec`), validated."""
    return list(read_map(spec).rename)


def slot_rules(spec: Any) -> SlotRules:
    """The slot rules of ``spec`` (any form of :data:`MapSpec`), validated; ``[]`` when it has none."""
    return list(read_map(spec).slots)


def load_rename_file(path: str | Path) -> RenameRules:
    """Read ``{"rename": [[regex, replacement], ...]}`` from a JSON file."""
    return rename_rules(Path(path))


def check_rename(rules: Any, *, source: str = "rename") -> RenameRules:
    """Validate rename rules: a list of ``[regex, replacement]`` pairs whose regexes compile."""
    out: RenameRules = []
    for i, rule in enumerate(rules or []):
        if not (isinstance(rule, (list, tuple)) and len(rule) == 2 and all(isinstance(x, str) for x in rule)):
            raise UsageError(f"{source}: rule {i} is {rule!r}; expected [regex, replacement]")
        check_rule(rule[0], rule[1], source=source, index=i)  # compiles, cannot backtrack exponentially
        out.append((rule[0], rule[1]))
    return out


def check_slots(rules: Any) -> SlotRules:
    """Validate a map's ``slots`` entry: ``[[module_regex, slot_a, slot_b], ...]`` (``slot_b`` null means ``""``)."""
    if rules is None:
        return []
    if not isinstance(rules, (list, tuple)):
        raise UsageError('map: "slots" must be a list of [module_regex, slot_a, slot_b]')
    out: SlotRules = []
    for i, rule in enumerate(rules):
        if isinstance(rule, (list, tuple)) and len(rule) == 3 and rule[2] is None:
            rule = [rule[0], rule[1], ""]
        if not (isinstance(rule, (list, tuple)) and len(rule) == 3 and all(isinstance(x, str) for x in rule)):
            raise UsageError(f"map: slot rule {i} is {rule!r}; expected [module_regex, slot_a, slot_b]")
        try:
            compiled(rule[0])
        except re.error as e:
            raise UsageError(f"map: slot rule {i} regex {rule[0]!r} does not compile ({e})") from None
        check_rule(rule[0], "", source="map: slots", index=i)  # and cannot backtrack exponentially
        out.append((rule[0], rule[1], rule[2]))
    return out


def apply_rename(path: str, rules: RenameRules) -> str:
    """``path`` with every rule applied in order (each regex compiled once, see :mod:`tracediff.maps.safety`)."""
    for pattern, replacement in rules:
        regex = compiled(pattern)
        if regex.search(path) is not None:  # sub() parses its template first, through a cache of 512 only
            path = regex.sub(replacement, path)
    return path


class _Unset:
    """The default of a deprecated keyword: tells "not given" from ``None``."""

    def __repr__(self) -> str:
        return "<not given>"


_UNSET: Any = _Unset()


def map_argument(map: Any, rename: Any, *, stacklevel: int = 3) -> Any:
    """The map a library call was given: ``map=``, or the older ``rename=`` with a ``DeprecationWarning``.

    ``rename=`` was the library's name for what the command line calls ``--map``; it keeps working until
    tracediff 0.4. Giving both is a ``UsageError``.
    """
    if rename is _UNSET:
        return map
    if map is not None:
        raise UsageError("map= and rename= name the same thing; pass map= only")
    warnings.warn("rename= is deprecated and will be removed in tracediff 0.4; pass map= (the same forms: "
                  "rules, a map object or the path of a map file)", DeprecationWarning, stacklevel=stacklevel)
    return rename
