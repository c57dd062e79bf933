"""Statistics of one tensor, on request, as plain JSON numbers.

Every statistic is computed in float64 (on the tensor's device, or on the CPU
when the device has no float64), so bf16 and float8 tensors are measured
exactly as stored. Integer and bool tensors are converted to float64 too
(integers beyond 2**53 lose precision). Complex tensors get no statistics.

Definitions, over the ``m`` finite elements ``f`` of a tensor of ``n`` elements:

=============  ================================================================
``nan``        number of NaN elements
``posinf``     number of ``+inf`` elements
``neginf``     number of ``-inf`` elements
``zeros``      number of elements equal to zero (``-0.0`` included)
``min``        smallest non-NaN element (``-inf`` when there is one)
``max``        largest non-NaN element (``+inf`` when there is one)
``mean``       ``sum(f) / m``
``abs_mean``   ``sum(|f|) / m``
``var_biased`` ``sum((f - mean)**2) / m``
``var_unbiased`` ``sum((f - mean)**2) / (m - 1)``
``std``        ``sqrt(var_unbiased)``, as ``torch.std``
``skewness``   ``(sum((f - mean)**3) / m) / var_biased**1.5`` (Fisher-Pearson, biased)
``kurtosis``   ``(sum((f - mean)**4) / m) / var_biased**2 - 3`` (excess, biased)
``median``     the lower median, ``sorted(f)[(m - 1) // 2]``, as ``torch.median``
``mode``       the most frequent finite value; the smallest one on ties
=============  ================================================================

A statistic that is undefined is NaN: every one of them when ``m == 0``
(``min``/``max`` excepted when infinities are present), ``var_unbiased`` and
``std`` when ``m < 2``, ``skewness`` and ``kurtosis`` when ``var_biased == 0``.
``shape``, ``dtype`` and ``hash`` are also accepted as names: every record
holds them anyway.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import torch

from .hashing import _local

NUMERIC_STATS = (
    "nan", "posinf", "neginf", "zeros", "min", "max", "mean", "abs_mean", "std",
    "var_biased", "var_unbiased", "skewness", "kurtosis", "median", "mode",
)
ALWAYS_RECORDED = ("shape", "dtype", "hash")
STAT_NAMES = ALWAYS_RECORDED + NUMERIC_STATS
DEFAULT_STATS = frozenset({"nan", "posinf", "neginf", "zeros", "min", "max", "mean", "abs_mean", "std"})
"""Cheap statistics (a few passes over the data) recorded unless ``stats=`` says otherwise."""

_COUNTS = frozenset({"nan", "posinf", "neginf"})
_MOMENTS = frozenset({"mean", "abs_mean", "std", "var_biased", "var_unbiased", "skewness", "kurtosis"})


def tensor_stats(tensor: torch.Tensor, names: Collection[str]) -> dict[str, float | int]:
    """The statistics ``names`` of ``tensor`` (see the module docstring), in ``NUMERIC_STATS`` order.

    Names outside ``NUMERIC_STATS`` are ignored; so are complex tensors (empty result).
    """
    wanted = [name for name in NUMERIC_STATS if name in names]
    t = _local(tensor)
    if not wanted or t.is_complex() or t.is_quantized:
        return {}
    x = _as_float64(t.reshape(-1))
    n = x.numel()
    finite_mask = torch.isfinite(x)
    all_finite = bool(finite_mask.all())
    f = x if all_finite else x[finite_mask]
    m = f.numel()
    out: dict[str, float | int] = {}
    if _COUNTS.intersection(wanted):
        nan = 0 if all_finite else int(torch.isnan(x).sum())
        posinf = 0 if all_finite else int((x == math.inf).sum())
        neginf = 0 if all_finite else int((x == -math.inf).sum())
        out.update(nan=nan, posinf=posinf, neginf=neginf)
    if "zeros" in wanted:
        out["zeros"] = n - int(torch.count_nonzero(x))  # NaN counts as non-zero
    if "min" in wanted or "max" in wanted:
        out.update(zip(("min", "max"), _range(x, all_finite)))
    if _MOMENTS.intersection(wanted):
        out.update(_moments(f, m, wanted))
    if "median" in wanted:
        out["median"] = float(f.sort().values[(m - 1) // 2]) if m else math.nan
    if "mode" in wanted:
        out["mode"] = _mode(f)
    return {name: out[name] for name in wanted}


def _as_float64(x: torch.Tensor) -> torch.Tensor:
    try:
        return x.to(torch.float64)
    except (TypeError, RuntimeError):  # devices without float64 (e.g. MPS)
        return x.cpu().to(torch.float64)


def _range(x: torch.Tensor, all_finite: bool) -> tuple[float, float]:
    if not all_finite:
        x = x[~torch.isnan(x)]
    if x.numel() == 0:
        return math.nan, math.nan
    lo, hi = torch.aminmax(x)
    return float(lo), float(hi)


def _moments(f: torch.Tensor, m: int, wanted: list[str]) -> dict[str, float]:
    if m == 0:
        return dict.fromkeys(_MOMENTS, math.nan)
    mean = float(f.sum()) / m
    out = {"mean": mean}
    if "abs_mean" in wanted:
        out["abs_mean"] = float(f.abs().sum()) / m
    d = f - mean
    d2 = d * d
    ss = float(d2.sum())
    var_biased = ss / m
    var_unbiased = ss / (m - 1) if m > 1 else math.nan
    out.update(var_biased=var_biased, var_unbiased=var_unbiased, std=math.sqrt(var_unbiased))
    if "skewness" in wanted or "kurtosis" in wanted:
        if var_biased > 0:
            out["skewness"] = float((d2 * d).sum()) / m / var_biased**1.5
            out["kurtosis"] = float((d2 * d2).sum()) / m / var_biased**2 - 3.0
        else:
            out.update(skewness=math.nan, kurtosis=math.nan)
    return out


def _mode(f: torch.Tensor) -> float:
    if f.numel() == 0:
        return math.nan
    values, counts = torch.unique(f, sorted=True, return_counts=True)
    return float(values[int(torch.argmax(counts))])  # argmax returns the first maximum: the smallest value
