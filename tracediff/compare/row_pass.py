"""What a row needs beyond the error metrics, gathered in the same chunked pass (:mod:`tracediff.compare.metrics`).

``align`` shows two more things for a pair compared from its payloads: its
Pearson correlation (``pcc``) and, for a pair out of tolerance with a
sequence dimension, the first position holding an element beyond tolerance
and how many positions do (:mod:`tracediff.compare.positions`). Both are
accumulated chunk by chunk next to the metrics, so that each payload pair is
read once; the work arrays stay one chunk long.

**pcc** is computed from the difference ``d = a - b``, not from ``b``: with
``a' = a - K`` and ``d' = d - L`` (``K`` and ``L`` 0, or the first finite
elements of ``a`` and ``d`` when the first chunk shows a mean that is large
against the spread, so that large means and constant offsets do not cancel),

    var(a) = E[a'^2] - E[a']^2,  var(d) = E[d'^2] - E[d']^2,  cov(a, d) = E[a'd'] - E[a']E[d']
    pcc = (var(a) - cov(a, d)) / sqrt(var(a) (var(a) - 2 cov(a, d) + var(d)))

so ``1 - pcc``, the part that matters for a port close to its reference, comes
from the small quantities ``cov(a, d)`` and ``var(d)`` rather than from the
difference of two nearly equal sums. Unshifted, the sums of squares are those
the metrics take anyway, so pcc costs three more reductions per chunk (``sum
a``, ``sum d``, ``a.d``). Each chunk's sums are taken in its work
dtype (float32 unless a side is float64) and added in float64; against the
two-pass float64 ``pearson`` of :mod:`tracediff.compare.logits` the result
differs in rounding only (tests/alignment/test_row_pass.py states the bound).
When the pass cannot vouch for its result (``var(a)`` or ``var(b)`` within
rounding of zero, a sum that left the float range) it answers None and the
caller computes ``pearson`` from the payloads instead: a constant tensor, a
side of subnormals, values near the float range. That is the only second read.

**Positions** are taken from the very elements the mismatch count found out of
tolerance, so a row's ``positions_beyond`` and its ``mismatched`` count agree
on what failed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .positions import PositionErrors, beyond_elements, positions_of

# var(a) or var(b) below this fraction of the sums it is taken from is rounding: a float32 dot product over a
# chunk is good to about 1e-6 of its value.
_CONSTANT = 1e-5


class PearsonSums:
    """The sums of the pcc above, over the finite positions of every chunk added."""

    __slots__ = ("n", "shift_a", "shift_d", "sa", "saa", "sd", "sdd", "sad")

    def __init__(self) -> None:
        self.n = 0
        self.shift_a: float | None = None  # decided on the first chunk
        self.shift_d = 0.0
        self.sa = self.saa = self.sd = self.sdd = self.sad = 0.0

    def add(self, a: np.ndarray, diff: np.ndarray, sum_aa: float, sum_dd: float, work_a: np.ndarray,
            work_d: np.ndarray) -> None:
        """Add a chunk: ``a`` and the signed ``diff = a - b`` (finite, same length), with ``sum_aa`` and
        ``sum_dd``, the sums of their squares (the metrics take them anyway); ``work_a``, ``work_d``: scratch
        arrays of at least ``a``'s length, used only for a side that is shifted."""
        if not a.size:
            return
        sa, sd = float(np.sum(a)), float(np.sum(diff))
        if self.shift_a is None:
            # Shift a side only when its mean is large against its spread in the first chunk (rare: a bias, a
            # constant offset between the sides); otherwise its sums are the metrics' own, at no cost.
            self.shift_a = _shift(a, sa, sum_aa)
            self.shift_d = _shift(diff, sd, sum_dd)
        m = a.size
        if self.shift_a:
            a = np.subtract(a, a.dtype.type(self.shift_a), out=work_a[:m])
            sa, sum_aa = float(np.sum(a)), float(np.dot(a, a))
        if self.shift_d:
            diff = np.subtract(diff, diff.dtype.type(self.shift_d), out=work_d[:m])
            sd, sum_dd = float(np.sum(diff)), float(np.dot(diff, diff))
        self.n += m
        self.sa += sa
        self.saa += sum_aa
        self.sd += sd
        self.sdd += sum_dd
        self.sad += float(np.dot(a, diff))

    def pcc(self) -> float | None:
        """The Pearson correlation; NaN with fewer than two positions; None when the sums cannot tell."""
        n = self.n
        if n < 2:
            return math.nan
        if not all(math.isfinite(s) for s in (self.sa, self.saa, self.sd, self.sdd, self.sad)):
            return None
        ma, md = self.sa / n, self.sd / n
        var_a = self.saa / n - ma * ma
        var_d = self.sdd / n - md * md
        cov_ad = self.sad / n - ma * md
        var_b = var_a - 2 * cov_ad + var_d
        if var_a <= _CONSTANT * (self.saa / n) or var_b <= _CONSTANT * (var_a + var_d) \
                or var_d < _CONSTANT * (self.sdd / n):  # a mean the first chunk did not show: sums cancelled
            return None
        return max(-1.0, min(1.0, (var_a - cov_ad) / math.sqrt(var_a * var_b)))


def _shift(x: np.ndarray, total: float, squares: float) -> float:
    """The value to subtract from ``x`` before summing (its first element), or 0 when its mean is small: a
    squared mean under 1% of the mean square loses at most two digits of the variance to cancellation."""
    n = x.size
    return float(x[0]) if (total / n) ** 2 > 1e-2 * (squares / n) else 0.0


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
