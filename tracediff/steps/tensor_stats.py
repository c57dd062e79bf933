"""Statistics of one tensor, on request, as plain JSON numbers.

Low-precision floats (float16, bfloat16, float8) are widened to float32, which
holds them exactly; integers and bools are converted to float64 (integers
beyond 2**53 lose precision). Sums are accumulated in float64. Complex
tensors get no statistics.

Definitions, over the ``m`` finite elements ``f`` of a tensor of ``n`` elements:

================  ================================================================
``nan``           number of NaN elements
``posinf``        number of ``+inf`` elements
``neginf``        number of ``-inf`` elements
``zeros``         number of elements equal to zero (``-0.0`` included)
``min``           smallest non-NaN element (``-inf`` when there is one)
``max``           largest non-NaN element (``+inf`` when there is one)
``mean``          ``sum(f) / m``
``abs_mean``      ``sum(|f|) / m``
``var_biased``    ``(sum(f**2) - sum(f)**2 / m) / m``, i.e. ``sum((f - mean)**2) / m``
``var_unbiased``  the same sum divided by ``m - 1``
``std``           ``sqrt(var_unbiased)``, as ``torch.std``
``skewness``      ``(sum((f - mean)**3) / m) / m2**1.5`` (Fisher-Pearson, biased)
``kurtosis``      ``(sum((f - mean)**4) / m) / m2**2 - 3`` (excess, biased)
``median``        the lower median, ``sorted(f)[(m - 1) // 2]``, as ``torch.median``
``mode``          the most frequent finite value; the smallest one on ties
================  ================================================================

The counts, extremes and sums come from the capture's own implementation,
:func:`tracediff.capturing.stats.wide_stats` (float64 sums of ``f``, ``|f|``
and ``f**2`` in one pass over float64 chunks), so the variance's absolute
error is about
``1e-16 * max(f)**2``: relative to the variance, ``1e-16 * mean**2 / var``
(1e-8 for data of mean 1 and std 1e-4), negligible next to what separates two
runs. Skewness and kurtosis use a second, exact pass, with
``m2 = sum((f - mean)**2) / m``.

A statistic that is undefined is NaN: every one of them when ``m == 0``
(``min``/``max`` excepted when infinities are present), ``var_unbiased`` and
``std`` when ``m < 2``, ``skewness`` and ``kurtosis`` when ``m2 == 0``.
``shape``, ``dtype`` and ``hash`` are also accepted as names: every record
holds them anyway.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import torch

from ..capturing.stats import wide_stats
from .hashing import _local
from .stat_names import NUMERIC_STATS

_F64 = torch.float64
_FROM_WIDE = frozenset({"nan", "posinf", "neginf", "zeros", "min", "max", "mean", "abs_mean", "std",
                        "var_biased", "var_unbiased"})


def tensor_stats(tensor: torch.Tensor, names: Collection[str]) -> dict[str, float | int]:
    """The statistics ``names`` of ``tensor`` (see the module docstring), in ``NUMERIC_STATS`` order.

    Names outside ``NUMERIC_STATS`` are ignored; so are complex tensors (empty result).
    """
    wanted = [name for name in NUMERIC_STATS if name in names]
    t = _local(tensor)
    if not wanted or t.is_complex() or t.is_quantized:
        return {}
    x = t.reshape(-1)
    out: dict[str, float | int] = {}
    if _FROM_WIDE.intersection(wanted):
        out.update(_counts_and_moments(x))
    if {"skewness", "kurtosis", "median", "mode"}.intersection(wanted):
        f = _widened(x)
        f = f[torch.isfinite(f)]
        if "skewness" in wanted or "kurtosis" in wanted:
            out.update(_shape_moments(f, f.numel()))
        if "median" in wanted:
            out["median"] = float(f.sort().values[(f.numel() - 1) // 2]) if f.numel() else math.nan
        if "mode" in wanted:
            out["mode"] = _mode(f)
    return {name: out[name] for name in wanted}


def _counts_and_moments(x: torch.Tensor) -> dict[str, float | int]:
    if x.numel() == 0:
        return dict.fromkeys(_FROM_WIDE, math.nan) | {"nan": 0, "posinf": 0, "neginf": 0, "zeros": 0}
    try:
        stats = wide_stats(x)
    except (TypeError, RuntimeError):  # a device without float64 (e.g. MPS)
        stats = wide_stats(x.cpu())
    out = {key: stats[key] for key in ("nan", "posinf", "neginf", "zeros", "min", "max", "mean", "abs_mean", "std")}
    m = x.numel() - stats["nan"] - stats["posinf"] - stats["neginf"]  # the finite elements
    var_unbiased = stats["std"] ** 2 if m > 1 else math.nan
    return out | {"var_unbiased": var_unbiased,
                  "var_biased": var_unbiased * (m - 1) / m if m > 1 else (0.0 if m == 1 else math.nan)}


def _widened(x: torch.Tensor) -> torch.Tensor:
    """float32/float64 as they are, other floats as float32, integers and bools as float64."""
    if x.dtype in (torch.float32, _F64):
        return x
    target = torch.float32 if x.is_floating_point() else _F64
    try:
        return x.to(target)
    except (TypeError, RuntimeError):  # a device without that dtype (e.g. float64 on MPS)
        return x.cpu().to(target)


def _shape_moments(f: torch.Tensor, m: int) -> dict[str, float]:
    if m == 0:
        return {"skewness": math.nan, "kurtosis": math.nan}
    x = f.to(_F64)
    d = x - x.sum() / m
    d2 = d * d
    m2 = float(d2.sum()) / m
    if m2 <= 0:
        return {"skewness": math.nan, "kurtosis": math.nan}
    return {"skewness": float((d2 * d).sum()) / m / m2**1.5, "kurtosis": float((d2 * d2).sum()) / m / m2**2 - 3.0}


def _mode(f: torch.Tensor) -> float:
    if f.numel() == 0:
        return math.nan
    values, counts = torch.unique(f, sorted=True, return_counts=True)
    return float(values[int(torch.argmax(counts))])  # argmax returns the first maximum: the smallest value
