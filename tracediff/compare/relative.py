"""The relative error of a candidate ``b`` against a reference ``a``: one formula, one rule for NaN and zeros.

::

    relative_mse(a, b) = sum_F (b - a)^2 / sum_F a^2
    relative_rms(a, b) = sqrt(relative_mse(a, b)) = rms(b - a) / rms(a)

over ``F``, the positions where both ``a`` and ``b`` are finite, in float64 (the same ``F`` as every metric of
:mod:`tracediff.compare.metrics`). The rule, clause by clause:

* **NaN or infinity** on either side leaves that position out of both sums. A non-finite mismatch is a
  finding of its own (``nan_mismatch``, ``inf_mismatch``), never blended into this number.
* **A zero reference** (``sum_F a^2 == 0``: ``a`` all zeros, or ``F`` empty): the error is ``0.0`` when the
  difference is zero too (``b`` equals ``a`` there, or nothing is finite on both sides), else ``inf``.
* **Several tensors** measured as one (:class:`SquareSums` added with ``+``): their sums are added first, so
  the pooled error is the error of the tensors laid end to end.
* **Two RMS values already measured** (``rms_err`` and ``rms(a)``): :func:`relative_of` divides them under
  the same zero rule; a NaN in either gives NaN.

The sums are plain float64: values beyond about ``1e154`` overflow their squares (the result is then ``inf``
or NaN). ``a`` and ``b`` are numpy arrays, payloads or torch tensors of any real dtype (bfloat16 and float8
read from their bits); torch is imported only to read a tensor.

Example::

    >>> import numpy as np
    >>> relative_rms(np.array([3.0, 4.0]), np.array([3.0, 4.5]))
    0.1
    >>> relative_rms(np.zeros(2), np.ones(2)), relative_rms(np.zeros(2), np.zeros(2))
    (inf, 0.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..trace.payload import as_floats, payload_of

__all__ = ["SquareSums", "relative_mse", "relative_of", "relative_rms", "square_sums"]


def relative_of(error: float, reference: float) -> float:
    """``error / reference`` under the zero rule: ``0.0`` when both are 0, ``inf`` when only ``reference`` is;
    NaN when either is NaN. ``error`` and ``reference`` are two RMS values, or two sums of squares."""
    if math.isnan(error) or math.isnan(reference):
        return math.nan
    if reference > 0:
        return error / reference
    return 0.0 if error == 0 else math.inf


@dataclass(frozen=True)
class SquareSums:
    """``sum_F (b - a)^2`` (``error``) and ``sum_F a^2`` (``reference``) over ``count`` finite positions."""

    error: float = 0.0
    reference: float = 0.0
    count: int = 0

    def __add__(self, other: SquareSums) -> SquareSums:
        return SquareSums(self.error + other.error, self.reference + other.reference, self.count + other.count)

    @property
    def relative_mse(self) -> float:
        """``sum_F (b - a)^2 / sum_F a^2`` (zero rule of :func:`relative_of`)."""
        return relative_of(self.error, self.reference)

    @property
    def relative_rms(self) -> float:
        """``sqrt(relative_mse)``: ``rms(b - a) / rms(a)`` over ``F``."""
        return math.sqrt(self.relative_mse)

    @property
    def rms_err(self) -> float:
        """``sqrt(sum_F (b - a)^2 / count)``: the RMS of the difference (0 when nothing is finite on both sides)."""
        return math.sqrt(self.error / self.count) if self.count else 0.0


def square_sums(a: Any, b: Any) -> SquareSums:
    """The sums of squares of ``b - a`` and of ``a`` over the positions where both are finite (same size)."""
    x, y = _float64(a), _float64(b)
    if x.size != y.size:
        raise ValueError(f"relative error of tensors of different sizes: {x.size} and {y.size}")
    keep = np.isfinite(x) & np.isfinite(y)
    if not keep.all():
        x, y = x[keep], y[keep]
    diff = y - x
    return SquareSums(float(np.dot(diff, diff)), float(np.dot(x, x)), int(x.size))


def relative_rms(a: Any, b: Any) -> float:
    """``rms(b - a) / rms(a)`` over the positions where both are finite; see the module's rule for NaN and zeros."""
    return square_sums(a, b).relative_rms


def relative_mse(a: Any, b: Any) -> float:
    """``sum (b - a)^2 / sum a^2`` over the positions where both are finite (the square of :func:`relative_rms`)."""
    return square_sums(a, b).relative_mse


def _float64(value: Any) -> np.ndarray:
    payload = payload_of(value)
    with np.errstate(invalid="ignore", over="ignore"):
        return as_floats(payload.values, payload.dtype, np.float64).reshape(-1)
