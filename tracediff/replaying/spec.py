"""The model of a SPEC, for ``tracediff replay``: the function may return a model or ``(model, inputs)``."""

from __future__ import annotations

from torch import nn

from ..capturing.spec import _describe, _import_target
from ..errors import CaptureSpecError


def load_model(spec: str) -> nn.Module:
    """Import the SPEC's function (``file.py:function`` or ``package.module:function``), call it, return the model."""
    target, sep, func_name = spec.rpartition(":")
    if not sep or not target or not func_name:
        raise CaptureSpecError(f"{spec}: expected package.module:function or path/to/script.py:function")
    module = _import_target(spec, target)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise CaptureSpecError(f"{spec}: {target} has no function {func_name!r}")
    try:
        result = func()
    except Exception as e:  # noqa: BLE001 - the user's code; reported in one line
        raise CaptureSpecError(f"{spec}: calling {func_name}() raised {_describe(e)}") from e
    model = result[0] if isinstance(result, tuple) and len(result) == 2 else result
    if not isinstance(model, nn.Module):
        raise CaptureSpecError(f"{spec}: {func_name}() must return a torch.nn.Module or (model, inputs), "
                               f"got {type(model).__name__}")
    return model
