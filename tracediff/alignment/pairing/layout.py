"""Layout-aware matching: tensors that hold the same values laid out differently.

Ports re-lay tensors out all the time. tracediff relates them by a
transform, verified on the recorded values, and then compares them as usual
(the row's ``transform`` says which one, ``matched_by`` is ``"layout"``):

* **Fused projections** (one call on one side, several on the other, children
  of matched calls, none of them paired by name): a fused ``qkv`` Linear whose
  output is ``q_proj``, ``k_proj`` and ``v_proj`` concatenated along a
  dimension (any split sizes, so GQA too), or ``gate_up`` against
  ``gate_proj`` and ``up_proj``. The calls must take inputs of the same
  shapes and the parts must add up exactly to the fused size; when payloads
  are present, the order of the parts is the one that fits the values best.
  Rows read ``A[..., 0:32] ~ B`` (A's slice compared with B) or
  ``A ~ B[..., 32:48]``; the inputs of both calls are compared as well.
* **Permutations and head split/merge reshapes** of a tensor paired by slot
  whose shape differs but holds as many elements: ``[B, T, H, D]`` against
  ``[B, H, T, D]`` (``A.permute(0,2,1,3) ~ B``) or ``[B, T, H*D]`` against
  ``[B, H, T, D]`` (``A.reshape(1,6,4,8).permute(0,2,1,3) ~ B``). Every
  permutation of up to 5 dimensions, with or without splitting or merging
  neighbouring dimensions, is tried on the values; the closest wins, the
  simplest on ties. Tensors above 16 M elements, or without payloads, are not
  searched.

Weights are not part of a trace, so weight transposes are not searched here.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import TracediffError
from ...trace.load import Trace
from ...trace.model import Node, TensorRecord

if TYPE_CHECKING:
    from ...compare.measurement import Measurement
    from ...trace.payload import Payload

Step = tuple[Any, ...]
_MAX_SEARCH_NUMEL = 16 * 2**20
_MAX_PARTS = 6
_NUMBER = re.compile(r"\.\d+(?=\.|$)")


def any_instance(path: str) -> str:
    """A module path with its instance numbers left out: ``layers.3.attn.qkv`` -> ``layers.N.attn.qkv``."""
    return _NUMBER.sub(".N", path)


@dataclass(frozen=True)
class Transform:
    """What is done to one side's tensor before comparing: ``narrow``, ``reshape`` and ``permute`` steps."""

    side: str  # "a" or "b": the tensor the steps apply to
    steps: tuple[Step, ...]

    def apply(self, tensor: Any) -> Any:
        """The steps applied to a payload, numpy array or torch tensor (views where possible; ``ValueError`` when
        a step does not fit the shape)."""
        from ...trace.payload import Payload

        if isinstance(tensor, Payload):
            return tensor.with_values(self.apply(tensor.values))
        for step in self.steps:
            if step[0] == "narrow":
                _, dim, start, length = step
                if not 0 <= start <= start + length <= tensor.shape[dim]:
                    raise ValueError(f"narrow {start}:{start + length} outside dimension {dim}")
                tensor = tensor[(slice(None),) * dim + (slice(start, start + length),)]
            elif step[0] == "reshape":
                tensor = tensor.reshape(step[1])
            else:  # numpy's transpose and torch's permute take the whole order
                tensor = tensor.permute(step[1]) if hasattr(tensor, "permute") else tensor.transpose(step[1])
        return tensor

    def describe(self, ndim: int) -> str:
        """``A[..., 0:32] ~ B``, ``A.permute(0,2,1,3) ~ B``, ``A ~ B[:, 8:16]``."""
        text = self.side.upper()
        for step in self.steps:
            if step[0] == "narrow":
                _, dim, start, length = step
                where = f"{start}:{start + length}"
                text += f"[..., {where}]" if dim == ndim - 1 else "[" + ":, " * dim + where + "]"
            else:
                text += f".{step[0]}({','.join(str(v) for v in step[1])})"
        return f"{text} ~ B" if self.side == "a" else f"A ~ {text}"


