"""A tensor pair measured in parts: each part a slice of the pair, summarised so that parts merge into the
metrics of the whole (``tracediff align --distributed``: each rank measures the slice its shard covers).

:func:`measure_part` runs the one streaming kernel of :mod:`tracediff.compare.metrics` over a slice and keeps
its running state (:class:`PartMetrics`, small and picklable); :func:`merge_parts` adds the states of every
slice of a tensor and finishes them as :func:`tracediff.compare.metrics.compare_tensors` finishes one.

Merged exactly: ``max_abs_err``, ``max_rel_err``, the NaN/Inf/mismatch counts, ``mismatch_fraction``, the
required tolerances and ``identical`` (every part bitwise equal). Merged up to rounding: ``mean_abs_err``,
``rms_err`` and ``cosine`` (their sums are added in another order than one pass over the whole tensor takes;
the partial sums of a chunk run in float32 for float32 pairs, so they agree to about 1e-6 relative) and the
Pearson correlation (each part's means and co-moments merged by Chan's formula, in float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..order import merge_order
from ..trace.payload import payload_of
from .metrics import PairMetrics, _accumulate, _Accumulator, bitwise_equal, finite_pair, identical_metrics

ScaledPair = tuple[float, int]


@dataclass(frozen=True)
class Moments:
    """Count, means and centred (co-)moments of the positions finite on both sides, in float64."""

    n: int
    mean_a: float
    mean_b: float
    m2_a: float
    m2_b: float
    c_ab: float

    def merge(self, other: Moments) -> Moments:
        """Chan's pairwise update: the moments of both parts together."""
        if not other.n:
            return self
        if not self.n:
            return other
        n = self.n + other.n
        da, db = other.mean_a - self.mean_a, other.mean_b - self.mean_b
        w = self.n * other.n / n
        return Moments(n, self.mean_a + da * other.n / n, self.mean_b + db * other.n / n,
                       self.m2_a + other.m2_a + da * da * w, self.m2_b + other.m2_b + db * db * w,
                       self.c_ab + other.c_ab + da * db * w)

    @property
    def pearson(self) -> float:
        """The Pearson correlation (NaN under two positions or with a constant side), as ``compare.logits``'s."""
        denominator = math.sqrt(self.m2_a * self.m2_b)
        return self.c_ab / denominator if self.n >= 2 and denominator > 0 else math.nan


@dataclass(frozen=True)
class PartMetrics:
    """The running state of the metrics kernel after one slice of a pair (see the module docstring)."""

    numel: int
    identical: bool
    finite: int
    max_abs: float
    max_rel: float
    sums: tuple[ScaledPair, ...]  # |a - b|, (a - b)^2, a.b, a.a, b.b as value * 2**exp
    nan_mismatch: int
    inf_mismatch: int
    mismatched: int
    moments: Moments


def measure_part(a: Any, b: Any, *, atol: float, rtol: float) -> PartMetrics:
    """The state of the metrics of reference slice ``a`` against slice ``b`` (same shape, floating dtypes)."""
    a, b = payload_of(a), payload_of(b)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    # the kernel runs on an identical slice too: the whole tensor may differ elsewhere, and then this slice's
    # products count towards its cosine as in one pass
    acc = _accumulate(a, b, _Accumulator(atol, rtol))
    sums = tuple((total.value, total.exp) for total in (acc.sum_abs, acc.sum_sq, acc.dot, acc.norm_a, acc.norm_b))
    return PartMetrics(a.size, bitwise_equal(a, b), acc.finite, acc.max_abs, acc.max_rel, sums, acc.nan_mismatch,
                       acc.inf_mismatch, acc.mismatched, _moments(a, b))


def merge_parts(parts: list[PartMetrics], *, atol: float, rtol: float) -> tuple[PairMetrics, float]:
    """The metrics of the whole pair from the states of its slices, and its Pearson correlation."""
    numel = sum(part.numel for part in parts)
    parts = merge_order(parts)  # TRACEDIFF_REORDER: merged last to first (tracediff/order.py)
    moments = Moments(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    for part in parts:
        moments = moments.merge(part.moments)
    if all(part.identical for part in parts):
        return identical_metrics(numel), 1.0
    acc = _Accumulator(atol, rtol)
    for part in parts:
        acc.finite += part.finite
        acc.max_abs = max(acc.max_abs, part.max_abs)
        acc.max_rel = max(acc.max_rel, part.max_rel)
        acc.nan_mismatch += part.nan_mismatch
        acc.inf_mismatch += part.inf_mismatch
        acc.mismatched += part.mismatched
        for total, (value, exp) in zip((acc.sum_abs, acc.sum_sq, acc.dot, acc.norm_a, acc.norm_b), part.sums):
            total.add(value, exp)
    return acc.result(numel), moments.pearson


def _moments(a: Any, b: Any) -> Moments:
    x, y = finite_pair(a, b)
    if not x.size:
        return Moments(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    ma, mb = float(x.mean()), float(y.mean())
    dx, dy = x - ma, y - mb
    return Moments(int(x.size), ma, mb, float(dx @ dx), float(dy @ dy), float(dx @ dy))
