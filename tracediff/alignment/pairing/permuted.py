"""Outputs holding the same values in another order inside their last dimension, decided once per structure.

Meta-to-transformers conversions of rotary models permute the rows of ``q_proj`` and ``k_proj`` within each
head (torchtune's ``tune_to_hf``, transformers' ``convert_llama_weights_to_hf``): rotary pairs that sit
side by side (``x0 x1 x2 x3 ...``) on one side sit in two halves (``x0 x2 ... x1 x3 ...``) on the other.
The outputs then hold the same values in another order, shapes equal, and compare as a divergence.

An output of a paired call whose comparison failed, whose values agree once sorted and do not fit as
recorded, is tried against both orders for every even head size that divides its last dimension. The
order is then decided **once for every instance of a repeated structure** (``layers.N.self_attn.q_proj``),
by the instances whose enclosing call's outputs agree (they witness that the order is the port's layout,
not its bug); without such a witness, by the instances the order fits. Every instance is then compared
under that order, so a layer converted without the permutation, among layers converted with it, is the
divergence, named at that layer.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from ...trace.graph_scopes import GRAPH_BLOCK
from ...trace.load import Trace
from ...trace.model import Node, TensorRecord
from ...trace.vocabulary import GraphVocabulary
from ..pair import MatchedBy, Pair
from ..result import TensorComparison
from .evidence import Values
from .layout import RelativeError, Transform, _load, any_instance

# relative error under which an order fits the values (a bf16 port stays well under it)
_FITS = 2e-2
# a pair correlated this well as recorded is in the same order: rotary partners swapped leave a pcc near that
# of two unrelated features (q_proj's, about 0), and a port's noise leaves it above 0.9999
_CORRELATED = 0.999
# pairs whose rows are searched for another order even when they fit or correlate as recorded: those whose calls
# a map, structure, layout or an output paired (what the rows of pairs not found by name have always been)
_SEARCHED = frozenset({MatchedBy.MAP, MatchedBy.STRUCTURE, MatchedBy.LAYOUT, MatchedBy.OUTPUT})
_SAMPLE = 1 << 14  # elements of the first rows every order is tried on before the whole tensor


def pair_orders(shape: tuple[int, ...]) -> list[Transform]:
    """Side-by-side pairs to halves and back, per head, for every even head size dividing the last dimension."""
    if not shape or shape[-1] < 4:
        return []
    lead, size = tuple(shape[:-1]), shape[-1]
    axes = tuple(range(len(lead) + 1))
    swap = axes + (len(lead) + 2, len(lead) + 1)
    out = []
    for head in range(4, size + 1, 2):
        if size % head:
            continue
        for split in ((head // 2, 2), (2, head // 2)):
            out.append(Transform("a", (("reshape", lead + (size // head, *split)), ("permute", swap),
                                       ("reshape", tuple(shape)))))
    return out


def _family(pair: Pair) -> tuple[str, str, str, str]:
    """The same tensor of every instance of a repeated structure (layer numbers left out)."""
    return (any_instance(pair.node_a.relative_path), any_instance(pair.node_b.relative_path), pair.record_a.slot,
            pair.record_b.slot)


def decide_orders(rows: Sequence[TensorComparison], pairs: Sequence[Pair], trace_a: Trace, trace_b: Trace,
                  values: Values, pcc: Sequence[float | None] = ()) -> dict[int, Transform]:
    """Row index -> the order to compare it under, for the rows of every family where an order was decided.

    Only the rows of pairs found by name, dataflow or value tell how their tensors compare as recorded
    (``_SEARCHED``). ``pcc[i]``, when known, is row i's correlation as recorded (from its comparison): a pair
    correlated that well is not read again to try other orders."""
    fitting: dict[int, Transform] = {}
    for i, (row, pair) in enumerate(zip(rows, pairs)):
        ra, rb = pair.record_a, pair.record_b
        as_recorded = pair.matched_by not in _SEARCHED
        if row.within_tolerance is False and ra.slot.startswith("outputs") and ra.shape is not None \
                and rb.shape is not None and _squeezed(ra.shape) == _squeezed(rb.shape) \
                and not (as_recorded and _fits_as_recorded(row, rb) is True) \
                and not (as_recorded and i < len(pcc) and (pcc[i] or 0.0) >= _CORRELATED) \
                and values.similarity(ra, rb) >= 0.75:
            found = _fitting_order(trace_a, ra, trace_b, rb)
            if found is not None:
                fitting[i] = found
    # a graph node (llama.cpp's Vcur) is rotary-permuted only if a rotary op reads it: the same order on a tensor
    # no rotary op reads is a mistake, not a layout (the q/k permutation applied to v)
    vocabulary = trace_b.graph
    fitting = {i: order for i, order in fitting.items() if feeds_rotary(pairs[i].node_b, vocabulary)}
    if not fitting:
        return {}
    witnessed = _witnessed(rows, pairs)
    families: dict[tuple[str, str, str, str], list[int]] = {}
    for i, pair in enumerate(pairs):
        families.setdefault(_family(pair), []).append(i)
    decided: dict[int, Transform] = {}
    for members in families.values():
        if not any(i in fitting for i in members):
            continue
        # an instance votes for its order, or for none when it agreed as recorded
        votes = [(fitting.get(i), i in witnessed) for i in members
                 if i in fitting or rows[i].within_tolerance is True]
        chosen = [order for order, seen in votes if seen] or [order for order, _ in votes if order is not None]
        order, _ = Counter(chosen).most_common(1)[0] if chosen else (None, 0)
        if order is not None:
            decided.update({i: order for i in members})
    return decided


def _fits_as_recorded(row: TensorComparison, rb: TensorRecord) -> bool | None:
    """Whether the recorded order fits (``_relative_error`` under ``_FITS``), told from the largest error of a
    row compared as recorded and B's recorded extremes, without reading a payload; None when they cannot
    tell."""
    lo, hi = rb.stats.get("min"), rb.stats.get("max")
    if row.approximate or row.nan_mismatch or row.inf_mismatch or lo is None or hi is None:
        return None
    scale = max(abs(lo), abs(hi))
    if not (math.isfinite(scale) and scale > 0 and math.isfinite(row.max_abs_err)):
        return None
    estimate = row.max_abs_err / scale
    # a margin either side: the extremes of a standard trace are read from 5 significant digits
    return True if estimate < 0.9 * _FITS else False if estimate > 1.1 * _FITS else None


def _fitting_order(trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord) -> Transform | None:
    a, b = _load(trace_a, ra), _load(trace_b, rb)
    if a is None or b is None or ra.shape is None:
        return None
    import numpy as np

    from ...trace.payload import as_floats

    # B's shape: the same up to dimensions of size 1 (a graph runtime's [T, C] against transformers' [1, T, C])
    shape: tuple[int, ...] = tuple(b.shape)
    error, values = RelativeError(b), as_floats(a.values, a.dtype, np.float64).reshape(shape)
    if error.of_floats(values) < _FITS or not shape:  # the recorded order fits (a port's noise): nothing else tried
        return None
    size = shape[-1]
    rows = values.size // size
    head = min(rows, max(1, _SAMPLE // size))  # the first rows: an order is tried on all only if they fit
    part_a, part_b = values.reshape(rows, size)[:head], error.values.reshape(rows, size)[:head]
    best, best_err = None, _FITS
    for order, on_part in zip(pair_orders(shape), pair_orders((head, size))):
        if error.between(on_part.apply(part_a), part_b) >= best_err:  # never below the error over all rows
            continue
        err = error.of_floats(order.apply(values))
        if err < best_err:
            best, best_err = order, err
    return best


def feeds_rotary(node: Node, vocabulary: GraphVocabulary | None) -> bool:
    """False for a node of a graph block whose output no rotary op of its runtime's ``vocabulary`` reads,
    through its views; True for every other node (module calls do not say which op reads them)."""
    block = node.parent
    if block is None or block.module_type != GRAPH_BLOCK:
        return True
    if vocabulary is None:  # a runtime that declared no ops: none is known to rotate
        return False
    readers: dict[str, list[Node]] = {}
    for sibling in block.children:
        for record in sibling.inputs():
            if record.payload:
                readers.setdefault(record.payload, []).append(sibling)
    frontier, seen = [node], {id(node)}
    while frontier:
        current = frontier.pop()
        for record in current.outputs():
            for reader in readers.get(record.payload or "", []):
                if vocabulary.is_rotary(reader.module_type):
                    return True
                if id(reader) not in seen and vocabulary.is_view(reader.module_type):
                    seen.add(id(reader))
                    frontier.append(reader)
    return False


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def _witnessed(rows: Sequence[TensorComparison], pairs: Sequence[Pair]) -> set[int]:
    """Rows whose nearest enclosing compared call (in B) has every output within tolerance."""
    outputs_ok: dict[int, bool] = {}  # id of B's call -> all its output rows within tolerance
    for row, pair in zip(rows, pairs):
        if pair.record_a.slot.startswith("outputs"):
            key = id(pair.node_b)
            outputs_ok[key] = outputs_ok.get(key, True) and row.within_tolerance is True
    out = set()
    for i, pair in enumerate(pairs):
        parent: Node | None = pair.node_b.parent
        while parent is not None and id(parent) not in outputs_ok:
            parent = parent.parent
        if parent is not None and outputs_ok[id(parent)]:
            out.add(i)
    return out

