"""Sums of squares and dot products that neither underflow nor overflow.

``sqrt(sum x**2)`` underflows to 0 for float64 values below about 1e-154
(and float32 ones below about 1e-19) and overflows above the square root of
the largest float. Like BLAS ``nrm2``, each vector is first divided by a
power of two near its largest magnitude, so the sum runs on values of at
most 1 and the scale is kept apart as an exponent. Powers of two make the
division exact; only values more than ~2**-1000 below the largest, whose
squares could not change the sum anyway, are lost.

A ``ScaledSum`` keeps a running total as ``value * 2**exp`` across chunks,
with no bound on ``exp``; it is turned into a float only at the end.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ScaledSum", "exponent_of", "scale_down", "scaled_sums", "safe_ldexp", "sums_are_safe"]


def exponent_of(largest: float) -> int:
    """``e`` with ``largest / 2**e`` in [0.5, 1); 0 for 0, inf or NaN (nothing to scale)."""
    if largest == 0 or not math.isfinite(largest):
        return 0
    return math.frexp(largest)[1]


def scale_down(x: Any, exp: int) -> Any:
    """``x / 2**exp`` exactly, in two steps so that neither factor overflows (``|exp|`` up to ~2100)."""
    if exp == 0:
        return x
    half = -exp // 2
    return x * (2.0 ** half) * (2.0 ** (-exp - half))


def safe_ldexp(value: float, exp: int) -> float:
    """``value * 2**exp`` as a float: ``inf`` (signed) on overflow, 0 on underflow."""
    try:
        return math.ldexp(value, exp)
    except OverflowError:
        return math.copysign(math.inf, value)


class ScaledSum:
    """A running total kept as ``value * 2**exp``; ``add`` aligns exponents, so no partial sum leaves range."""

    __slots__ = ("value", "exp")

    def __init__(self) -> None:
        self.value = 0.0
        self.exp = 0

    def add(self, value: float, exp: int = 0) -> None:
        if value == 0:
            return
        if self.value == 0:
            self.value, self.exp = value, exp
            return
        top = max(self.exp, exp)
        self.value = safe_ldexp(self.value, self.exp - top) + safe_ldexp(value, exp - top)
        self.exp = top

    def __float__(self) -> float:
        return safe_ldexp(self.value, self.exp)

    @property
    def is_zero(self) -> bool:
        return self.value == 0


# The smallest sum of squares, per element, from which no square that matters has underflowed: the largest
# square is then at least tiny / eps, so squares down to eps times it are still normal numbers.
_SAFE_FLOOR = {np.dtype(np.float32): 2.0 ** -126 * 2.0 ** 24, np.dtype(np.float64): 2.0 ** -1022 * 2.0 ** 53}


def sums_are_safe(squares: list[float], n: int, dtype: np.dtype[Any]) -> bool:
    """True when sums of squares computed directly in ``dtype`` over ``n`` elements lost nothing to range.

    Each must be finite (no square or partial sum overflowed) and at least ``n``
    times the floor above (no square that matters underflowed).
    """
    floor = _SAFE_FLOOR.get(dtype, _SAFE_FLOOR[np.dtype(np.float32)]) * n
    return all(floor <= s < math.inf for s in squares)


def scaled_sums(a: np.ndarray, b: np.ndarray) -> tuple[tuple[float, int], ...]:
    """``sum |a - b|``, ``sum (a - b)**2``, ``<a, b>``, ``<a, a>``, ``<b, b>``, each as ``(value, exp)``.

    Computed in float64 on each vector divided by a power of two near its
    largest magnitude. A difference that overflows float64 stays ``inf``.
    """
    a, b = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    d = np.abs(a - b)
    ka, kb, kd = (exponent_of(float(np.max(np.abs(x)))) if x.size else 0 for x in (a, b, d))
    sa, sb, sd = scale_down(a, ka), scale_down(b, kb), scale_down(d, kd)
    values = [float(np.sum(sd)), float(np.dot(sd, sd)), float(np.dot(sa, sb)), float(np.dot(sa, sa)),
              float(np.dot(sb, sb))]
    return tuple(zip(values, (kd, 2 * kd, ka + kb, 2 * ka, 2 * kb)))
