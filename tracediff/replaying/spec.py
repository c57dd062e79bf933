"""The model of a SPEC, for ``tracediff replay``: the function may return a model or ``(model, inputs)``."""

from __future__ import annotations

from torch import nn

from ..capturing.spec import call_spec
from ..errors import CaptureSpecError


def load_model(spec: str) -> nn.Module:
    """Import the SPEC's function (``file.py:function`` or ``package.module:function``), call it, return the model."""
    result, func_name = call_spec(spec)
    model = result[0] if isinstance(result, tuple) and len(result) == 2 else result
    if not isinstance(model, nn.Module):
        raise CaptureSpecError(f"{spec}: {func_name}() must return a torch.nn.Module or (model, inputs), "
                               f"got {type(model).__name__}")
    return model