@dataclass(frozen=True)
class LayoutPair:
    """A tensor pair found by layout: the calls, the records, and the transform (None for plain inputs)."""

    node_a: Node
    record_a: TensorRecord
    node_b: Node
    record_b: TensorRecord
    transform: Transform | None


def _main_output(node: Node) -> TensorRecord | None:
    outputs = node.outputs()
    return outputs[0] if outputs and outputs[0].shape is not None else None


def _load(trace: Trace, record: TensorRecord) -> Payload | None:
    if not record.has_payload:
        return None
    try:
        return trace.load_payload(record)
    except TracediffError:
        return None


def find_fused(trace_a: Trace, trace_b: Trace, parents: list[tuple[Node, Node]], unpaired_a: set[int],
               unpaired_b: set[int]) -> list[LayoutPair]:
    """Fused calls on either side among the unpaired children of matched calls (see the module docstring).

    ``unpaired_a``/``unpaired_b`` hold ``id(node)`` of calls nothing paired;
    calls used here are removed from them. The order of the parts is decided once for every instance of a
    repeated structure (``layers.N.attn.qkv``), by the order most instances fit: an instance whose values
    fit another order (k and v swapped in one layer) is compared in the common order, and diverges there.
    """
    found: list[_Fused] = []
    if not (unpaired_a and unpaired_b):  # every call of a side paired: nothing can be fused
        return []
    for parent_a, parent_b in parents:
        kids_a = [n for n in parent_a.children if id(n) in unpaired_a]
        kids_b = [n for n in parent_b.children if id(n) in unpaired_b]
        if not kids_a or not kids_b:
            continue
        for fused in kids_a:
            found += _fuse(trace_a, trace_b, fused, kids_b, "a", unpaired_a, unpaired_b)
        for fused in kids_b:
            found += _fuse(trace_b, trace_a, fused, kids_a, "b", unpaired_b, unpaired_a)
    votes: dict[tuple[str, str, int], Counter[tuple[int, ...]]] = {}
    for item in found:
        votes.setdefault(item.family, Counter())[item.order] += 1
    pairs: list[LayoutPair] = []
    for item in found:
        order = votes[item.family].most_common(1)[0][0]  # Counter keeps first-seen order on ties
        pairs += item.pairs([item.parts[i] for i in order])
    return pairs


@dataclass(frozen=True)
class _Fused:
    """A fused call, the parts it holds (in call order), and the order its own values fit best."""

    side: str
    fused: Node
    output: TensorRecord
    parts: tuple[tuple[Node, TensorRecord], ...]
    dim: int
    order: tuple[int, ...]

    @property
    def family(self) -> tuple[str, str, int]:
        """The same fused call in every instance of a repeated structure."""
        return self.side, any_instance(self.fused.relative_path), len(self.parts)

    def pairs(self, ordered: list[tuple[Node, TensorRecord]]) -> list[LayoutPair]:
        out: list[LayoutPair] = []
        start = 0
        for kid, out_k in ordered:
            assert out_k.shape is not None
            length = out_k.shape[self.dim]
            transform = Transform(self.side, (("narrow", self.dim, start, length),))
            start += length
            for in_f, in_k in zip(self.fused.inputs(), kid.inputs()):
                out.append(_oriented(self.side, self.fused, in_f, kid, in_k, None))
            out.append(_oriented(self.side, self.fused, self.output, kid, out_k, transform))
        return out


