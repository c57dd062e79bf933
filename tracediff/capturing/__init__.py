"""Capture: record every module call of a forward pass into a trace folder.

Two entry points write the standard trace of transformers' debugger:

* ``tracediff.capture(model, out_dir)``: the native capture, with call
  indices, parent outputs, numeric statistics, typed arguments and metadata;
  see :mod:`tracediff.capturing.session`.
* ``tracediff.model_addition_debugger_context(model, debug_path)``: a drop-in
  for transformers' context manager with the same output;
  see :mod:`tracediff.capturing.compat`.

The names are imported when first used: the command line reads the runtimes' declared options
(:mod:`tracediff.capturing.adapters`) without importing torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..format import METADATA_FILE

if TYPE_CHECKING:
    from .compat import model_addition_debugger_context
    from .model_file import capture_file
    from .session import CaptureSession, capture
    from .verify import Verification

__all__ = ["capture", "capture_file", "CaptureSession", "model_addition_debugger_context", "Verification",
           "METADATA_FILE"]
_LAZY = {"capture": "session", "CaptureSession": "session", "model_addition_debugger_context": "compat",
         "Verification": "verify", "capture_file": "model_file"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
