"""What says two calls, or two tensors, are the same computation: values, names and shapes.

Values come first. Two tensors hold the same values when their recorded statistics agree (min, max, mean,
standard deviation, mean magnitude): statistics do not change when a port permutes, transposes or
re-heads a tensor, so a ``[T, B, C]`` output and its ``[B, T, C]`` counterpart, or a rotary-permuted
``q_proj``, agree here and their layout is found later. A trace without statistics has them computed
from its payloads, once per tensor. The similarity is graded, not a verdict: a bf16 port agrees with its
fp32 reference a little less than a float32 port, and both far more than two unrelated tensors do.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...errors import TracediffError
from ...trace.model import Node, TensorRecord

if TYPE_CHECKING:
    from ...trace.load import Trace

_FLOAT_STATS = ("min", "max", "mean", "std", "abs_mean")
_EXACT_STATS = ("min", "max", "zeros")
_TOKEN = re.compile(r"[a-z]+|\d+")
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
# relative distance of the statistics -> similarity; a bf16 port of a 2-layer model stays under 2e-2
_GRADES = ((1e-3, 1.0), (2e-2, 0.75), (1e-1, 0.4))
# a call whose one output equals its one input this closely computes nothing (Identity, Dropout in eval,
# transformer-lens's hook points)
_SAME = 1e-6
_QUANTILES = 33
_SAMPLE = 1 << 16


@dataclass
class Values:
    """The statistics of the tensors of two traces, from the trace or, when it has none, from the payloads."""

    trace_a: Trace | None = None
    trace_b: Trace | None = None
    _computed: dict[int, dict[str, float] | None] = field(default_factory=dict)
    _quantiles: dict[tuple[int, str], Any] = field(default_factory=dict)

    def stats(self, record: TensorRecord, side: str) -> dict[str, float] | None:
        if any(key in record.stats for key in ("mean", "min")):
            return record.stats
        key = id(record)
        if key not in self._computed:
            self._computed[key] = self._from_payload(record, self.trace_a if side == "a" else self.trace_b)
        return self._computed[key]

    @staticmethod
    def _from_payload(record: TensorRecord, trace: Trace | None) -> dict[str, float] | None:
        finite = _finite_values(record, trace)
        if finite is None:
            return None
        import numpy as np

        return {"min": float(finite.min()), "max": float(finite.max()), "mean": float(finite.mean()),
                "std": float(finite.std()), "abs_mean": float(np.abs(finite).mean())}

    def similarity(self, ra: TensorRecord, rb: TensorRecord) -> float:
        """1 for the same values, down to 0 for unrelated ones: the statistics first, then, where they agree
        and both payloads are there, the sorted values (normalised tensors share their statistics)."""
        return graded(self.distance(ra, rb))

    def distance(self, ra: TensorRecord, rb: TensorRecord) -> float:
        """How far apart the values of two tensors are, relative to their spread (0 for the same values, inf
        when nothing tells): the larger of the statistics' and the sorted values' distances, the latter only
        where the statistics already agree (within the last grade) and both payloads are there. Graded, it is
        ``similarity``; unrounded, it ranks candidates that all agree only approximately (a quantized run)."""
        if ra.shape is None or rb.shape is None or math.prod(ra.shape) != math.prod(rb.shape):
            return math.inf
        sa, sb = self.stats(ra, "a"), self.stats(rb, "b")
        if not sa or not sb:
            return math.inf
        distance = statistics_distance(sa, sb)
        if graded(distance) and "mean" in sa and "mean" in sb:
            qa, qb = self.quantiles(ra, "a"), self.quantiles(rb, "b")
            if qa is not None and qb is not None:
                distance = max(distance, quantile_distance(qa, qb))
        return distance

    def quantiles(self, record: TensorRecord, side: str) -> Any:
        key = (id(record), "q")
        if key not in self._quantiles:
            self._quantiles[key] = self._sorted_sample(record, self.trace_a if side == "a" else self.trace_b)
        return self._quantiles[key]

    def best(self, records_a: list[TensorRecord], records_b: list[TensorRecord]) -> float:
        """The similarity of the closest pair between two lists of tensors (0 when either is empty)."""
        return max((self.similarity(x, y) for x in records_a for y in records_b), default=0.0)

    @staticmethod
    def _sorted_sample(record: TensorRecord, trace: Trace | None) -> Any:
        """``_QUANTILES`` evenly spaced order statistics of the finite values (a strided sample of big tensors)."""
        finite = _finite_values(record, trace, sample=_SAMPLE)
        if finite is None:
            return None
        import numpy as np

        finite.sort()
        return finite[np.linspace(0, finite.size - 1, _QUANTILES).round().astype(int)]


def _finite_values(record: TensorRecord, trace: Trace | None, sample: int = 0) -> Any:
    """The finite values of ``record``'s payload as float64, every ``size // sample``-th when ``sample`` is
    smaller than its size; None without a readable payload or a finite value."""
    if trace is None or not record.has_payload:
        return None
    try:
        payload = trace.load_payload(record)
    except TracediffError:
        return None
    import numpy as np

    from ...trace.payload import as_floats

    flat = payload.values.reshape(-1)
    if sample and flat.size > sample:
        flat = flat[:: flat.size // sample]
    values = as_floats(np.ascontiguousarray(flat), payload.dtype, np.float64)
    finite = values[np.isfinite(values)]
    return finite if finite.size else None

def statistics_distance(sa: dict[str, float], sb: dict[str, float]) -> float:
    """The largest difference of a shared statistic, relative to the tensors' spread."""
    keys = [k for k in _FLOAT_STATS if k in sa and k in sb]
    if not keys:
        keys = [k for k in _EXACT_STATS if k in sa and k in sb]
        return 0.0 if keys and all(sa[k] == sb[k] for k in keys) else math.inf
    scale = max(abs(sa.get("std", 0.0)), abs(sb.get("std", 0.0)), abs(sa.get("abs_mean", 0.0)),
                abs(sb.get("abs_mean", 0.0)), 1e-12)
    worst = max(abs(sa[k] - sb[k]) for k in keys)
    return worst / scale if worst == worst else math.inf


