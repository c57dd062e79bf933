"""Rename rules inferred from pairs of module calls, for the user to check and pass back with ``--map``.

Rules are derived parents first, each on A's path as renamed by the rules
found so far, so a renaming is written once and covers everything below it:
``blocks.0 -> layers.0`` gives ``^blocks(?=\\.|$) -> layers``, then
``blocks.0.attn -> layers.0.self_attn`` gives
``^(layers\\.\\d+\\.)attn(?=\\.|$) -> \\1self_attn``. The common prefix is kept
in the pattern with every layer number as ``\\d+``, so one rule covers every
layer; only the components that differ are renamed. A pair whose layer
numbers differ (``layers.3 -> layers.1``) gets a rule for that one path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..trace.model import Node
from .rules import apply_rename

Rules = list[tuple[str, str]]

_NUMBER = re.compile(r"\d+")


def suggest_rules(pairs: Iterable[tuple[Node, Node]], unpaired_a: Iterable[str] = (),
                  paths_b: Iterable[str] = ()) -> Rules:
    """The fewest rules, in order, that map A's relative path onto B's for every pair (see the module docstring).

    ``unpaired_a`` (relative paths of A's calls left unpaired) and ``paths_b`` (every relative path of B's
    calls) keep a call the pairing left alone from taking a B call's name through a rule written for its
    parent or child (``transformer.h.0.mlp`` renamed ``blocks.0.mlp`` by ``transformer.h -> blocks``): a
    first rule renames it ``transformer.h.N.mlp (unpaired)``, which no B call is named.
    """
    by_depth = sorted(pairs, key=lambda p: (p[0].relative_path.count(".") if p[0].relative_path else -1,
                                            p[0].enter_order))
    ordered = [(a.relative_path, b.relative_path) for a, b in by_depth]
    rules: Rules = []
    for path_a, path_b in ordered:
        current = apply_rename(path_a, rules)
        if current == path_b:
            continue
        rule = _rule(current, path_b)
        if rule not in rules:
            rules.append(rule)
    rules = _repair(ordered, rules)
    names_b = set(paths_b)
    for path_a in unpaired_a:
        current = apply_rename(path_a, rules)
        if current == path_a or current not in names_b or not current:
            continue
        own = [_own_name(path_a), *rules]  # first, on A's own path: later rules cannot make it B's name again
        if apply_rename(path_a, own) not in names_b and all(apply_rename(a, own) == b for a, b in ordered):
            rules = own
    return rules


def any_layer(parts: list[str], *, capture: bool = False) -> str:
    """A regex for path components ``parts`` with every layer number as ``\\d+`` (as a group: ``capture``)."""
    number = r"(\d+)" if capture else r"\d+"
    return r"\.".join(number if part.isdigit() else re.escape(part) for part in parts)


UNPAIRED = " (unpaired)"  # what a suggested map appends to the name of a call it keeps from a B call's name


def _own_name(path_a: str) -> tuple[str, str]:
    """A rule renaming ``path_a``, in every instance (its layer numbers as groups), to itself + ``UNPAIRED``."""
    parts = path_a.split(".")
    pattern = "^" + any_layer(parts, capture=True) + "$"
    groups = iter(range(1, len(parts) + 1))
    replacement = ".".join(f"\\{next(groups)}" if part.isdigit() else part.replace("\\", "\\\\")
                           for part in parts)
    return pattern, replacement + UNPAIRED


def _rule(path_a: str, path_b: str) -> tuple[str, str]:
    parts_a = path_a.split(".") if path_a else []
    parts_b = path_b.split(".") if path_b else []
    prefix = 0
    while prefix < min(len(parts_a), len(parts_b)) and parts_a[prefix] == parts_b[prefix]:
        prefix += 1
    suffix = 0
    while (suffix < min(len(parts_a), len(parts_b)) - prefix
           and parts_a[-1 - suffix] == parts_b[-1 - suffix]):
        suffix += 1
    middle_a = parts_a[prefix:len(parts_a) - suffix]
    middle_b = parts_b[prefix:len(parts_b) - suffix]
    if not middle_a and suffix:  # B only adds levels: rename the next component into them and it
        middle_a, middle_b = [parts_a[prefix]], middle_b + [parts_a[prefix]]
    elif not middle_a and prefix:
        middle_a, middle_b, prefix = [parts_a[prefix - 1]], [parts_a[prefix - 1]] + middle_b, prefix - 1
    head = parts_a[:prefix]
    generic_head = any_layer(head)
    old = re.escape(".".join(middle_a))
    if not middle_b:  # a level removed: the dot next to it goes too
        if head:
            return f"^({generic_head})\\.{old}(?=\\.|$)", r"\1"
        return f"^{old}(?:\\.|$)", ""
    new = ".".join(middle_b).replace("\\", "\\\\")
    if head:
        # \g<1>, not \1, when the new text starts with a digit (\10 would mean group 10)
        return f"^({generic_head}\\.){old}(?=\\.|$)", (r"\g<1>" if new[:1].isdigit() else r"\1") + new
    return f"^{old}(?=\\.|$)", new


def _repair(ordered: list[tuple[str, str]], rules: Rules) -> Rules:
    """Exact rules, at the end, for any pair a later rule disturbed (rare: overlapping renamings)."""
    out = list(rules)
    for path_a, path_b in ordered:
        current = apply_rename(path_a, out)
        if current != path_b:
            out.append(("^" + re.escape(current) + "$", path_b.replace("\\", "\\\\")))
    return out
