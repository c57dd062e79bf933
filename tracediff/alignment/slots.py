"""Pairing the tensors of two matched module calls.

In order:

1. Slot rules from the map file (``{"slots": [[module_regex, slot_a, slot_b], ...]}``)
   rename A's slots in calls whose relative path (A's, or B's) the regex
   matches; a slot rule also renames the slots nested under it
   (``inputs.args.1`` -> ``inputs.kwargs.position_embeddings.0``). A rule to
   ``""`` (or ``null``) sets the slot aside: neither compared nor unmatched
   (an argument passed only for its dtype, say).
2. Equal slots pair (``inputs.args.0``, ``outputs.0``, ``outputs.logits``).
3. What is left pairs in order when shapes agree (dtypes may differ):
   inputs passed by position on one side and by keyword on the other, a tuple
   flattened into separate arguments (``cos, sin`` with
   ``position_embeddings=(cos, sin)``), and a plain tensor output with the
   first element or main field of a tuple, ``ModelOutput`` or dict output
   (``outputs`` with ``outputs.0`` or ``outputs.last_hidden_state``).

Outputs that transformers' pruning removed from parent calls are not counted
as unpaired.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..trace.model import Node, TensorRecord
from .shapes import squeezed

SlotRules = list[tuple[str, str, str]]
TensorPairs = list[tuple[TensorRecord, TensorRecord]]


def slot_rules(spec: Any) -> SlotRules:
    """The ``slots`` entry of a map (a mapping, or the path of a JSON map file), validated; ``[]`` when absent."""
    if isinstance(spec, (str, Path)):
        import json

        try:
            spec = json.loads(Path(spec).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []  # the rename reader reports unreadable map files
    if not isinstance(spec, Mapping):
        return []
    rules = spec.get("slots") or []
    if not isinstance(rules, (list, tuple)):
        raise UsageError('map: "slots" must be a list of [module_regex, slot_a, slot_b]')
    out: SlotRules = []
    for i, rule in enumerate(rules):
        if isinstance(rule, (list, tuple)) and len(rule) == 3 and rule[2] is None:
            rule = [rule[0], rule[1], ""]
        if not (isinstance(rule, (list, tuple)) and len(rule) == 3 and all(isinstance(x, str) for x in rule)):
            raise UsageError(f"map: slot rule {i} is {rule!r}; expected [module_regex, slot_a, slot_b]")
        try:
            re.compile(rule[0])
        except re.error as e:
            raise UsageError(f"map: slot rule {i} regex {rule[0]!r} does not compile ({e})") from None
        out.append((rule[0], rule[1], rule[2]))
    return out


def _renamed_slot(slot: str, node_a: Node, node_b: Node, rules: SlotRules) -> str:
    for pattern, old, new in rules:
        if not (re.search(pattern, node_a.relative_path) or re.search(pattern, node_b.relative_path)):
            continue
        if slot == old:
            return new
        if slot.startswith(old + "."):
            return new + slot[len(old):]
    return slot


def pair_tensors(node_a: Node, node_b: Node, slots: SlotRules | None = None
                 ) -> tuple[TensorPairs, list[TensorRecord], list[TensorRecord]]:
    """Pair the tensors of two matched calls; returns (pairs, only in A, only in B). See the module docstring."""
    by_slot_b = {t.slot: t for t in node_b.tensors}
    pairs: TensorPairs = []
    left_a: list[TensorRecord] = []
    for t in node_a.tensors:
        renamed = _renamed_slot(t.slot, node_a, node_b, slots) if slots else t.slot
        if not renamed:  # a slot rule to "" (or null): never compared, never unmatched, on either side
            by_slot_b.pop(t.slot, None)
            continue
        other = by_slot_b.pop(renamed, None)
        if other is not None:
            pairs.append((t, other))
        else:
            left_a.append(t)
    left_b = list(by_slot_b.values())
    for head in ("inputs", "outputs", "grad_outputs", "grad_inputs") if left_a and left_b else ():
        spare_a = [t for t in left_a if t.slot.split(".")[0] == head]
        spare_b = [t for t in left_b if t.slot.split(".")[0] == head]
        for ta, tb in _in_order_by_shape(spare_a, spare_b):
            pairs.append((ta, tb))
            left_a.remove(ta)
            left_b.remove(tb)
    if (left_a or left_b) and not (node_a.has_outputs and node_b.has_outputs):  # pruned outputs: not a mismatch
        left_a = [t for t in left_a if not t.slot.startswith("outputs")]
        left_b = [t for t in left_b if not t.slot.startswith("outputs")]
    return pairs, left_a, left_b


def _in_order_by_shape(spare_a: list[TensorRecord], spare_b: list[TensorRecord]) -> TensorPairs:
    """Each of A's tensors with the next of B's, in recorded order, whose shape is the same.

    A second pass pairs what is left when the shapes agree once dimensions of
    size 1 are dropped (nanoGPT's position ids ``[T]`` against ``[1, T]``).
    """
    out: TensorPairs = []
    for same in (lambda x, y: x == y, lambda x, y: squeezed(x) == squeezed(y)):
        used_b = {id(tb) for _, tb in out}
        used_a = {id(ta) for ta, _ in out}
        left_b = [tb for tb in spare_b if id(tb) not in used_b]
        start = 0
        for ta in (t for t in spare_a if id(t) not in used_a):
            for j in range(start, len(left_b)):
                if ta.shape is not None and left_b[j].shape is not None and same(ta.shape, left_b[j].shape):
                    out.append((ta, left_b[j]))
                    start = j + 1
                    break
    return out
