"""The comparison's one pass over a chunked pair, compiled with numba (imported only by
:mod:`tracediff.compare.kernel`, which decides when it runs and merges what it returns).

Each element is read once from memory. For every chunk of ``chunk`` elements (the numpy path's chunks, so
that what numpy decides per chunk is decided here on the same elements) and every block of ``block``
elements in it (a few KiB, so that the block stays in the L1 cache), three loops run over the block:

* ``_sums`` (vectorised: the order of its additions is free): the five sums of the metrics, the block's
  sums for its means, the count of pairs finite on both sides, and whether a float32 difference overflows;
* ``_centred``: the block's centred (co-)moments for ``pcc``, merged block by block by Chan's formula as
  :mod:`tracediff.compare.moments` merges them;
* ``_decisions`` (strict IEEE arithmetic, integer counts only): the pass rule in both of the forms the numpy
  path counts with, and how many elements may raise the largest ``|a - b|`` or the smallest passing rtol.

The rare block that may raise a maximum, holds a NaN or an infinity, or marks positions out of tolerance is
then read again element by element. Every decision (a mismatch, a position, the largest error, the smallest
rtol) is the float64 expression the numpy path settles it with, so those results are the same bit for bit;
only the sums take another order.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..native import fused_columns as col

__all__ = ["fused_pass"]

# float32's largest finite value plus half an ulp: a float32 difference this large rounds to infinity
_FLOAT32_OVERFLOW = 3.4028235677973366e38
_FREE_ORDER = {"reassoc", "nsz"}  # sums only: their order may change, never a value's NaN or infinity
_INF = np.inf
# error_model="numpy": a division by zero gives an infinity or NaN, as in numpy, never an exception


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FREE_ORDER)
def _sums(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> tuple[int, int]:
    """Add the block's sums over its pairs finite on both sides to ``acc[0:5]``, their sums of ``a`` and ``b``
    to ``acc[5:7]``; returns (pairs finite on both sides, differences above float32's range)."""
    s_abs = 0.0
    s_sq = 0.0
    dot = 0.0
    norm_a = 0.0
    norm_b = 0.0
    sx = 0.0
    sy = 0.0
    finite = 0
    big = 0
    for i in range(a.size):
        x = np.float64(a[i])
        y = np.float64(b[i])
        both = (abs(x) < _INF) & (abs(y) < _INF)
        x = x if both else 0.0
        y = y if both else 0.0
        d = abs(x - y)
        s_abs += d
        s_sq += d * d
        dot += x * y
        norm_a += x * x
        norm_b += y * y
        sx += x
        sy += y
        finite += both
        big += d > _FLOAT32_OVERFLOW
    acc[0] += s_abs
    acc[1] += s_sq
    acc[2] += dot
    acc[3] += norm_a
    acc[4] += norm_b
    acc[5] = sx
    acc[6] = sy
    return finite, big


@njit(nogil=True, cache=True, error_model="numpy", fastmath=_FREE_ORDER)
def _centred(a: np.ndarray, b: np.ndarray, mean_a: float, mean_b: float) -> tuple[float, float, float]:
    """The block's centred moments over its pairs finite on both sides: sum of squares of a, of b, and their
    cross products."""
    qa = 0.0
    qb = 0.0
    qab = 0.0
    for i in range(a.size):
        x = np.float64(a[i])
        y = np.float64(b[i])
        both = (abs(x) < _INF) & (abs(y) < _INF)
        dx = x - mean_a if both else 0.0
        dy = y - mean_b if both else 0.0
        qa += dx * dx
        qb += dy * dy
        qab += dx * dy
    return qa, qb, qab


@njit(nogil=True, cache=True, error_model="numpy")
def _decisions(a: np.ndarray, b: np.ndarray, atol: float, rtol: float, max_abs: float, max_rel: float
               ) -> tuple[int, int, int, int]:
    """Over the block (meant for finite pairs): elements failing ``d <= atol + rtol |a|``, elements with
    ``d - rtol |a| > atol``, elements with ``d > max_abs``, and elements with ``d > 0`` and ``d >= max_rel
    |a|`` (every element whose ``d / |a|`` rounds above ``max_rel`` is among them); ``d = |a - b|``."""
    rule = 0
    excess = 0
    above = 0
    rel = 0
    for i in range(a.size):
        x = np.float64(a[i])
        y = np.float64(b[i])
        d = abs(x - y)
        ax = abs(x)
        rule += not (d <= atol + rtol * ax)
        excess += d - rtol * ax > atol
        above += d > max_abs
        rel += (d > 0.0) & (d >= max_rel * ax)
    return rule, excess, above, rel


@njit(nogil=True, cache=True, error_model="numpy")
def _smallest_rtol(rtol: float, d: float, ax: float) -> float:
    """``rtol`` raised so that ``d <= rtol * ax`` holds in float64: to ``d / ax``, then one ulp at a time."""
    q = d / ax
    if q > rtol:
        rtol = q
    while d > rtol * ax:
        rtol = np.nextafter(rtol, _INF)
    return rtol


@njit(nogil=True, cache=True, error_model="numpy")
def _maxima(a: np.ndarray, b: np.ndarray, b0: int, b1: int, max_abs: float, max_rel: float) -> tuple[float, float]:
    """``max_abs`` and ``max_rel`` raised by the block's pairs finite on both sides."""
    for i in range(b0, b1):
        x = np.float64(a[i])
        y = np.float64(b[i])
        if not (abs(x) < _INF and abs(y) < _INF):
            continue
        d = abs(x - y)
        ax = abs(x)
        if d > max_abs:
            max_abs = d
        if d > 0.0 and d >= max_rel * ax:
            max_rel = _smallest_rtol(max_rel, d, ax)
    return max_abs, max_rel


@njit(nogil=True, cache=True, error_model="numpy")
def _nonfinite(a: np.ndarray, b: np.ndarray, b0: int, b1: int, atol: float, rtol: float, narrow: bool,
               counts: np.ndarray) -> bool:
    """For a block with a NaN, an infinity or a large difference: add to ``counts`` the failures of the
    finite pairs (rule, excess), NaN and Inf mismatches, failing non-finite pairs; returns whether a float32
    difference overflowed."""
    overflow = False
    for i in range(b0, b1):
        x = np.float64(a[i])
        y = np.float64(b[i])
        if abs(x) < _INF and abs(y) < _INF:
            d = abs(x - y)
            ax = abs(x)
            counts[0] += not (d <= atol + rtol * ax)
            counts[1] += d - rtol * ax > atol
            if narrow and d > _FLOAT32_OVERFLOW and not abs(a[i] - b[i]) < _INF:
                overflow = True
            continue
        nan_a = x != x
        nan_b = y != y
        neither = not nan_a and not nan_b
        counts[2] += nan_a != nan_b
        counts[3] += neither and x != y
        counts[4] += not ((nan_a and nan_b) or (neither and x == y))
    return overflow


@njit(nogil=True, cache=True, error_model="numpy")
def _mark(a: np.ndarray, b: np.ndarray, b0: int, b1: int, atol: float, rtol: float, flat: int, inner: int,
          length: int, hit: np.ndarray) -> None:
    """Mark in ``hit`` the positions (``inner`` elements each, ``length`` of them; ``flat``: the flat index of
    ``a[0]``) of the block's elements out of tolerance, as ``positions.beyond_elements`` finds them; a
    position is scanned up to its first such element."""
    i = b0
    while i < b1:
        where = flat + i
        pos = (where // inner) % length
        end = min(b1, i + inner - where % inner)
        if not hit[pos]:
            for j in range(i, end):
                x = np.float64(a[j])
                y = np.float64(b[j])
                if not (abs(x - y) <= atol + rtol * abs(x)) and not ((x != x and y != y) or (
                        abs(x) == _INF and x == y)):
                    hit[pos] = True
                    break
        i = end


@njit(nogil=True, cache=True, error_model="numpy")
def fused_pass(a: np.ndarray, b: np.ndarray, flat: int, chunk: int, block: int, narrow: bool, atol: float,
               rtol: float, max_rel: float, inner: int, length: int, hit: np.ndarray, out: np.ndarray) -> int:
    """Fill ``out[k]`` with the metrics of chunk ``k`` of ``a`` and ``b`` (1-D, one float dtype; ``flat``:
    the flat index of their first element in the tensor) and mark in ``hit`` the positions holding an
    element out of tolerance (``length`` positions of ``inner`` elements each; ``length`` 0: none).

    ``narrow``: the numpy path works in float32, so that it counts the mismatches of a chunk with no NaN, no
    infinity and no float32 overflow by the rule ``d <= atol + rtol |a|`` (column ``FAILED_RULE``), any other
    chunk's by ``d - rtol |a| > atol`` (``FAILED_EXCESS``). ``max_rel``: the smallest rtol known to pass so
    far (carried from chunk to chunk). Returns the number of chunks."""
    n = a.size
    k = 0
    acc = np.zeros(7)
    counts = np.zeros(5, np.int64)
    max_abs = 0.0
    for c0 in range(0, n, chunk):
        c1 = min(c0 + chunk, n)
        acc[:] = 0.0
        counts[:] = 0
        finite = 0
        clean = True
        mn = 0
        mean_a = 0.0
        mean_b = 0.0
        m2_a = 0.0
        m2_b = 0.0
        c_ab = 0.0
        for b0 in range(c0, c1, block):
            b1 = min(b0 + block, c1)
            bn, big = _sums(a[b0:b1], b[b0:b1], acc)
            if bn < b1 - b0 or (narrow and big):
                if _nonfinite(a, b, b0, b1, atol, rtol, narrow, counts) or bn < b1 - b0:
                    clean = False
                max_abs, max_rel = _maxima(a, b, b0, b1, max_abs, max_rel)
                failing = True  # (rare) the positions are looked for in every element
            else:
                rule, excess, above, rel = _decisions(a[b0:b1], b[b0:b1], atol, rtol, max_abs, max_rel)
                counts[0] += rule
                counts[1] += excess
                if above or rel:
                    max_abs, max_rel = _maxima(a, b, b0, b1, max_abs, max_rel)
                failing = rule > 0
            if length > 0 and failing:
                _mark(a, b, b0, b1, atol, rtol, flat, inner, length, hit)
            if bn == 0:
                continue
            ma = acc[5] / bn
            mb = acc[6] / bn
            qa, qb, qab = _centred(a[b0:b1], b[b0:b1], ma, mb)
            if mn == 0:
                mn, mean_a, mean_b, m2_a, m2_b, c_ab = bn, ma, mb, qa, qb, qab
            else:  # Chan's update, as Moments.merge
                total = mn + bn
                da = ma - mean_a
                db = mb - mean_b
                w = mn * bn / total
                mean_a = mean_a + da * bn / total
                mean_b = mean_b + db * bn / total
                m2_a = m2_a + qa + da * da * w
                m2_b = m2_b + qb + db * db * w
                c_ab = c_ab + qab + da * db * w
                mn = total
            finite += bn
        row = out[k]
        row[col.FINITE] = finite
        row[col.MAX_ABS] = max_abs  # the largest so far (carried, as max_rel)
        row[col.MAX_REL] = max_rel
        row[col.SUM_ABS:col.NORM_B + 1] = acc[:5]
        row[col.NAN_MISMATCH] = counts[2]
        row[col.INF_MISMATCH] = counts[3]
        row[col.FAILED_RULE] = counts[0]
        row[col.FAILED_EXCESS] = counts[1]
        row[col.NONFINITE_FAILED] = counts[4]
        row[col.CLEAN] = 1.0 if clean else 0.0
        row[col.MOMENT_N] = mn
        row[col.MEAN_A] = mean_a
        row[col.MEAN_B] = mean_b
        row[col.M2_A] = m2_a
        row[col.M2_B] = m2_b
        row[col.C_AB] = c_ab
        k += 1
    return k
