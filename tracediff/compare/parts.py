"""A tensor pair measured in parts: each part a slice of the pair, summarised so that parts merge into the
metrics of the whole (``tracediff align --distributed``: each rank measures the slice its shard covers).

:func:`measure_part` runs the one streaming kernel of :mod:`tracediff.compare.metrics` over a slice and keeps
its running state (:class:`PartMetrics`, small and picklable); :func:`merge_parts` adds the states of every
slice of a tensor and finishes them as :func:`tracediff.compare.metrics.compare_tensors` finishes one.

Merged exactly: ``max_abs_err``, ``max_rel_err``, the NaN/Inf/mismatch counts, ``mismatch_fraction``, the
required tolerances and ``identical`` (every part bitwise equal). Merged up to rounding: ``mean_abs_err``,
``rms_err`` and ``cosine`` (their sums are added in another order than one pass over the whole tensor takes;
the partial sums of a chunk run in float32 for float32 pairs: within ``gamma(m)`` relative for chunks of ``m``
elements, ``u = 2**-24``) and the Pearson correlation (each chunk's float64 means and centred co-moments merged
by Chan's formula, as the one-process pass merges them: :mod:`tracediff.compare.moments`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..order import merge_order
from ..trace.payload import payload_of
from .metrics import PairMetrics, _accumulate, _Accumulator, bitwise_equal, identical_metrics
from .moments import NO_MOMENTS, Moments
from .row_pass import PearsonMoments

ScaledPair = tuple[float, int]


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
    pearson = PearsonMoments()  # the moments the one-process pass takes, chunk by chunk (compare/moments.py)
    acc = _accumulate(a, b, _Accumulator(atol, rtol, pearson))
    sums = tuple((total.value, total.exp) for total in (acc.sum_abs, acc.sum_sq, acc.dot, acc.norm_a, acc.norm_b))
    return PartMetrics(a.size, bitwise_equal(a, b), acc.finite, acc.max_abs, acc.max_rel, sums, acc.nan_mismatch,
                       acc.inf_mismatch, acc.mismatched, pearson.moments)


def merge_parts(parts: list[PartMetrics], *, atol: float, rtol: float) -> tuple[PairMetrics, float]:
    """The metrics of the whole pair from the states of its slices, and its Pearson correlation."""
    numel = sum(part.numel for part in parts)
    parts = merge_order(parts)  # TRACEDIFF_REORDER: merged last to first (tracediff/order.py)
    moments = NO_MOMENTS
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
