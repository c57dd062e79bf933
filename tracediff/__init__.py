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

__all__ = [
    "__version__",
    "capture",
    "CaptureSession",
    "Verification",
    "model_addition_debugger_context",
    "TracediffError",
    "TraceFormatError",
    "UnsafePathError",
    "PayloadError",
    "CaptureSpecError",
    "InputsFileError",
    "OutputDirError",
    "UsageError",
]
