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

The variance comes from the float64 sums of ``f`` and ``f**2`` in one pass
(two reductions, no copy of the tensor), so its absolute error is about
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

from .hashing import _local
from .stat_names import NUMERIC_STATS

_COUNTS = frozenset({"nan", "posinf", "neginf"})
_SUMS = frozenset({"mean", "abs_mean", "std", "var_biased", "var_unbiased"})
_F64 = torch.float64


def tensor_stats(tensor: torch.Tensor, names: Collection[str]) -> dict[str, float | int]:
    """The statistics ``names`` of ``tensor`` (see the module docstring), in ``NUMERIC_STATS`` order.

    Names outside ``NUMERIC_STATS`` are ignored; so are complex tensors (empty result).
    """
    wanted = [name for name in NUMERIC_STATS if name in names]
    t = _local(tensor)
    if not wanted or t.is_complex() or t.is_quantized:
        return {}
    x = _widened(t.reshape(-1))
    n = x.numel()
    lo, hi = (float(v) for v in torch.aminmax(x)) if n else (math.nan, math.nan)
    all_finite = math.isfinite(lo) and math.isfinite(hi)  # aminmax propagates NaN
    f = x if all_finite else x[torch.isfinite(x)]
    m = f.numel()
    out: dict[str, float | int] = {}
    if _COUNTS.intersection(wanted):
        nan = 0 if all_finite else int(torch.isnan(x).sum())
        posinf = 0 if all_finite else int((x == math.inf).sum())
        neginf = 0 if all_finite else int((x == -math.inf).sum())
        out.update(nan=nan, posinf=posinf, neginf=neginf)
    if "zeros" in wanted:
        straddles = not all_finite or lo <= 0 <= hi
        out["zeros"] = n - int(torch.count_nonzero(x)) if straddles else 0  # NaN counts as non-zero
    if "min" in wanted or "max" in wanted:
        if not all_finite:
            lo, hi = _range_without_nan(x)
        out.update(min=lo, max=hi)
    if _SUMS.intersection(wanted):
        out.update(_from_sums(f, m))
    if "skewness" in wanted or "kurtosis" in wanted:
        out.update(_shape_moments(f, m))
    if "median" in wanted:
        out["median"] = float(f.sort().values[(m - 1) // 2]) if m else math.nan
    if "mode" in wanted:
        out["mode"] = _mode(f)
    return {name: out[name] for name in wanted}


def _widened(x: torch.Tensor) -> torch.Tensor:
    """float32/float64 as they are, other floats as float32, integers and bools as float64."""
    if x.dtype in (torch.float32, _F64):
        return x
    target = torch.float32 if x.is_floating_point() else _F64
    try:
        return x.to(target)
    except (TypeError, RuntimeError):  # a device without that dtype (e.g. float64 on MPS)
        return x.cpu().to(target)


def _range_without_nan(x: torch.Tensor) -> tuple[float, float]:
    x = x[~torch.isnan(x)]
    if x.numel() == 0:
        return math.nan, math.nan
    lo, hi = torch.aminmax(x)
    return float(lo), float(hi)


def _from_sums(f: torch.Tensor, m: int) -> dict[str, float]:
    if m == 0:
        return dict.fromkeys(_SUMS, math.nan)
    total = float(f.sum(dtype=_F64))
    abs_total = float(torch.linalg.vector_norm(f, 1, dtype=_F64))
    squares = float(torch.linalg.vector_norm(f, 2, dtype=_F64)) ** 2
    ss = max(squares - total * total / m, 0.0)  # rounding can take it just below zero
    var_unbiased = ss / (m - 1) if m > 1 else math.nan
    return {"mean": total / m, "abs_mean": abs_total / m, "var_biased": ss / m,
            "var_unbiased": var_unbiased, "std": math.sqrt(var_unbiased)}


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
