"""Rounding bounds that tests derive their floating-point tolerances from.

The one fact used (Higham, *Accuracy and Stability of Numerical Algorithms*, section 4.2): a sum of ``k``
terms computed in floating point with unit roundoff ``u``, **in any order and any grouping**, is within
``gamma(k - 1) * sum |terms|`` of the exact sum, ``gamma(k) = k u / (1 - k u)``; a product rounded before it
is summed adds one ``u`` (``gamma(k)`` for a dot product). SIMD lanes (8 on AVX2, 16 on AVX-512), pairwise
summation, BLAS blocking, threads and chunking are all groupings, so a bound built from it holds on any
x86-64 CPU, with ``TRACEDIFF_REORDER=1`` or without. Two computations of the same quantity, each within
``e`` of the exact value, are within ``2 e`` of each other.

How the comparison kernel computes (``tracediff/compare/metrics.py``): elementwise work and the sums within a
chunk of at most ``CHUNK`` elements run in float32 (float64 when a side is float64); the chunks' sums are added
in float64. ``pcc`` comes from float64 moments (``tracediff/compare/moments.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tracediff.compare import metrics

U32 = 2.0 ** -24  # unit roundoff of float32, round to nearest
U64 = 2.0 ** -53  # of float64


def gamma(k: int, u: float) -> float:
    """``k u / (1 - k u)``: the relative error bound of ``k`` rounded operations in a row."""
    assert k * u < 1, "no bound: too many terms for this precision"
    return k * u / (1 - k * u)


def unit_of(*dtypes: str) -> float:
    """The unit roundoff the kernel works in for a pair of these dtypes (float64 when a side is)."""
    return U64 if any("float64" in d for d in dtypes) else U32


def chunked_sum(n: int, u: float) -> float:
    """Relative error bound of the kernel's sum of ``n`` non-negative products (``|a - b|``, ``(a - b)^2``,
    ``a.a``, ``b.b``): chunks of ``m = min(n, CHUNK)`` terms in precision ``u``, the chunks added in float64.
    A shorter chunk (another order, ``TRACEDIFF_REORDER``) only lowers it."""
    if n <= 0:
        return 0.0
    m = min(n, metrics.CHUNK)
    return gamma(m + 1, u) + gamma(math.ceil(n / m) + 1, U64)


def cosine_error(n: int, u: float, cosine: float) -> float:
    """Bound on ``|computed - exact|`` of the kernel's cosine of ``n`` elements: the dot product within
    ``chunked_sum * sum |a b| <= chunked_sum * |a| |b|`` (Cauchy-Schwarz), each squared norm within
    ``chunked_sum`` relative (halved by the square root), one rounding for the quotient."""
    e = chunked_sum(n, u)
    return e + abs(cosine) * (e + 2 * U64)


def pcc_error(n: int, pcc: float, kappa: float) -> float:
    """Bound on ``|computed - exact|`` of a ``pcc`` of ``n`` elements from float64 moments
    (``tracediff/compare/moments.py``), one process or merged from ranks' slices.

    Each chunk's centred moments carry ``gamma(m + 2)`` (one subtraction, one product, the sum); each Chan
    merge adds four roundings to non-negative terms (at most ``n`` merges); the error of a chunk's mean
    enters a merge scaled by ``sqrt(kappa)``, ``kappa = 1 + mean^2 / variance`` of the larger side. ``pcc`` is
    ``c / sqrt(m2_a m2_b)`` with ``|dc| <= e sqrt(m2_a m2_b)``: within ``e (1 + |pcc|)``."""
    e = gamma(5 * n + 8, U64) * (1 + 2 * math.sqrt(kappa))
    return e * (1 + abs(pcc)) + 2 * U64


def kappa(a: Any, b: Any) -> float:
    """``1 + mean^2 / variance`` of the side where it is larger, over the elements finite on both (float64)."""
    x, y = (np.asarray(v, np.float64).reshape(-1) for v in (a, b))
    keep = np.isfinite(x) & np.isfinite(y)
    worst = 1.0
    for v in (x[keep], y[keep]):
        var = float(np.var(v)) if v.size else 0.0
        if var > 0:
            worst = max(worst, 1 + float(np.mean(v)) ** 2 / var)
    return worst


def mean_error(n: int, u: float) -> float:
    """Relative error bound of the kernel's ``mean_abs_err`` or ``rms_err`` of ``n`` elements against their exact
    value: ``|a - b|`` rounded once in the work precision ``u``, the chunked sum, a quotient and a square root
    in float64 (the root halves a relative error, so the mean's bound covers it)."""
    return u + chunked_sum(n, u) + 2 * U64