def _fuse(trace_f: Trace, trace_p: Trace, fused: Node, kids: list[Node], side: str,
          unpaired_f: set[int], unpaired_p: set[int]) -> list[_Fused]:
    """The fused call of side ``side`` against several of the other side's calls, if it is one."""
    if id(fused) not in unpaired_f:
        return []
    out_f = _main_output(fused)
    if out_f is None or out_f.shape is None:
        return []
    shape = out_f.shape
    in_shapes = [t.shape for t in fused.inputs()]
    by_dim: dict[int, list[tuple[Node, TensorRecord]]] = {}
    for kid in kids:
        out_k = _main_output(kid)
        if id(kid) not in unpaired_p or out_k is None or out_k.shape is None or len(out_k.shape) != len(shape):
            continue
        if [t.shape for t in kid.inputs()] != in_shapes:
            continue
        differing = [d for d in range(len(shape)) if shape[d] != out_k.shape[d]]
        if len(differing) == 1 and out_k.shape[differing[0]] < shape[differing[0]]:
            by_dim.setdefault(differing[0], []).append((kid, out_k))
    for dim, parts in by_dim.items():
        chosen = _parts_filling(parts, shape[dim], dim)
        if chosen is None:
            continue
        for kid, _ in chosen:
            unpaired_p.discard(id(kid))
        unpaired_f.discard(id(fused))
        order = _best_order(trace_f, out_f, trace_p, chosen, dim)
        return [_Fused(side, fused, out_f, tuple(chosen), dim, order)]
    return []


def _oriented(side: str, fused: Node, rf: TensorRecord, kid: Node, rk: TensorRecord,
              transform: Transform | None) -> LayoutPair:
    if side == "a":
        return LayoutPair(fused, rf, kid, rk, transform)
    return LayoutPair(kid, rk, fused, rf, transform)


def _parts_filling(parts: list[tuple[Node, TensorRecord]], size: int, dim: int
                   ) -> list[tuple[Node, TensorRecord]] | None:
    """All parts, or the first run of consecutive parts, whose sizes add up to ``size`` exactly."""
    def total(run: list[tuple[Node, TensorRecord]]) -> int:
        return sum(r.shape[dim] for _, r in run if r.shape is not None)

    if 2 <= len(parts) and total(parts) == size:
        return parts
    for i in range(len(parts)):
        for j in range(i + 2, len(parts) + 1):
            if total(parts[i:j]) == size:
                return parts[i:j]
    return None


def _best_order(trace_f: Trace, out_f: TensorRecord, trace_p: Trace, parts: list[tuple[Node, TensorRecord]],
                dim: int) -> tuple[int, ...]:
    """The order of the parts along ``dim`` that fits the fused values best (call order without payloads)."""
    in_call_order = tuple(range(len(parts)))
    if len(parts) > _MAX_PARTS:
        return in_call_order
    fused = _load(trace_f, out_f)
    loaded = [_load(trace_p, r) for _, r in parts]
    if fused is None or any(t is None for t in loaded):
        return in_call_order
    best, best_err = in_call_order, math.inf
    for order in itertools.permutations(range(len(parts))):
        start, err = 0, 0.0
        for i in order:
            part = loaded[i]
            assert part is not None
            piece = Transform("a", (("narrow", dim, start, part.shape[dim]),)).apply(fused)
            err += _relative_error(piece, part)
            start += part.shape[dim]
        if err < best_err:  # strict: call order wins ties
            best, best_err = tuple(order), err
    return best


def _relative_error(x: Payload, y: Payload) -> float:
    """The largest difference of ``x`` and ``y`` over the largest finite magnitude of ``y``."""
    return RelativeError(y)(x)


class RelativeError:
    """``_relative_error`` against one ``y``: its float64 values and scale computed once, for many ``x``."""

    def __init__(self, y: Payload) -> None:
        import numpy as np  # only once payloads are read: relating layouts from shapes needs no numpy

        from ...trace.payload import as_floats

        self.shape = y.shape
        self.values = as_floats(y.values, y.dtype, np.float64)
        with np.errstate(all="ignore"):
            self.scale = float(np.max(np.nan_to_num(np.abs(self.values), nan=0.0, posinf=0.0, neginf=0.0))) \
                if self.values.size else 0.0

    def __call__(self, x: Payload) -> float:
        import numpy as np

        from ...trace.payload import as_floats

        return self.of_floats(as_floats(x.values, x.dtype, np.float64)) if x.shape == self.shape else math.inf

    def of_floats(self, xd: Any) -> float:
        """The error of float64 values ``xd`` (any arrangement numpy can subtract without a copy)."""
        return self.between(xd, self.values) if xd.shape == self.shape else math.inf

    def between(self, xd: Any, yd: Any) -> float:
        """The largest difference of ``xd`` and part ``yd`` of ``y`` over ``y``'s scale: a lower bound of the
        error over all of ``y``."""
        import numpy as np

        with np.errstate(all="ignore"):
            diff = float(np.max(np.nan_to_num(np.abs(xd - yd), nan=math.inf))) if xd.size else 0.0
        return float(diff / (self.scale + 1e-30))


