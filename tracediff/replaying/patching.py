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
def _on_calls(model: nn.Module, paths_wanted: set[str], call_index: Callable[[str, int], int | None],
              on_call: Callable[[str, int, Any], Any]) -> Iterator[None]:
    """Within the block, each call of a submodule whose path is in ``paths_wanted`` passes its output to
    ``on_call(path, index, output)`` (``index``: ``call_index`` of the path's k-th call in this run; calls
    it maps to None are left alone); what ``on_call`` returns replaces the output unless it is None."""
    paths = module_paths(model)
    counts: defaultdict[str, int] = defaultdict(int)
    handles = []

    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        path = paths.get(id(module), "")
        k = counts[path]
        counts[path] += 1
        index = call_index(path, k)
        return None if index is None else on_call(path, index, output)

    try:
        for module in model.modules():
            if paths.get(id(module)) in paths_wanted:
                handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def patched(model: nn.Module, replacements: Replacements,
            call_index: Callable[[str, int], int | None] | None = None) -> Iterator[None]:
    """Within the block, the chosen calls of ``model``'s submodules return A's recorded outputs.

    ``call_index(path, k)`` maps the k-th call of ``path`` in this run to its
    call index in the full forward (default: k itself, for a run of the whole
    model); ``None`` means the call is not one of the recorded ones.
    """
    def replace(path: str, index: int, output: Any) -> Any:
        recorded = replacements.get((path, index))
        return None if recorded is None else substitute(output, _replace_with(recorded))

    with _on_calls(model, {path for path, _ in replacements}, call_index or (lambda _, k: k), replace):
        yield


@contextmanager
def kept(model: nn.Module, wanted: set[tuple[str, int]], call_index: Callable[[str, int], int | None],
         into: dict[tuple[str, int], Any]) -> Iterator[None]:
    """Within the block, the outputs of the chosen calls of ``model``'s submodules go into ``into`` under
    ``(relative path, call index)``; ``call_index`` as for ``patched``. The outputs are left unchanged."""
    def keep(path: str, index: int, output: Any) -> None:
        if (path, index) in wanted:
            into[(path, index)] = output

    with _on_calls(model, {path for path, _ in wanted}, call_index, keep):
        yield
