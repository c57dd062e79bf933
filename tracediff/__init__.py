"""tracediff: find where two implementations of a neural network first disagree.

Capture both implementations, then align the traces::

    import tracediff

    with tracediff.capture(reference, "traces/orig"):
        reference(x)
    with tracediff.capture(port, "traces/port"):
        port(x)
    result = tracediff.align("traces/orig", "traces/port", atol=1e-5)
    print(result.first_divergence)
"""

from ._version import __version__
from .align import Alignment, ArgumentDiff, TensorComparison, Unmatched, align, assert_traces_close
from .capture import CaptureSession, Verification, capture, model_addition_debugger_context
from .errors import (
    CaptureSpecError,
    InputsFileError,
    OutputDirError,
    PayloadError,
    TraceFormatError,
    TracediffError,
    UnsafePathError,
    UsageError,
)
from .steps import StepComparison, StepDivergence, StepRecorder, StepSummary, compare_steps
from .trace import Node, TensorRecord, Trace, load_trace

__all__ = [
    "__version__",
    "capture",
    "CaptureSession",
    "Verification",
    "model_addition_debugger_context",
    "load_trace",
    "Trace",
    "Node",
    "TensorRecord",
    "align",
    "assert_traces_close",
    "Alignment",
    "TensorComparison",
    "Unmatched",
    "ArgumentDiff",
    "StepRecorder",
    "compare_steps",
    "StepComparison",
    "StepDivergence",
    "StepSummary",
    "TracediffError",
    "TraceFormatError",
    "UnsafePathError",
    "PayloadError",
    "CaptureSpecError",
    "InputsFileError",
    "OutputDirError",
    "UsageError",
]
