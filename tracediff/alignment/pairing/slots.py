"""Pairing the tensors of two matched module calls.

In order:

1. Slot rules from the map file (``{"slots": [[module_regex, slot_a, slot_b], ...]}``)
   rename A's slots in calls whose relative path (A's, or B's) the regex
   matches; a slot rule also renames the slots nested under it
   (``inputs.args.1`` -> ``inputs.kwargs.position_embeddings.0``). A rule to
   ``""`` (or ``null``) sets the slot aside: neither compared nor unmatched
   (an argument passed only for its dtype, say).
2. Equal slots pair (``inputs.args.0``, ``outputs.0``, ``outputs.logits``). When both traces name the
   parameters of the callee's ``forward`` (metadata ``forward_parameters``), a positional argument goes
   by its parameter's name: A's ``inputs.args.1`` of ``forward(x, mask)`` pairs with B's
   ``inputs.kwargs.mask``, and no longer with B's ``inputs.args.1`` of ``forward(x, cos, sin)``.
3. What is left pairs by value, then in order when shapes agree (dtypes may differ):
   inputs passed by position on one side and by keyword on the other, a tuple
   flattened into separate arguments (``cos, sin`` with
   ``position_embeddings=(cos, sin)``), and a plain tensor output with the
   first element or main field of a tuple, ``ModelOutput`` or dict output
   (``outputs`` with ``outputs.0`` or ``outputs.last_hidden_state``). An argument whose parameter
   the other side's ``forward`` also has (a mask B's forward takes but was not given) pairs only with
   that parameter or on its values, never on its shape alone: it is listed as unpaired instead.

Outputs that transformers' pruning removed from parent calls are not counted
as unpaired.
"""

from __future__ import annotations

import math

from ... import format as fmt
from ...compare.masks import MASKED_AT, kinds_apart
from ...compare.shapes import squeezed
from ...maps.rules import SlotRules
from ...maps.safety import compiled
from ...trace.model import Node, TensorRecord
from .evidence import Values

# the similarity (see tracediff.alignment.pairing.evidence) at which two left-over tensors pair by value
_SAME_VALUES = 0.75

TensorPairs = list[tuple[TensorRecord, TensorRecord]]
#: The parameter names of each side's ``forward`` (``Trace.forward_parameters``), None when unknown.
Parameters = tuple[tuple[str, ...] | None, tuple[str, ...] | None]
_ARGS = "inputs.args."


def _renamed_slot(slot: str, node_a: Node, node_b: Node, rules: SlotRules) -> str:
    for pattern, old, new in rules:
        regex = compiled(pattern)  # checked when the map was read (tracediff.maps.rules)
        if not (regex.search(node_a.relative_path) or regex.search(node_b.relative_path)):
            continue
        if slot == old:
            return new
        if slot.startswith(old + "."):  # a slot's parts go where it goes; set aside with it
            return new + slot[len(old):] if new else ""
    return slot


def inputs_set_aside(node_a: Node, node_b: Node, rules: SlotRules) -> bool:
    """Every input of ``node_a`` is set aside by a slot rule (renamed to ``""``): the call pairs on its outputs."""
    inputs = [t.slot for t in node_a.inputs()]
    return bool(rules and inputs) and all(not _renamed_slot(slot, node_a, node_b, rules) for slot in inputs)


