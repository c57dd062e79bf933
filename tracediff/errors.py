"""The exceptions tracediff raises on bad input.

Every message is one line: the file or node concerned, what was expected and
what was found, and, where there is one, what to do about it. The CLI prints
that line and exits with code 2. A divergence between two traces is a result,
never an exception.
"""

from __future__ import annotations

__all__ = [
    "TracediffError",
    "TraceFormatError",
    "UnsafePathError",
    "PayloadError",
    "CaptureSpecError",
    "InputsFileError",
    "OutputDirError",
    "UsageError",
]


class TracediffError(Exception):
    """Base class: bad input that tracediff refuses with a one-line message."""


class TraceFormatError(TracediffError):
    """A trace file is missing, truncated, not JSON, or not a trace."""


class UnsafePathError(TracediffError):
    """A tensor path in a trace points outside the trace directory."""


class PayloadError(TracediffError):
    """A safetensors payload is missing, truncated or corrupt."""


class CaptureSpecError(TracediffError):
    """A capture SPEC does not import, or its function returns the wrong thing."""


class InputsFileError(TracediffError):
    """An inputs file is missing, corrupt, or lacks the keys the model needs."""


class OutputDirError(TracediffError):
    """An output location exists, is a file, or cannot be written."""


class UsageError(TracediffError):
    """Arguments that do not fit together (a bad tolerance pattern, an unknown format)."""
