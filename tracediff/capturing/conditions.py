"""Running a model under other conditions: another floating dtype, another device.

This is how the baseline of a comparison is captured: the reference run
under the port's conditions, ``tracediff capture ref.py:build --out ref-bf16
--dtype bfloat16`` (see docs/verdicts.md). The model is cast as
``model.to(device=..., dtype=...)`` does (floating parameters and buffers
only), and so are the floating tensors among the inputs; integer and bool
inputs (token ids, masks) keep their dtype and only move to the device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import UsageError

_DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float64": torch.float64, "fp64": torch.float64, "double": torch.float64,
}


def parse_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    """``"bfloat16"``, ``"bf16"``, ``"torch.float16"``, ``torch.float32``... -> a floating ``torch.dtype``."""
    if value is None or isinstance(value, torch.dtype):
        if isinstance(value, torch.dtype) and not value.is_floating_point:
            raise UsageError(f"dtype {value}: expected a floating-point dtype")
        return value
    dtype = _DTYPES.get(str(value).strip().lower().removeprefix("torch."))
    if dtype is None:
        raise UsageError(f"--dtype {value!r}: expected one of bfloat16, float16, float32, float64")
    return dtype


def parse_device(value: str | torch.device | None) -> torch.device | None:
    """A device that exists here, or a ``UsageError`` saying why not (``--device cuda`` without CUDA)."""
    if value is None:
        return None
    try:
        device = torch.device(value)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, TypeError) as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(f"--device {value!s}: not usable here ({first})") from None
    return device


def cast_inputs(value: Any, dtype: torch.dtype | None, device: torch.device | None) -> Any:
    """Floating tensors to ``dtype``; every tensor to ``device``; tuples, lists and dicts recursively."""
    if isinstance(value, torch.Tensor):
        target = dtype if dtype is not None and value.is_floating_point() else value.dtype
        return value.to(device=device if device is not None else value.device, dtype=target)
    if isinstance(value, tuple):
        return tuple(cast_inputs(v, dtype, device) for v in value)
    if isinstance(value, list):
        return [cast_inputs(v, dtype, device) for v in value]
    if isinstance(value, dict):
        return {k: cast_inputs(v, dtype, device) for k, v in value.items()}
    return value


def to_conditions(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                  dtype: str | torch.dtype | None = None, device: str | torch.device | None = None
                  ) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """The model (cast in place, as ``nn.Module.to`` does) and its inputs under ``dtype``/``device``.

    Both default to None: unchanged.
    """
    target_dtype, target_device = parse_dtype(dtype), parse_device(device)
    if target_dtype is None and target_device is None:
        return model, args, kwargs
    model = model.to(device=target_device, dtype=target_dtype)
    return model, cast_inputs(args, target_dtype, target_device), cast_inputs(kwargs, target_dtype, target_device)