def pair_tensors(node_a: Node, node_b: Node, slots: SlotRules | None = None, values: Values | None = None,
                 parameters: Parameters = (None, None)) -> tuple[TensorPairs, list[TensorRecord], list[TensorRecord]]:
    """Pair the tensors of two matched calls; returns (pairs, only in A, only in B). See the module docstring."""
    names_a, names_b = parameters if parameters[0] is not None and parameters[1] is not None else (None, None)
    by_slot_b = {_named(t.slot, names_b): t for t in node_b.tensors}
    pairs: TensorPairs = []
    left_a: list[TensorRecord] = []
    for t in node_a.tensors:
        renamed = _renamed_slot(t.slot, node_a, node_b, slots) if slots else t.slot
        if not renamed:  # a slot rule to "" (or null): never compared, never unmatched, on either side
            by_slot_b.pop(_named(t.slot, names_b), None)
            continue
        ruled = renamed != t.slot  # a slot rule names B's slot
        key = _named(renamed, names_b if ruled else names_a)
        other = by_slot_b.get(key)
        # an argument slot holds another argument when the sizes differ (whisper's ``xa`` and transformers'
        # ``attention_mask`` are both ``args.1``): it waits for a partner of its size; a slot rule is the
        # user's word, and an output keeps its slot (a size that differs there is the port's bug)
        # a position is no name: a mask and numbers under one position are two arguments (see _kinds_apart)
        if other is not None and (ruled or (_related(t, other, values, node_a.parent is None) and
                                            not (key.startswith(_ARGS) and _kinds_apart(t, other, values)))):
            pairs.append((t, by_slot_b.pop(key)))
        else:
            left_a.append(t)
    left_b = list(by_slot_b.values())
    # an argument whose parameter the other side's forward also has belongs to that parameter: never a
    # partner on shape alone
    claimed = {id(t) for t in left_a if _claimed(t.slot, names_a, names_b)}
    claimed |= {id(t) for t in left_b if _claimed(t.slot, names_b, names_a)}
    for head in ("inputs", "outputs", "grad_outputs", "grad_inputs") if left_a and left_b else ():
        spare_a = [t for t in left_a if t.slot.split(".")[0] == head]
        spare_b = [t for t in left_b if t.slot.split(".")[0] == head]
        found = _masks_alike(spare_a, spare_b)
        used = {id(t) for pair in found for t in pair}
        found += _by_value([t for t in spare_a if id(t) not in used], [t for t in spare_b if id(t) not in used],
                           values) if values is not None else []
        taken_a, taken_b = {id(x) for x, _ in found}, {id(y) for _, y in found}
        taken_a |= claimed
        taken_b |= claimed
        found += _in_order_by_shape([t for t in spare_a if id(t) not in taken_a and not _known_integers(t, values)],
                                    [t for t in spare_b if id(t) not in taken_b and not _known_integers(t, values)],
                                    values)
        for ta, tb in found:
            pairs.append((ta, tb))
            left_a.remove(ta)
            left_b.remove(tb)
    same_slot: dict[str, TensorRecord] = {_named(t.slot, names_b): t for t in left_b}
    for ta in list(left_a):  # arguments that found no partner of their size keep their slot's
        named = _named(ta.slot, names_a)
        partner = same_slot.pop(named, None)
        if partner is None:
            continue
        if (values is None or not (_known_integers(ta, values) or _known_integers(partner, values))) and \
                not (named.startswith(_ARGS) and _kinds_apart(ta, partner, values)):
            pairs.append((ta, partner))
            left_a.remove(ta)
            left_b.remove(partner)
    if (left_a or left_b) and not (node_a.has_outputs and node_b.has_outputs):  # pruned outputs: not a mismatch
        left_a = [t for t in left_a if not t.slot.startswith("outputs")]
        left_b = [t for t in left_b if not t.slot.startswith("outputs")]
    return pairs, left_a, left_b


def _named(slot: str, parameters: tuple[str, ...] | None) -> str:
    """``inputs.args.N...`` under its parameter's name (``inputs.kwargs.mask...``) when ``parameters`` names it."""
    if parameters is None or not slot.startswith(_ARGS):
        return slot
    index, _, rest = slot[len(_ARGS):].partition(".")
    name = fmt.positional_parameter(parameters, int(index)) if index.isdigit() else None
    if name is None:
        return slot
    return f"inputs.kwargs.{name}.{rest}" if rest else f"inputs.kwargs.{name}"


def _claimed(slot: str, own: tuple[str, ...] | None, other: tuple[str, ...] | None) -> bool:
    """Is this argument one of the other side's parameters, by name (so it may pair only with that one)?"""
    if own is None or other is None or not slot.startswith("inputs."):
        return False
    named = _named(slot, own)
    if not named.startswith("inputs.kwargs."):
        return False
    return named[len("inputs.kwargs."):].split(".")[0] in other


def _related(x: TensorRecord, y: TensorRecord, values: Values | None, root: bool) -> bool:
    """Can two tensors under one slot name be the same? Outputs and the model's own inputs always are. Other
    arguments are not when their sizes differ, nor when they hold integers (ids, positions) that differ:
    integers carry no rounding noise, and a bug upstream does not change them (transformer-lens's
    ``pos_embed`` takes the tokens, GPT-2's ``wpe`` the positions)."""
    if x.shape is None or y.shape is None or root or not x.slot.startswith("inputs"):
        return True
    if math.prod(x.shape) != math.prod(y.shape):
        return False
    if values is not None and _integers(x) and _integers(y) and values.stats(x, "a") and values.stats(y, "b"):
        return values.similarity(x, y) == 1.0
    return True


