"""The Pearson correlation of a pair from float64 moments: one computation for every path that reports a ``pcc``.

A chunk of finite elements (``a``, ``b``, any float dtype) is widened to float64 (exactly), 2**16 elements
at a time, each block centred on its own means and reduced to :class:`Moments`: its count, means and centred
(co-)moments. Blocks, chunks, and the slices of a tensor that ranks measure apart (``align --distributed``),
merge by Chan's pairwise update. The one
process pass and the distributed merge therefore compute the same quantities in the same precision and
differ only in how the elements are grouped, so their ``pcc`` agree to float64 rounding on any CPU, where
float32 sums (grouped by SIMD width and BLAS kernel) left them some 1e-7 apart.

Rounding: a chunk of ``m`` elements has ``m2_a`` and ``m2_b`` within ``gamma(m + 2)`` (``gamma(k) = k u / (1 -
k u)``, ``u = 2**-53``) of their exact value relative to themselves (sums of non-negative terms, each
subtraction and product rounded once), and ``c_ab`` within ``gamma(m + 2) sqrt(m2_a m2_b)`` (Cauchy-Schwarz
bounds the sum of ``|x y|``); each merge adds a few roundings of the same kind, and the error of a chunk's
mean enters the merged moments scaled by ``sqrt(1 + mean**2 / variance)``. Hence ``pcc`` is within about
``gamma(5 n) (1 + |pcc|)`` of the exact correlation for ``n`` elements whose mean is not large against
their spread, whatever the grouping: ``tests/rounding.py`` writes that bound down for the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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
    def finite(self) -> bool:
        """False when a moment left the float64 range (values near 1e154 squared)."""
        return all(math.isfinite(v) for v in (self.mean_a, self.mean_b, self.m2_a, self.m2_b, self.c_ab))

    @property
    def pearson(self) -> float:
        """The Pearson correlation (NaN under two positions or with a constant side), as ``compare.logits``'s,
        clamped to [-1, 1]."""
        denominator = math.sqrt(self.m2_a * self.m2_b)
        if self.n < 2 or not denominator > 0:
            return math.nan
        return max(-1.0, min(1.0, self.c_ab / denominator))


NO_MOMENTS = Moments(0, 0.0, 0.0, 0.0, 0.0, 0.0)


# Elements widened at a time: two float64 blocks of 512 KiB stay in a core's L2 cache next to the kernel's
# float32 work arrays (bench/bench_measure.py, two 64 MiB float32 tensors: 0.17-0.20 CPU s, 0.23 in whole chunks)
MOMENT_BLOCK = 1 << 16


def chunk_moments(a: np.ndarray, b: np.ndarray, work_a: np.ndarray, work_b: np.ndarray) -> Moments:
    """The moments of finite elements ``a`` and ``b`` (same length), centred in the float64 ``work`` arrays
    (at least ``min(len(a), 2**16)`` long; their contents are overwritten), a block at a time."""
    m = a.size
    if m > MOMENT_BLOCK:
        found = NO_MOMENTS
        for start in range(0, m, MOMENT_BLOCK):
            stop = start + MOMENT_BLOCK
            found = found.merge(chunk_moments(a[start:stop], b[start:stop], work_a, work_b))
        return found
    if not m:
        return NO_MOMENTS
    x, y = work_a[:m], work_b[:m]
    np.copyto(x, a)  # float32 and float64 values are exact in float64
    np.copyto(y, b)
    mean_a, mean_b = float(np.sum(x)) / m, float(np.sum(y)) / m
    np.subtract(x, mean_a, out=x)
    np.subtract(y, mean_b, out=y)
    return Moments(m, mean_a, mean_b, float(np.dot(x, x)), float(np.dot(y, y)), float(np.dot(x, y)))
