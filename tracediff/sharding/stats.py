"""The recorded statistics of a global tensor, from those of its slices (a capture with ``tensors="summary"``).

Counts add up; ``min`` and ``max`` are the extremes of the slices'; ``mean`` and ``abs_mean`` are weighted by
each slice's finite elements (the statistics are taken over finite elements, ``docs/trace-format.md``
section 4); ``std`` (unbiased) is pooled from each slice's mean and spread. A statistic some slice lacks is
left out. Partial sums have no such rule: their global statistics are unknown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

_COUNTS = ("numel", "nan", "posinf", "neginf", "zeros")


def combined_stats(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The statistics of the concatenation of tensors whose statistics are ``parts``."""
    if not parts:
        return {}
    out: dict[str, Any] = {}
    for key in _COUNTS:
        if all(isinstance(p.get(key), int) for p in parts):
            out[key] = sum(p[key] for p in parts)
    for key, pick in (("min", min), ("max", max)):
        values = [p.get(key) for p in parts]
        if all(isinstance(v, (int, float)) for v in values):
            numbers = [float(v) for v in values if v is not None and not math.isnan(float(v))]
            out[key] = pick(numbers) if numbers else math.nan
    finite = [_finite(p) for p in parts]
    total = sum(f for f in finite if f is not None) if all(f is not None for f in finite) else None
    if total is None:
        return out
    weights = [f for f in finite if f is not None]
    for key in ("mean", "abs_mean"):
        values = [p.get(key) for p in parts]
        if all(isinstance(v, (int, float)) for v in values):
            out[key] = _weighted([float(v) for v in values if v is not None], weights, total)
    pairs = [(count, p.get("mean"), p.get("std")) for count, p in zip(weights, parts)]
    if "mean" in out and all(isinstance(m, (int, float)) and isinstance(sd, (int, float)) for _, m, sd in pairs):
        grand, spread = out["mean"], 0.0
        for count, mean, std in pairs:
            assert mean is not None and std is not None
            if count:  # a slice of one element has no spread of its own (its unbiased std is NaN)
                spread += (count - 1) * (float(std) ** 2 if count > 1 else 0.0) + count * (float(mean) - grand) ** 2
        out["std"] = math.sqrt(spread / (total - 1)) if total > 1 else math.nan
    return out


def _finite(stats: Mapping[str, Any]) -> int | None:
    counts = [stats.get(key) for key in ("numel", "nan", "posinf", "neginf")]
    if not isinstance(counts[0], int):
        return None
    return counts[0] - sum(c for c in counts[1:] if isinstance(c, int))


def _weighted(values: list[float], weights: list[int], total: int) -> float:
    if not total:
        return math.nan
    return sum(v * w for v, w in zip(values, weights) if w) / total
