"""Attribution: which calls of a quantized or low-precision model cost the most of its final error?

``tracediff.attribute(model_b, trace_a)`` ranks B's calls (decoder layers,
leaves, or a glob) by the share of the final-output error that goes away when
the call's own math is restored, with each call's local error on A's inputs
beside it: one forward of B per ranked call instead of one quantization and
one evaluation per layer. See :mod:`.engine` for a tour and
``docs/attribution.md`` for a walk-through.
"""

from .engine import attribute
from .final import FinalError
from .result import AttributedCall, Attribution, BudgetStep, SkippedUnit
from .scan import ScanResult, sensitivity_scan

__all__ = ["attribute", "Attribution", "AttributedCall", "BudgetStep", "SkippedUnit", "FinalError", "sensitivity_scan",
           "ScanResult"]
