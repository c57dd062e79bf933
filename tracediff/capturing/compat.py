"""A drop-in for transformers' ``model_addition_debugger_context``.

Same signature, same files, same JSON, same tensors::

    from tracediff import model_addition_debugger_context

    with model_addition_debugger_context(model, debug_path="trace", use_repr=False):
        model(input_ids)

It writes ``{Model}_debug_tree_FULL_TENSORS.json`` and ``..._SUMMARY.json``;
with ``use_repr=False`` one safetensors file per tensor. Submodule forwards run
under ``torch.no_grad()``, outputs are kept for leaf modules only, and with
``do_prune_layers=True`` only the first and last of a run of numbered layers
stay in the tree. Only rank 0 records under ``torch.distributed``.

Differences, all on the side of keeping data: torch's print options are
restored on exit (the original leaves ``sci_mode`` on), JSON is written
atomically, and when the forward raises the tree recorded so far is still
written, with an ``error`` entry on the modules the exception went through.
For repeated calls, parent outputs, numeric statistics and metadata, use
``tracediff.capture``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import format as fmt
from ..files.atomic import write_json
from ..files.payloads import write_tensor_file
from ..format import sanitize_repr as sanitize_repr  # re-exported: encode.py and older code import it here
from ._patch import ForwardPatch, print_options
from ._tree import drop_parent_outputs, prune_intermediate_layers, without_values
from .distributed import current_rank


def _tensor_lines(tensor: torch.Tensor) -> list[str]:
    """The repr lines of ``tensor`` as transformers' ``use_repr=True`` stores them (scientific, 120 columns)."""
    buffer = StringIO()
    with print_options(sci_mode=True, linewidth=120):  # the same lines whatever the caller's print options
        print(tensor, file=buffer)
    return sanitize_repr(buffer.getvalue()).splitlines()


_STANDARD_STAT_DTYPES = {torch.float16, torch.float32, torch.bfloat16}


class _StandardEncoder:
    def __init__(self, debug_path: str | None, use_repr: bool) -> None:
        self.debug_path = debug_path
        self.use_repr = use_repr

    def encode(self, value: Any, name: str) -> Any:
        if isinstance(value, (list, tuple)):
            return [self.encode(item, fmt.payload_name(name, i)) for i, item in enumerate(value)]
        if isinstance(value, dict):
            return {key: self.encode(item, fmt.payload_name(name, key)) for key, item in value.items()}
        if hasattr(value, "_local_tensor"):
            return self._tensor(value._local_tensor, name)
        if isinstance(value, torch.Tensor):
            return self._tensor(value, name)
        return sanitize_repr(repr(value))

    def _tensor(self, tensor: torch.Tensor, name: str) -> dict[str, Any]:
        if self.use_repr:
            stored: Any = _tensor_lines(tensor)
        else:
            file_name = fmt.payload_file_name(name)  # not sanitized: the same names as transformers' debugger
            target = os.path.join(self.debug_path, file_name) if self.debug_path else file_name
            write_tensor_file(target, tensor)
            stored = fmt.payload_reference(file_name)
        strings: dict[str, str] | None = None
        if tensor.dtype in _STANDARD_STAT_DTYPES:  # mean, std, min, max
            values = (tensor.mean(), tensor.std(), tensor.min(), tensor.max())
            strings = {key: sanitize_repr(repr(v)) for key, v in zip(fmt.STRING_STAT_KEYS, values)}
        return fmt.tensor_entry(repr(tensor.shape), repr(tensor.dtype), stored, string_stats=strings)


