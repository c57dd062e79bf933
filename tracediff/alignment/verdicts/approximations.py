"""A runtime's known approximations, read from B's trace: rows within what that rounding can do are no divergence.

A graph runtime's vocabulary (the trace metadata's ``graph``, :mod:`tracediff.trace.vocabulary`) names the ops
whose kernels round on purpose; tracediff bounds these. ggml's CPU kernels round in two places the trace
records, each a node with its inputs:

* flash attention (llama.cpp's default ``auto`` picks it on CPU): ``FLASH_ATTN_EXT`` with K and V in float16
  (the F16 cache, or the float16 copies ggml makes of an F32 cache's views, recorded with their dtype);
* the GELU (``GELU``, ``GEGLU``: Gemma's MLP), read from a float16 table.

The node's own inputs bound what that rounding can change at its output
(:mod:`tracediff.compare.approximations`, derived from the rounding). A row whose B tensor is that output,
or the same values reshaped (the vocabulary's ``same_values``: ggml's ``RESHAPE``, ``CONT``), and whose
error is within its ordinary tolerance plus that bound at every element, is accepted: ``close``, its reason
naming the node, the bound and where it came from. The rows its error is carried into are accepted as
inherited from it (:func:`tracediff.alignment.verdicts.sources.find_sources`' ``approximated``); a mistake makes an
error the bound does not allow, or a new source after it, and is still named at its module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...compare.approximations import flash_attention_bound, geglu_bound, gelu_table_bound
from ...errors import TracediffError
from ...trace.load import Trace
from ...trace.model import Node, TensorRecord
from ...trace.vocabulary import UNBOUNDED, GraphVocabulary
from ..pair import Pair
from ..rows import RowDraft

HALF = "torch.float16"
FLASH = "flash attention rounding (Q, K and V in float16, float16 accumulation)"
GELU = "GELU float16 table (GGML_GELU_FP16)"


def _flash(node: Node, values: list[np.ndarray]) -> np.ndarray | None:
    inputs = node.inputs()
    scale = node.attributes.get("scale")
    if len(values) < 3 or not (inputs[1].dtype == HALF or inputs[2].dtype == HALF) \
            or not isinstance(scale, (int, float)) or node.attributes.get("max_bias", 0.0) not in (0, 0.0):
        return None  # no float16 operand, or ALiBi's slopes (not bounded here): not accepted
    q, k, v = (_three_d(x) for x in values[:3])
    if q is None or k is None or v is None or q.shape[0] % k.shape[0] or k.shape[:2] != v.shape[:2]:
        return None
    return flash_attention_bound(q, k, v, scale=float(scale))


def _geglu(node: Node, values: list[np.ndarray]) -> np.ndarray | None:
    if len(values) != 2 or values[0].shape != values[1].shape:
        return None  # a fused single-input GEGLU (both halves in one tensor) is not bounded here
    return geglu_bound(values[0], values[1])


def _gelu(node: Node, values: list[np.ndarray]) -> np.ndarray | None:
    return gelu_table_bound(values[0]) if len(values) == 1 else None


#: Each approximation a graph vocabulary may name (tracediff.trace.vocabulary.APPROXIMATIONS): what it is, and
#: the bound of its rounding from the node's inputs.
BOUNDS: dict[str, tuple[str, Callable[[Node, list[np.ndarray]], np.ndarray | None]]] = {
    "ggml_flash_attention_f16": (FLASH, _flash), "ggml_geglu_f16_table": (GELU, _geglu),
    "ggml_gelu_f16_table": (GELU, _gelu)}


#: What each approximation no trace can bound is, in a report's words (vocabulary.UNBOUNDED)
UNBOUNDED_NAMES = {"xnnpack_gelu_erf": "XNNPACK's GELU (the exact erf form, where the graph asks for the tanh "
                                       "form: XNNPACK ignores `approximate`; the two differ by up to 4.8e-4 per "
                                       "element)"}


def unbounded_approximations(pairs: Sequence[Pair]) -> list[str | None]:
    """For each pair, the approximations no trace can bound that act in B's node (a delegated region's
    ``attributes.approximations``, docs/trace-format.md 9.1), named with the module they act in; else None."""
    named: dict[int, str | None] = {}
    out: list[str | None] = []
    for pair in pairs:
        node = pair.node_b
        if id(node) not in named:
            named[id(node)] = _unbounded_text(node)
        out.append(named[id(node)])
    return out


def _unbounded_text(node: Node) -> str | None:
    declared = (node.attributes or {}).get("approximations") if node.graph else None
    if not isinstance(declared, list):
        return None
    texts = []
    for item in declared:
        name = item.get("name") if isinstance(item, dict) else None
        if name in UNBOUNDED and name in UNBOUNDED_NAMES:
            scope = item.get("scope")
            where = f" at {scope}" if isinstance(scope, str) and scope else ""
            text = f"{UNBOUNDED_NAMES[name]}{where}"
            if text not in texts:
                texts.append(text)
    return "; ".join(texts) or None


@dataclass(frozen=True)
class Approximated:
    """The rows accepted within a runtime's rounding, and the warning that says so."""

    rows: frozenset[int]
    warning: str | None