def _kinds_apart(x: TensorRecord, y: TensorRecord, values: Values | None) -> bool:
    """One a mask, the other numbers (``compare.masks.kinds_apart``): never a pair on their slot or shape."""
    stats_x = (values.stats(x, "a") if values is not None else None) or x.stats
    stats_y = (values.stats(y, "b") if values is not None else None) or y.stats
    return kinds_apart(x.dtype, stats_x, y.dtype, stats_y)


def _known_integers(record: TensorRecord, values: Values | None) -> bool:
    """Integers whose values are known: they pair by value only, never by shape alone."""
    return values is not None and _integers(record) and any(k in record.stats for k in ("min", "mean"))


def _integers(record: TensorRecord) -> bool:
    return "int" in (record.dtype or "") or record.dtype in ("torch.bool", "bool")


def _masked_fractions(record: TensorRecord) -> set[float]:
    """The share of positions an attention mask masks, in each convention its statistics allow (a boolean:
    keep or drop; an additive mask: 0 and at most -1e4); empty for anything else."""
    stats, numel = record.stats, record.stats.get("numel")
    zeros, low, high = stats.get("zeros"), stats.get("min"), stats.get("max")
    if not isinstance(numel, (int, float)) or not numel or not isinstance(zeros, (int, float)):
        return set()
    kept = zeros / numel
    if record.dtype in ("torch.bool", "bool"):
        return {kept, 1.0 - kept}
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and high == 0 and low <= MASKED_AT:
        return {1.0 - kept}
    return set()


def _masks_alike(spare_a: list[TensorRecord], spare_b: list[TensorRecord]) -> TensorPairs:
    """Attention masks in other conventions (a boolean keep-mask, an additive mask) that mask the same share
    of positions, of one size or broadcast: value evidence that statistics-based similarity cannot see
    (their values differ everywhere a position is masked). Each tensor at most once, in recorded order."""
    out: TensorPairs = []
    used: set[int] = set()
    fractions_b = [_masked_fractions(y) for y in spare_b]
    for x in spare_a:
        fractions = _masked_fractions(x)
        if not fractions or x.shape is None:
            continue
        for y, fractions_y in zip(spare_b, fractions_b):
            if id(y) in used or y.shape is None or (x.dtype == y.dtype):
                continue
            if any(abs(f - g) < 1e-9 for f in fractions for g in fractions_y) and \
                    _broadcastable(squeezed(x.shape), squeezed(y.shape)):
                out.append((x, y))
                used.add(id(y))
                break
    return out


def _broadcastable(x: tuple[int, ...], y: tuple[int, ...]) -> bool:
    return all(p == q or p == 1 or q == 1 for p, q in zip(reversed(x), reversed(y)))


def _by_value(spare_a: list[TensorRecord], spare_b: list[TensorRecord], values: Values) -> TensorPairs:
    """Pairs whose values agree (statistics), the closest first; each tensor at most once."""
    scored = sorted(((values.similarity(x, y), i, j) for i, x in enumerate(spare_a) for j, y in enumerate(spare_b)),
                    key=lambda item: (-item[0], item[1], item[2]))
    out: TensorPairs = []
    used_a: set[int] = set()
    used_b: set[int] = set()
    for score, i, j in scored:
        if score < _SAME_VALUES:
            break
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            out.append((spare_a[i], spare_b[j]))
    return out


def _in_order_by_shape(spare_a: list[TensorRecord], spare_b: list[TensorRecord], values: Values | None
                       ) -> TensorPairs:
    """Each of A's tensors with the next of B's, in recorded order, whose shape is the same.

    A second pass pairs what is left when the shapes agree once dimensions of
    size 1 are dropped (nanoGPT's position ids ``[T]`` against ``[1, T]``). A mask never pairs with numbers
    here: a rotary table ``[T, D]`` is not a mask ``[1, 1, T, T]`` because ``T == D``.
    """
    out: TensorPairs = []
    for same in (lambda x, y: x == y, lambda x, y: squeezed(x) == squeezed(y)):
        used_b = {id(tb) for _, tb in out}
        used_a = {id(ta) for ta, _ in out}
        left_b = [tb for tb in spare_b if id(tb) not in used_b]
        start = 0
        for ta in (t for t in spare_a if id(t) not in used_a):
            for j in range(start, len(left_b)):
                if ta.shape is not None and left_b[j].shape is not None and same(ta.shape, left_b[j].shape) \
                        and not _kinds_apart(ta, left_b[j], values):
                    out.append((ta, left_b[j]))
                    start = j + 1
                    break
    return out