class _StandardRecorder:
    """Builds the standard call tree; the root's JSON is written when its call returns."""

    def __init__(self, model: nn.Module, debug_path: str | None, do_prune_layers: bool, use_repr: bool) -> None:
        self.model_name = type(model).__name__
        self.encoder = _StandardEncoder(debug_path, use_repr)
        self.debug_path = debug_path
        self.do_prune_layers = do_prune_layers
        self.stack: list[dict[str, Any]] = []
        self.parents = {path for path, m in _paths(model, self.model_name) if any(True for _ in m.children())}

    def enter(self, module: nn.Module, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if current_rank() != 0:
            return None
        is_root = path == self.model_name
        if is_root:
            inputs = self.encoder.encode({fmt.ARGS: args, fmt.KWARGS: kwargs}, fmt.payload_name(path, fmt.INPUTS))
            node = fmt.node_entry(f"{path} (top-level)", inputs=inputs, outputs=None, children=[])
        else:
            given = {key: val for key, val in ((fmt.ARGS, args), (fmt.KWARGS, kwargs)) if len(val) > 0}
            node = fmt.node_entry(path, inputs=self.encoder.encode(given, fmt.payload_name(path, fmt.INPUTS)),
                                  outputs=None, children=[])
        self.stack.append(node)
        return (node, path, is_root)

    def exit(self, token: Any, output: Any) -> None:
        if token is None:
            return
        node, path, is_root = token
        if is_root or path not in self.parents:
            node[fmt.OUTPUTS] = self.encoder.encode(output, fmt.payload_name(path, fmt.OUTPUTS))
        self._close(node, is_root)

    def error(self, token: Any, exc: BaseException) -> None:
        if token is None:
            return
        node, _, is_root = token
        node[fmt.ERROR] = fmt.error_entry(type(exc).__name__, sanitize_repr(str(exc)))
        self._close(node, is_root)

    def _close(self, node: dict[str, Any], is_root: bool) -> None:
        while self.stack and self.stack[-1] is not node:  # a child that never returned
            self.stack.pop()
        if self.stack:
            self.stack.pop()
        if not is_root:
            if not node[fmt.CHILDREN]:
                node.pop(fmt.CHILDREN)
            if self.stack:
                self.stack[-1][fmt.CHILDREN].append(node)
            return
        tree = fmt.node_entry(self.model_name, inputs=node[fmt.INPUTS], outputs=node[fmt.OUTPUTS],
                              children=node[fmt.CHILDREN])
        if fmt.ERROR in node:
            tree[fmt.ERROR] = node[fmt.ERROR]
        tree = {key: val for key, val in tree.items() if val}
        if self.do_prune_layers:
            prune_intermediate_layers(tree)
        drop_parent_outputs(tree)
        self._write(tree)

    def _write(self, tree: dict[str, Any]) -> None:
        full, summary = fmt.trace_file_names(self.model_name)
        folder = Path(self.debug_path) if self.debug_path else Path(".")
        write_json(folder / full, tree)
        write_json(folder / summary, without_values(tree))


def _paths(model: nn.Module, root: str) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        yield (f"{root}.{name}" if name else root), module


@contextmanager
def model_addition_debugger_context(
    model: nn.Module,
    debug_path: str | None = None,
    do_prune_layers: bool = True,
    use_repr: bool = True,
) -> Iterator[nn.Module]:
    """Record every module call of ``model`` in the standard trace format of transformers.

    Args:
        model: the module to trace; every submodule's ``forward`` is wrapped.
        debug_path: folder for the JSON and safetensors files (created if
            needed); ``None`` writes into the current directory.
        do_prune_layers: keep only the first and last numbered layer blocks
            in the JSON tree (the payload files of all layers are written).
        use_repr: store ``repr()`` lines of each tensor in the JSON instead of
            a safetensors file per tensor.

    The JSON is written when the model's top-level forward returns.
    """
    if debug_path:
        try:
            os.makedirs(debug_path, exist_ok=True)
        except OSError as e:
            raise ValueError(f"Unexpected or existing debug_path={debug_path}.") from e
    recorder = _StandardRecorder(model, debug_path, do_prune_layers, use_repr)
    with print_options(sci_mode=True, linewidth=120):
        patch = ForwardPatch(model, recorder, root_name=recorder.model_name, child_context=torch.no_grad)
        try:
            yield model
        finally:
            patch.restore()
