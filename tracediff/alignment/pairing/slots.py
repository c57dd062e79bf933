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

from ...compare.shapes import squeezed
from ...maps.rules import SlotRules
from ...maps.safety import compiled
from ...trace.model import Node, TensorRecord

TensorPairs = list[tuple[TensorRecord, TensorRecord]]


def _renamed_slot(slot: str, node_a: Node, node_b: Node, rules: SlotRules) -> str:
    for pattern, old, new in rules:
        regex = compiled(pattern)  # checked when the map was read (tracediff.maps.rules)
        if not (regex.search(node_a.relative_path) or regex.search(node_b.relative_path)):
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
