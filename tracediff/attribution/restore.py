"""Restoring chosen calls' math inside B's whole forward: each returns its own output minus its local error.

A call's output in B's forward carries two errors: its own (its quantized
math) and what flows in from upstream. Replacing the output by A's recorded
output would remove both, so a late layer would take the blame for every
layer before it. Subtracting the local error measured on A's inputs
(``delta``, :mod:`.local`) removes the call's own error and keeps what flows
in: ``B(x_B) - (B(x_A) - A(x_A)) ~= A(x_B)``. It is exact where ``x_B = x_A``
and for an error that does not depend on the input, first order otherwise
(a quantized Linear's error ``x (W_q - W)^T`` moves with ``x`` only by the
upstream error; int8 dynamic activations round again on a moved input).

``ahead`` is the speed trick of the attribution: a call whose inputs are
exactly A's (every call before it is restored) would compute ``B(x_A)`` and
then lose ``delta`` again, giving A's recorded output; it returns that output
without running, so a forward that restores every call before the one under
study costs only what comes after it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn

from ..replaying.inputs import substitute
from ..replaying.shadow import module_paths

Key = tuple[str, int]  # (relative path, call index)
#: ``(relative path, call index) -> {output slot: local error}``
Deltas = Mapping[Key, Mapping[str, torch.Tensor]]


def minus(delta: Mapping[str, torch.Tensor]) -> Callable[[str, torch.Tensor], torch.Tensor]:
    def subtract(slot: str, tensor: torch.Tensor) -> torch.Tensor:
        d = delta.get(slot)
        return tensor - d if d is not None and d.shape == tensor.shape else tensor
    return subtract


@contextmanager
def restored(model: nn.Module, deltas: Deltas, ahead: Mapping[Key, Any] | None = None) -> Iterator[None]:
    """Within the block, each call in ``deltas`` returns its output minus its local error, and each call in
    ``ahead`` returns the given output (a fresh copy) without running; ``model`` is left as it was."""
    paths = module_paths(model)
    ahead = ahead or {}
    counts: defaultdict[str, int] = defaultdict(int)

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        path = paths.get(id(module), "")
        index = counts[path]
        counts[path] += 1
        delta = deltas.get((path, index))
        return None if delta is None else substitute(output, minus(delta))

    with ExitStack() as stack:
        for module in model.modules():
            path = paths.get(id(module))
            if path is None:
                continue
            if any(p == path for p, _ in ahead):
                stack.enter_context(_answered(module, path, ahead))
            if any(p == path for p, _ in deltas):
                stack.callback(module.register_forward_hook(hook).remove)
        yield


@contextmanager
def _answered(module: nn.Module, path: str, ahead: Mapping[Key, Any]) -> Iterator[None]:
    """``module``'s chosen calls return their given output without running; its other calls run as usual.
    The instance's own ``forward`` attribute, if any, is put back."""
    had = "forward" in vars(module)
    original = vars(module).get("forward")
    run = module.forward
    calls = [0]

    def forward(*args: Any, **kwargs: Any) -> Any:
        given = ahead.get((path, calls[0]))
        calls[0] += 1
        if given is None:
            return run(*args, **kwargs)
        return substitute(given, lambda _slot, tensor: tensor.clone())  # downstream may write in place

    object.__setattr__(module, "forward", forward)
    try:
        yield
    finally:
        if had:
            object.__setattr__(module, "forward", original)
        else:
            object.__delattr__(module, "forward")
