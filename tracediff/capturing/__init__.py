"""Capture: record every module call of a forward pass into a trace folder.

Two entry points write the standard trace of transformers' debugger:

* ``tracediff.capture(model, out_dir)``: the native capture, with call
  indices, parent outputs, numeric statistics, typed arguments and metadata;
  see :mod:`tracediff.capturing.session`.
* ``tracediff.model_addition_debugger_context(model, debug_path)``: a drop-in
  for transformers' context manager with the same output;
  see :mod:`tracediff.capturing.compat`.
"""

from ..format import METADATA_FILE
from .compat import model_addition_debugger_context
from .session import CaptureSession, capture
from .verify import Verification

__all__ = ["capture", "CaptureSession", "model_addition_debugger_context", "Verification", "METADATA_FILE"]
