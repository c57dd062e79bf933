"""What a row needs beyond the error metrics, gathered in the same chunked pass (:mod:`tracediff.compare.metrics`).

``align`` shows two more things for a pair compared from its payloads: its
Pearson correlation (``pcc``) and, for a pair out of tolerance with a
sequence dimension, the first position holding an element beyond tolerance
and how many positions do (:mod:`tracediff.compare.positions`). Both are
accumulated chunk by chunk next to the metrics, so that each payload pair is
read once; the work arrays stay one chunk long.

**pcc** comes from float64 moments (:mod:`tracediff.compare.moments`): each
chunk's finite elements are widened to float64, centred on the chunk's own
means, reduced to their means and centred (co-)moments, and merged with the
chunks before by Chan's formula. ``align --distributed`` merges the moments of
each rank's slice with the same formula (:mod:`tracediff.compare.parts`), so
the two paths differ only in how the elements are grouped and agree to float64
rounding on any CPU: within about ``gamma(5 n) (1 + |pcc|)`` of the exact
correlation (``u = 2**-53``), where float32 chunk sums, grouped by each CPU's
SIMD width, left some 1e-7. The price is nine float64 passes over each chunk
(two widened copies, two means, two centrings, three dot products) in place of
three float32 reductions. When a moment leaves the float64 range (values near
1e154) the pass answers None and the caller computes ``pearson`` from the
payloads instead; a constant side has pcc NaN, as ``pearson`` says.

**Positions** are taken from the very elements the mismatch count found out of
tolerance, so a row's ``positions_beyond`` and its ``mismatched`` count agree
on what failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .moments import NO_MOMENTS, chunk_moments
from .positions import PositionErrors, beyond_elements, positions_of


class PearsonMoments:
    """The float64 moments of the pcc above, over the finite positions of every chunk added."""

    __slots__ = ("moments",)

    def __init__(self) -> None:
        self.moments = NO_MOMENTS

    def add(self, a: np.ndarray, b: np.ndarray, work_a: np.ndarray, work_b: np.ndarray) -> None:
        """Add a chunk of finite elements ``a`` and ``b`` (same length); ``work_a``, ``work_b``: float64 scratch
        arrays of at least that length."""
        self.moments = self.moments.merge(chunk_moments(a, b, work_a, work_b))

    def pcc(self) -> float | None:
        """The Pearson correlation; NaN with fewer than two positions or a constant side; None when a moment
        left the float64 range."""
        if self.moments.n < 2:
            return math.nan
        return self.moments.pearson if self.moments.finite else None


class PositionTracker:
    """Which positions along dimension ``dim`` of ``shape`` hold an element that failed the pass rule."""

    __slots__ = ("dim", "length", "inner", "hit")

    def __init__(self, shape: tuple[int, ...], dim: int) -> None:
        self.dim, self.length = dim, shape[dim]
        self.inner = math.prod(shape[dim + 1:])
        self.hit = np.zeros(self.length, np.bool_)

    def add(self, start: int, failed: np.ndarray) -> None:
        """Mark the positions of the elements of ``failed`` (a bool mask of the chunk starting at flat ``start``)."""
        inner, size = self.inner, failed.size
        if not size or not inner:
            return
        if inner == 1 or size <= 2 * inner:  # few elements per position, or a chunk within one or two positions
            where = np.flatnonzero(failed)
            if where.size:
                self.hit[((start + where) // inner) % self.length] = True
            return
        first = -start % inner  # the chunk's offset where its first whole position begins
        cuts = np.arange(first, size, inner)
        if first:
            cuts = np.concatenate(([0], cuts))
        segments = np.logical_or.reduceat(failed, cuts)
        if segments.any():
            self.hit[((start + cuts[segments]) // inner) % self.length] = True

    def add_rule(self, start: int, a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> None:
        """Mark the failures of a chunk by the rule itself, in float64 (chunks with a NaN or an infinity)."""
        self.add(start, beyond_elements(a, b, atol=atol, rtol=rtol))

    def result(self) -> PositionErrors:
        return positions_of(self.hit, self.dim)


@dataclass(frozen=True)
class RowExtras:
    """What the pass found for the row besides the metrics.

    ``pcc``: None when the pass could not vouch for it (see the module docstring); ``positions``: None when no
    sequence dimension was asked for.
    """

    pcc: float | None
    positions: PositionErrors | None
