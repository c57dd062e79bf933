"""Align: compare two traces and report where they first diverge.

See :mod:`tracediff.alignment.engine` for a tour, :mod:`tracediff.alignment.metrics`
for the metric definitions and :mod:`tracediff.alignment.tolerance` for the pass
rule's defaults and overrides.
"""

from .engine import align, assert_traces_close
from .metrics import METRICS, PairMetrics, compare_tensors
from .result import Alignment, ArgumentDiff, TensorComparison, Unmatched

__all__ = ["align", "assert_traces_close", "Alignment", "TensorComparison", "Unmatched", "ArgumentDiff",
           "compare_tensors", "PairMetrics", "METRICS"]