def quantile_distance(qa: Any, qb: Any) -> float:
    """The largest difference of matching order statistics, relative to the spread of the values."""
    import numpy as np

    scale = max(float(np.abs(qa).mean()), float(np.abs(qb).mean()), 1e-12)
    return float(np.abs(qa - qb).max()) / scale


def same_statistics(sa: dict[str, float], sb: dict[str, float]) -> bool:
    """Every statistic equal, NaN equal to NaN (masked attention scores hold -inf, their mean is NaN)."""
    if sa.keys() != sb.keys():
        return False
    # summing the same values in another order (a transposed copy) moves the mean in its last digits
    spread = max(abs(sa.get("std", 0.0)), abs(sa.get("abs_mean", 0.0)), 1e-30)
    return all(x == y or (x != x and y != y) or abs(x - y) <= _SAME * max(abs(x), abs(y), spread)
               for x, y in ((sa[k], sb[k]) for k in sa))


def graded(distance: float) -> float:
    for limit, grade in _GRADES:
        if distance <= limit:
            return grade
    return 0.0


def is_transparent(node: Node, values: Values, side: str, child_computes: Callable[[Node], bool] | None = None
                   ) -> bool:
    """A call that computes nothing: one input and one output tensor holding the same values (in the same
    layout or another: a view into heads computes nothing either), no child that computes. Such calls pair
    only with their namesakes (they would pair with whatever shares their size). ``child_computes`` answers
    for the children (a cache); by default they are asked the same question."""
    inputs, outputs = node.inputs(), node.outputs()
    if len(inputs) != 1 or len(outputs) != 1 or numel(inputs[0]) != numel(outputs[0]) or numel(inputs[0]) is None:
        return False
    sa, sb = values.stats(inputs[0], side), values.stats(outputs[0], side)
    if not (sa and sb and same_statistics(sa, sb)):
        return False
    computes = child_computes or (lambda child: not is_transparent(child, values, side))
    return not any(computes(child) for child in node.children)


def tokens(path: str) -> set[str]:
    return set(_TOKEN.findall(path.lower()))


def name_similarity(path_a: str, path_b: str) -> float:
    """Jaccard similarity of the lower-case word and number tokens of two paths (0 to 1); 1 when they share
    no word and one name, its separators left out, abbreviates the other (``attn`` and ``attention``,
    ``out_proj`` and ``output_projection``)."""
    tokens_a, tokens_b = tokens(path_a), tokens(path_b)
    if not tokens_a or not tokens_b:
        return 0.0
    shared = tokens_a & tokens_b
    if not shared:  # ``self`` and ``self_attn`` share a word: that is all they share
        letters_a, letters_b = _letters(path_a), _letters(path_b)
        if _abbreviates(letters_a, letters_b) or _abbreviates(letters_b, letters_a):
            return 1.0
    return len(shared) / len(tokens_a | tokens_b)


def _letters(path: str) -> str:
    return "".join(ch for ch in path.lower() if ch.isalpha())


def _abbreviates(short: str, word: str) -> bool:
    """``short`` is ``word`` with letters left out (three letters at least, the first kept): ``attn``."""
    if len(short) < 3 or len(short) >= len(word) or short[0] != word[0]:
        return False
    letters = iter(word)
    return all(letter in letters for letter in short)


def type_similarity(type_a: str | None, type_b: str | None) -> float:
    """Jaccard similarity of the words of two class names (``GELU`` and ``GELUActivation``: 0.5)."""
    if not type_a or not type_b:
        return 0.0
    words_a = {w.lower() for w in _WORD.findall(type_a)}
    words_b = {w.lower() for w in _WORD.findall(type_b)}
    if not words_a or not words_b:
        return 0.0
    return len(words_a & words_b) / len(words_a | words_b)


def main_output(node: Node) -> TensorRecord | None:
    """The first output tensor (a tensor, or the first element or field of a tuple or ModelOutput)."""
    outputs = node.outputs()
    return outputs[0] if outputs else None


def numel(record: TensorRecord | None) -> int | None:
    return None if record is None or record.shape is None else math.prod(record.shape)
