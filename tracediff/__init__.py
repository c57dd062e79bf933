"""tracediff: find where two implementations of a neural network first disagree.

Capture both implementations, then align the traces::

    import tracediff

    with tracediff.capture(reference, "traces/orig"):
        reference(x)
    with tracediff.capture(port, "traces/port"):
        port(x)
    result = tracediff.align("traces/orig", "traces/port", atol=1e-5)
    print(result.first_divergence)

The implementations live in subpackages whose names do not collide with the
public functions: :mod:`tracediff.capturing`, :mod:`tracediff.alignment`,
:mod:`tracediff.trace`, :mod:`tracediff.steps`. ``import tracediff`` is light:
each public name below is imported on first use (PEP 562), so the command
line starts without torch or pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import (
    CaptureSpecError,
    DumpFormatError,
    InputsFileError,
    OutputDirError,
    PayloadError,
    PayloadFormatError,
    TeacherForcingError,
    TracediffError,
    TraceFormatError,
    UnsafePathError,
    UsageError,
)

# public name -> module that defines it
_LAZY = {
    "capture": "capturing",
    "capture_file": "capturing",
    "CaptureSession": "capturing",
    "Verification": "capturing",
    "model_addition_debugger_context": "capturing",
    "load_trace": "trace",
    "Trace": "trace",
    "Node": "trace",
    "TensorRecord": "trace",
    "align": "alignment",
    "assert_traces_close": "alignment",
    "Alignment": "alignment",
    "TensorComparison": "alignment",
    "Unmatched": "alignment",
    "ArgumentDiff": "alignment",
    "StepRecorder": "steps",
    "compare_steps": "steps",
    "StepComparison": "steps",
    "StepDivergence": "steps",
    "StepSummary": "steps",
    "replay": "replaying",
    "Replay": "replaying",
    "attribute": "attribution",
    "Attribution": "attribution",
    "import_dump": "importers",
    "ImportResult": "importers",
}

if TYPE_CHECKING:
    from .alignment import Alignment, ArgumentDiff, TensorComparison, Unmatched, align, assert_traces_close
    from .attribution import Attribution, attribute
    from .capturing import CaptureSession, Verification, capture, capture_file, model_addition_debugger_context
    from .importers import ImportResult, import_dump
    from .replaying import Replay, replay
    from .steps import StepComparison, StepDivergence, StepRecorder, StepSummary, compare_steps
    from .trace import Node, TensorRecord, Trace, load_trace


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tracediff' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__",
    *_LAZY,
    "TracediffError",
    "TraceFormatError",
    "UnsafePathError",
    "PayloadError",
    "PayloadFormatError",
    "CaptureSpecError",
    "InputsFileError",
    "OutputDirError",
    "UsageError",
    "DumpFormatError",
    "TeacherForcingError",
]