def accept_approximations(rows: Sequence[RowDraft], pairs: Sequence[Pair], trace_a: Trace,
                          trace_b: Trace | None) -> Approximated:
    """Accept each diverged row of a rounding node's output that the rounding's bound explains."""
    # a close port diverges nowhere: no walk of B's nodes then
    if trace_b is None or not any(row.within_tolerance is False for row in rows):
        return Approximated(frozenset(), None)
    vocabulary = trace_b.graph
    if vocabulary is None or not vocabulary.approximations:
        return Approximated(frozenset(), None)
    producers = _producers(trace_b)
    if not any(_kind(node, vocabulary) for node in producers.values()):
        return Approximated(frozenset(), None)
    bounds: dict[int, np.ndarray | None] = {}
    accepted: dict[int, str] = {}
    for index, (row, pair) in enumerate(zip(rows, pairs)):
        ra, rb = pair.record_a, pair.record_b
        if row.within_tolerance is not False or row.transform is not None or rb.payload is None \
                or ra.payload is None:
            continue
        source = _rounding_source(rb.payload, producers, vocabulary)
        if source is None:
            continue
        if id(source) not in bounds:
            bounds[id(source)] = _bound(trace_b, source, vocabulary)
        bound = bounds[id(source)]
        if bound is not None and _within(row, trace_a, ra, trace_b, rb, bound, source, vocabulary):
            accepted[index] = BOUNDS[_kind(source, vocabulary) or ""][0]
    warning = None
    if accepted:
        kinds = "; ".join(f"{count} at its {kind}" for kind, count in Counter(accepted.values()).items())
        warning = (f"{len(accepted)} compared tensor(s) within {_runtime(trace_b)}'s own rounding ({kinds}): "
                   "accepted within "
                   "a bound derived from that rounding from B's recorded inputs, and the rows their error flows "
                   "into as inherited (docs/verdicts.md, runtime approximations)")
    return Approximated(frozenset(accepted), warning)


def _kind(node: Node, vocabulary: GraphVocabulary) -> str | None:
    """The approximation a graph node's op makes, as its runtime's vocabulary names it (a module call named
    ``GELU`` is another computation: only graph nodes have ops)."""
    kind = vocabulary.approximation(node.module_type) if node.graph else None
    return kind if kind in BOUNDS else None


def _runtime(trace: Trace) -> str:
    framework = trace.metadata.get("framework")
    return framework if isinstance(framework, str) and framework else "the runtime"


def _producers(trace: Trace) -> dict[str, Node]:
    """payload -> the node whose output it is."""
    out: dict[str, Node] = {}
    for node in trace.nodes():
        for record in node.outputs():
            if record.payload is not None:
                out.setdefault(record.payload, node)
    return out


def _rounding_source(payload: str, producers: dict[str, Node], vocabulary: GraphVocabulary) -> Node | None:
    """The rounding node whose output ``payload`` is, directly or through value-keeping ops."""
    node = producers.get(payload)
    for _ in range(8):
        if node is None:
            return None
        if _kind(node, vocabulary):
            return node
        inputs = node.inputs()
        if (node.module_type or "") not in vocabulary.same_values or len(inputs) != 1 or inputs[0].payload is None:
            return None
        node = producers.get(inputs[0].payload or "")
    return None


def _bound(trace: Trace, node: Node, vocabulary: GraphVocabulary) -> np.ndarray | None:
    try:
        values = [np.asarray(trace.load_payload(record).values) for record in node.inputs()
                  if record.payload is not None]
    except TracediffError:
        return None
    if any(not np.isfinite(v).all() for v in values):
        return None
    return BOUNDS[_kind(node, vocabulary) or ""][1](node, values)


def _three_d(x: np.ndarray) -> np.ndarray | None:
    while x.ndim > 3 and x.shape[0] == 1:
        x = x[0]
    return x if x.ndim == 3 else None


def _within(row: RowDraft, trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord, bound: np.ndarray,
            node: Node, vocabulary: GraphVocabulary) -> bool:
    """Accept ``row`` when ``|a - b| <= atol + rtol |a| + bound`` at every element, saying so in its reason."""
    try:
        a = np.asarray(trace_a.load_payload(ra).values, dtype=np.float64)
        b = np.asarray(trace_b.load_payload(rb).values, dtype=np.float64)
    except TracediffError:
        return False
    if a.size != b.size or b.size != bound.size or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return False
    a, allowed = a.reshape(-1), bound.reshape(-1)
    error = np.abs(a - b.reshape(-1))
    slack = error - (row.atol + row.rtol * np.abs(a))
    if not (slack <= allowed).all():
        return False
    used = float((np.maximum(slack, 0) / np.where(allowed > 0, allowed, 1)).max())
    row.within_tolerance, row.status = True, "close"
    row.reason = (f"within {_runtime(trace_b)}'s {BOUNDS[_kind(node, vocabulary) or ''][0]} at {node.module_path}: "
                  f"max_abs_err={float(error.max()):.3g}, beyond the tolerance by at most {used:.2f} of the bound "
                  f"derived from that rounding (largest {float(allowed.max()):.3g}, from B's recorded inputs; "
                  "docs/verdicts.md)")
    return True
