"""Which positions of a sequence dimension hold an element beyond tolerance.

For a pair shaped ``[batch, seq, hidden]`` (or ``[batch, heads, seq, dim]``),
``positions_beyond_tolerance`` says the first position along ``seq`` where some
element breaks the pass rule ``|a - b| <= atol + rtol * |a|`` (``a`` the
reference; NaN against NaN and an infinity against the same infinity pass,
as in :mod:`tracediff.compare.rule`), and how many positions do. A bug that
appears only from position N on (a rotary offset, a sliding window, a causal
mask) is named by that N.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PositionErrors:
    """Positions along ``dim`` with an element out of tolerance: the first (None: none) and the count."""

    dim: int
    first: int | None
    count: int
    length: int


def sequence_dim(shape: tuple[int, ...], length: int) -> int | None:
    """The dimension of ``shape`` that runs along a sequence of ``length`` tokens, or None.

    The batch (first) and feature (last) dimensions are left out, except in a
    ``[batch, seq]`` tensor; of the rest, the last one of size ``length`` is
    taken (``[batch, heads, seq, dim]``: the queries of attention weights
    ``[batch, heads, q, kv]`` too).
    """
    if len(shape) == 2:
        return 1 if shape[1] == length else None
    candidates = [d for d in range(1, len(shape) - 1) if shape[d] == length]
    return candidates[-1] if candidates else None


def positions_beyond_tolerance(a: np.ndarray, b: np.ndarray, *, atol: float, rtol: float, dim: int) -> PositionErrors:
    """The positions along ``dim`` of ``a`` and ``b`` (same shape) holding an element out of tolerance."""
    return positions_of(beyond_per_position(a, b, atol=atol, rtol=rtol, dim=dim), dim)


def positions_of(per_position: np.ndarray, dim: int) -> PositionErrors:
    """The ``PositionErrors`` of a mask along ``dim`` (True: the position holds an element out of tolerance);
    masks of slices along other dims merge by ``|``."""
    hits = np.flatnonzero(per_position)
    return PositionErrors(dim, int(hits[0]) if hits.size else None, int(hits.size), int(per_position.size))


def beyond_elements(a: np.ndarray, b: np.ndarray, *, atol: float, rtol: float) -> np.ndarray:
    """Per element: whether it breaks the pass rule ``|a - b| <= atol + rtol |a|``, in float64 (NaN against
    NaN, or an infinity against the same one, is no error)."""
    a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    with np.errstate(all="ignore"):
        diff = np.abs(a64 - b64)
        bound = np.abs(a64)
        bound *= rtol
        bound += atol
        bad = np.less_equal(diff, bound)
        np.logical_not(bad, out=bad)
        del diff, bound
        if not np.isfinite(a64).all():
            bad &= ~((np.isnan(a64) & np.isnan(b64)) | (np.isinf(a64) & (a64 == b64)))
    return bad


def beyond_per_position(a: np.ndarray, b: np.ndarray, *, atol: float, rtol: float, dim: int) -> np.ndarray:
    """Per position along ``dim``: whether one of its elements breaks the pass rule."""
    bad = beyond_elements(a, b, atol=atol, rtol=rtol)
    return np.asarray(np.moveaxis(bad, dim, 0).reshape(a.shape[dim], -1).any(axis=1))


def position_error_ratios(a: np.ndarray, b: np.ndarray, *, atol: float, rtol: float, dim: int) -> np.ndarray:
    """Per position along ``dim``: the largest ``|a - b| / (atol + rtol * |a|)`` of its elements.

    At most 1 within tolerance (the pass rule above); 0 where the elements are
    equal (NaN against NaN, an infinity against the same one), infinity where
    one side is NaN or the tolerance is zero and the elements differ.
    """
    a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    with np.errstate(all="ignore"):
        diff = np.abs(a64 - b64)
        ratio = np.where(diff == 0, 0.0, diff / (atol + rtol * np.abs(a64)))
        ratio = np.where((np.isnan(a64) & np.isnan(b64)) | (np.isinf(a64) & (a64 == b64)), 0.0, ratio)
        ratio = np.where(np.isnan(ratio), np.inf, ratio)
    if not ratio.size:
        return np.zeros(a.shape[dim])
    return np.moveaxis(ratio, dim, 0).reshape(a.shape[dim], -1).max(axis=1)
