"""Replacing chosen module calls' outputs with A's recorded outputs while B runs, or keeping them.

Replacing is used twice: to check that a parent's local error is explained by
its culprit children (rerun the parent with their outputs replaced by A's),
and, with ``patch=True``, to measure how much of the model's final-output
error disappears when one culprit's output is replaced by A's. Keeping
(``kept``) gives what a call that cannot run alone produced inside its
parent's run (:mod:`.inside`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .inputs import substitute
from .shadow import module_paths

#: ``(relative path, call index) -> {slot: A's recorded tensor}``
Replacements = dict[tuple[str, int], dict[str, torch.Tensor]]


def _replace_with(recorded: dict[str, torch.Tensor]) -> Callable[[str, torch.Tensor], torch.Tensor]:
    def replacement(slot: str, tensor: torch.Tensor) -> torch.Tensor:
        value = recorded.get(slot)
        if value is None or tuple(value.shape) != tuple(tensor.shape):
            return tensor
        return value.to(device=tensor.device, dtype=tensor.dtype)
    return replacement


@contextmanager
def patched(model: nn.Module, replacements: Replacements,
            call_index: Callable[[str, int], int | None] | None = None) -> Iterator[None]:
    """Within the block, the chosen calls of ``model``'s submodules return A's recorded outputs.

    ``call_index(path, k)`` maps the k-th call of ``path`` in this run to its
    call index in the full forward (default: k itself, for a run of the whole
    model); ``None`` means the call is not one of the recorded ones.
    """
    paths = module_paths(model)
    wanted = {path for path, _ in replacements}
    counts: defaultdict[str, int] = defaultdict(int)
    handles = []

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        path = paths.get(id(module), "")
        k = counts[path]
        counts[path] += 1
        index = call_index(path, k) if call_index is not None else k
        recorded = replacements.get((path, index)) if index is not None else None
        if recorded is None:
            return None
        return substitute(output, _replace_with(recorded))

    try:
        for module in model.modules():
            if paths.get(id(module)) in wanted:
                handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def kept(model: nn.Module, wanted: set[tuple[str, int]], call_index: Callable[[str, int], int | None],
         into: dict[tuple[str, int], Any]) -> Iterator[None]:
    """Within the block, the outputs of the chosen calls of ``model``'s submodules go into ``into`` under
    ``(relative path, call index)``; ``call_index`` as for ``patched``. The outputs are left unchanged."""
    paths = module_paths(model)
    wanted_paths = {path for path, _ in wanted}
    counts: defaultdict[str, int] = defaultdict(int)
    handles = []

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        path = paths.get(id(module), "")
        k = counts[path]
        counts[path] += 1
        index = call_index(path, k)
        if index is not None and (path, index) in wanted:
            into[(path, index)] = output

    try:
        for module in model.modules():
            if paths.get(id(module)) in wanted_paths:
                handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()
