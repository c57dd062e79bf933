"""Where B runs: the device it is moved to for a replay, and the dtype and device of each module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain

import torch
from torch import nn

from ..errors import UsageError


def check_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a ``torch.device``, or ``UsageError`` when it is not one or is not available here."""
    if device is None:
        return None
    try:
        target = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"device {device!r}: not a torch device (cpu, cuda, cuda:1, mps, ...)") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {device!r}: CUDA is not available on this machine")
    if target.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"device {device!r}: MPS is not available on this machine")
    return target


def _first_device(model: nn.Module) -> torch.device | None:
    tensor = next(chain(model.parameters(), model.buffers()), None)
    return tensor.device if tensor is not None else None


@contextmanager
def prepared(model: nn.Module, device: str | torch.device | None) -> Iterator[torch.device]:
    """``model`` in eval mode (and on ``device``) inside the block; its modes and device restored after."""
    modes = [(m, m.training) for m in model.modules()]
    original = _first_device(model)
    target = torch.device(device) if device is not None else (original or torch.device("cpu"))
    moved = device is not None and original is not None and original != target
    model.eval()
    try:
        if moved:
            model.to(target)
        yield target
    finally:
        if moved and original is not None:
            model.to(original)
        for module, training in modes:
            module.training = training


def param_dtype(module: nn.Module) -> torch.dtype | None:
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return None


def module_device(module: nn.Module, default: torch.device) -> torch.device:
    tensor = next(chain(module.parameters(), module.buffers()), None)
    return tensor.device if tensor is not None else default
