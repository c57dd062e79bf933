"""The names of the statistics a step record may hold (no torch: comparing records reads them too).

What each one means is in :mod:`tracediff.steps.tensor_stats`, which computes them.
"""

from __future__ import annotations

NUMERIC_STATS = (
    "nan", "posinf", "neginf", "zeros", "min", "max", "mean", "abs_mean", "std",
    "var_biased", "var_unbiased", "skewness", "kurtosis", "median", "mode",
)
ALWAYS_RECORDED = ("shape", "dtype", "hash")
STAT_NAMES = ALWAYS_RECORDED + NUMERIC_STATS
DEFAULT_STATS = frozenset({"nan", "posinf", "neginf", "zeros", "min", "max", "mean", "abs_mean", "std"})
"""Cheap statistics (a few reductions, no copy of a float32 tensor) recorded unless ``stats=`` says otherwise."""