def find_relayout(trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord) -> Transform | None:
    """The permutation, or reshape and permutation, of A's tensor that best matches B's; None if none applies."""
    if ra.shape is None or rb.shape is None or ra.shape == rb.shape:
        return None
    if math.prod(ra.shape) != math.prod(rb.shape) or math.prod(ra.shape) > _MAX_SEARCH_NUMEL:
        return None
    if max(len(ra.shape), len(rb.shape)) > 5:
        return None
    a, b = _load(trace_a, ra), _load(trace_b, rb)
    if a is None or b is None:
        return None
    best: Transform | None = None
    best_key: tuple[float, int] = (math.inf, 0)
    error = RelativeError(b)  # B decoded once for every candidate
    for candidate in _candidates(a.shape, b.shape):
        try:
            err = error(candidate.apply(a))
        except ValueError:
            continue
        key = (err, len(candidate.steps))
        if key < best_key:
            best, best_key = candidate, key
    return best if best_key[0] < math.inf else None


def _candidates(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> list[Transform]:
    out = []
    n = len(shape_b)
    for p in itertools.permutations(range(n)):
        source = [0] * n
        for i, axis in enumerate(p):
            source[axis] = shape_b[i]
        identity = list(p) == list(range(n))
        if tuple(source) == shape_a and not identity:
            out.append(Transform("a", (("permute", p),)))
        elif tuple(source) != shape_a and _refines(shape_a, tuple(source)):
            steps: tuple[Step, ...] = (("reshape", tuple(source)),)
            out.append(Transform("a", steps if identity else steps + (("permute", p),)))
    for p in itertools.permutations(range(len(shape_a))):
        permuted = tuple(shape_a[i] for i in p)
        if list(p) != list(range(len(shape_a))) and permuted != shape_b and _refines(permuted, shape_b):
            out.append(Transform("a", (("permute", p), ("reshape", shape_b))))
    return out


def _refines(x: tuple[int, ...], y: tuple[int, ...]) -> bool:
    """True when one shape splits or merges neighbouring dimensions of the other (their cut points nest)."""
    cuts_x = set(itertools.accumulate(x, lambda s, v: s * v))
    cuts_y = set(itertools.accumulate(y, lambda s, v: s * v))
    return cuts_x <= cuts_y or cuts_y <= cuts_x


def compare_transformed(trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord, transform: Transform,
                        *, atol: float, rtol: float) -> Measurement:
    """The metric fields of a row whose pair is related by ``transform`` (payloads needed on both sides)."""
    from ...compare.measurement import dtype_note, measured, unmeasured
    from ...compare.metrics import compare_tensors

    if not (ra.has_payload and rb.has_payload):
        return unmeasured("no_data", None,
                              f"{transform.describe(len(ra.shape or ()))}: needs payloads on both sides")
    try:
        a, b = trace_a.load_payload(ra), trace_b.load_payload(rb)
    except TracediffError as e:
        return unmeasured("unreadable", None, str(e))
    if transform.side == "a":
        a = transform.apply(a)
    else:
        b = transform.apply(b)
    if a.shape != b.shape:
        return unmeasured("shape_mismatch", False, f"shape differs after the transform: {list(a.shape)} vs "
                                                 f"{list(b.shape)}")
    metrics = compare_tensors(a, b, atol=atol, rtol=rtol)  # reshaped to one dimension there: a copy if permuted
    return measured(metrics, approximate=False, note=dtype_note(ra, rb))
