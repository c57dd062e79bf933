"""The exceptions tracediff raises on bad input.

Every message is one line: the file or node concerned, what was expected and
what was found, and, where there is one, what to do about it. The CLI prints
that line and exits with code 2. A divergence between two traces is a result,
never an exception.

Every class is also the matching builtin, so code that knows nothing of
tracediff can still catch it: problems with what a file holds or with the
arguments are ``ValueError`` s, problems with reading or writing a file are
``OSError`` s (``errno`` is None), and all of them are ``TracediffError`` s.
"""

from __future__ import annotations

__all__ = [
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


class TracediffError(Exception):
    """Base class: bad input that tracediff refuses with a one-line message."""


class TraceFormatError(TracediffError, ValueError):
    """A trace file is missing, truncated, not JSON, or not a trace."""


class UnsafePathError(TracediffError, ValueError):
    """A tensor path in a trace points outside the trace directory."""


class PayloadError(TracediffError, OSError):
    """A safetensors payload is missing, truncated or corrupt."""


class PayloadFormatError(TraceFormatError):
    """A payload is a readable safetensors file that breaks the format: not one tensor under the key ``data``."""


class CaptureSpecError(TracediffError, ValueError):
    """A capture SPEC does not import, or its function returns the wrong thing."""


class InputsFileError(TracediffError, OSError):
    """An inputs file is missing, corrupt, or lacks the keys the model needs."""


class OutputDirError(TracediffError, OSError):
    """An output location exists, is a file, or cannot be written."""


class UsageError(TracediffError, ValueError):
    """Arguments that do not fit together (a bad tolerance pattern, an unknown format)."""


class DumpFormatError(TracediffError, ValueError):
    """A dump to import (``tracediff import``) is malformed, unsafe, or not of the kind named."""


class TeacherForcingError(UsageError):
    """A teacher-forcing reference cannot feed the port: no generated tokens, another vocabulary or prompt."""
