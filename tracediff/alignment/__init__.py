"""Align: compare two traces and report where they first diverge.

See :mod:`tracediff.alignment.engine` for a tour, :mod:`tracediff.compare.metrics`
for the metric definitions and :mod:`tracediff.compare.tolerance` for the pass
rule's defaults and overrides.
"""

from typing import Any

from .engine import align, assert_traces_close
from .result import Alignment, ArgumentDiff, TensorComparison, Unmatched

_FROM_METRICS = ("METRICS", "PairMetrics", "compare_tensors")  # import numpy: loaded when first used


def __getattr__(name: str) -> Any:
    if name in _FROM_METRICS:
        from ..compare import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["align", "assert_traces_close", "Alignment", "TensorComparison", "Unmatched", "ArgumentDiff",
           "compare_tensors", "PairMetrics", "METRICS"]
