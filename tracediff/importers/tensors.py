"""The ``tensors`` importer: a folder of ``.npy``, ``.npz``, ``.safetensors`` and ``.pt``/``.pth`` files.

Each tensor's name (its file's path, and its keys in a dict file) says which
module call it belongs to and whether it is an input or an output (see
:mod:`tracediff.importers.names`). Calls are placed in execution order by
the best evidence the dump holds, which the result states: an order named
in every file name (``003_layers.0.mlp.npy``, ``{order}`` in a pattern),
else the files' modification times when no two are equal (a script that
saves each layer as it runs writes them in order), else the names, sorted
(with a warning: that order is rarely the execution order). A module whose
path continues another's (``layers.0.mlp`` under ``layers.0``) is placed
inside that module's call, so its tensors come between the parent's inputs
and outputs, as they ran.

Statistics are not computed (only ``numel`` is recorded): alignment compares
the payloads themselves.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import format as fmt
from ..errors import DumpFormatError
from ._decoded import read_tensor_file
from ._files import TENSOR_SUFFIXES, Tensor, walk
from ._writer import TraceWriter
from .names import _IO, Place, compile_pattern, place_of

ORDER_NAMED = "order named in the file names"
ORDER_MTIME = "file modification times"
ORDER_SORTED = "file names, sorted"


@dataclass
class _Call:
    module: str
    call: int
    order: tuple[Any, ...]
    inputs: dict[int, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[int | None, dict[str, Any]] = field(default_factory=dict)
    where: dict[tuple[str, int], str] = field(default_factory=dict)
    children: list[_Call] = field(default_factory=list)
    first: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Imported:
    """What an importer built: the tree, the count of calls and tensors, and what the user should know."""

    tree: dict[str, Any]
    calls: int
    tensors: int
    order: str
    notes: tuple[str, ...] = ()


def import_tensors(src: Path, writer: TraceWriter, *, model_name: str, pattern: str | None) -> Imported:
    """Read every tensor file under ``src`` and write it into ``writer``; the tree of the trace."""
    regex = compile_pattern(pattern) if pattern else None
    listed = list(walk(src))
    files = [(path, rel) for path, rel in listed if path.suffix.lower() in TENSOR_SUFFIXES]
    if not files:
        raise DumpFormatError(f"{src}: holds no .npy, .npz, .safetensors, .pt or .pth file; nothing to import")
    notes = [f"{len(listed) - len(files)} files that are not tensor files were left out"] \
        if len(listed) > len(files) else []
    mtimes = [os.stat(path).st_mtime_ns for path, _ in files]
    distinct_times = len(set(mtimes)) == len(mtimes)
    calls: dict[tuple[str, int], _Call] = {}
    named_order = True
    tensors = 0
    for position, ((path, rel), mtime) in enumerate(zip(files, mtimes)):
        stem = rel[: -len(path.suffix)]
        items = read_tensor_file(path, src)
        for sub, tensor in enumerate(items):
            name = _name(stem, tensor.key, len(items), single_file=len(files) == 1, default=regex is None)
            where = f"{path}" + (f" [{'/'.join(tensor.key)}]" if tensor.key else "")
            place = place_of(name, regex, where)
            named_order &= place.order is not None
            time_key = mtime if distinct_times else 0
            _add(calls, place, tensor, writer, model_name, where,
                 (place.order if place.order is not None else -1, time_key, _natural(rel), position, sub))
            tensors += 1
    order = ORDER_NAMED if named_order else ORDER_MTIME if distinct_times else ORDER_SORTED
    if order == ORDER_SORTED and len(files) > 1:
        notes.append("the files share modification times and name no order, so calls are ordered by name, which "
                     "may not be the order they ran in: name an order (003_layers.0.mlp.npy, or {order} in "
                     "--pattern)")
    tree = _tree(calls, model_name)
    return Imported(tree, len(calls), tensors, order, tuple(notes))


def _name(stem: str, key: tuple[str, ...], count: int, *, single_file: bool, default: bool) -> str:
    """The name of one tensor of a file (see :mod:`tracediff.importers.names`)."""
    if not key:
        return stem
    if default and key[0].isdigit():  # a list or tuple: the values of one slot, by position
        last = re.split(r"[/.]", stem)[-1]
        slot = "" if _IO.match(last) and not re.search(r"\d$", last) else "/output"
        return f"{stem}{slot}.{'/'.join(key)}"
    if single_file and count > 1:
        return "/".join(key)
    if count == 1 and not _IO.match(key[0]):
        return stem
    return f"{stem}/{'/'.join(key)}"


def _add(calls: dict[tuple[str, int], _Call], place: Place, tensor: Tensor, writer: TraceWriter, model_name: str,
         where: str, order: tuple[Any, ...]) -> None:
    call = calls.get((place.module, place.call))
    if call is None:
        call = calls[(place.module, place.call)] = _Call(place.module, place.call, order)
    call.order = min(call.order, order)
    position = (place.io, place.index or 0)  # "output" and "output_0" name the same slot
    earlier = call.where.get(position)
    if earlier is not None:
        slot = place.io if place.index is None else f"{place.io} {place.index}"
        raise DumpFormatError(f"{where}: {place.module} (call {place.call}) {slot} is also given by {earlier}; "
                              "name each tensor once")
    call.where[position] = where
    prefix = fmt.call_prefix(f"{model_name}.{place.module}", place.call)
    if place.io == "inputs":
        index = place.index or 0
        name = fmt.payload_name(fmt.payload_name(fmt.payload_name(prefix, fmt.INPUTS), fmt.ARGS), index)
        call.inputs[index] = writer.entry(tensor, name)
    else:
        name = fmt.payload_name(prefix, fmt.OUTPUTS)
        call.outputs[place.index] = writer.entry(tensor, name if place.index is None
                                                 else fmt.payload_name(name, place.index))


def _natural(text: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


def _tree(calls: dict[tuple[str, int], _Call], model_name: str) -> dict[str, Any]:
    """Nest each call in the call of the longest module path it continues; siblings in order."""
    by_module: dict[str, list[_Call]] = {}
    for call in calls.values():
        by_module.setdefault(call.module, []).append(call)
    top: list[_Call] = []
    for call in calls.values():
        parent = _parent(call, by_module)
        (parent.children if parent is not None else top).append(call)
    for call in top:
        _first(call)
    return fmt.node_entry(model_name, module_type=model_name, call_index=0, inputs={},
                          children=[_node(call, model_name) for call in sorted(top, key=lambda c: c.first)])


def _parent(call: _Call, by_module: dict[str, list[_Call]]) -> _Call | None:
    parts = call.module.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        candidates = by_module.get(".".join(parts[:cut]))
        if candidates:
            same = [c for c in candidates if c.call == call.call]
            return same[0] if same else max(candidates, key=lambda c: c.call)
    return None


def _first(call: _Call) -> tuple[Any, ...]:
    call.first = min([call.order, *(_first(child) for child in call.children)])
    return call.first


def _node(call: _Call, model_name: str) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    if call.inputs:
        inputs[fmt.ARGS] = [call.inputs.get(i) for i in range(max(call.inputs) + 1)]
    outputs: Any = None
    if list(call.outputs) == [None]:
        outputs = call.outputs[None]
    elif call.outputs:
        indexed = {0 if i is None else i: entry for i, entry in call.outputs.items()}
        outputs = [indexed.get(i) for i in range(max(indexed) + 1)]
    children = [_node(child, model_name) for child in sorted(call.children, key=lambda c: c.first)]
    node = fmt.node_entry(f"{model_name}.{call.module}", call_index=call.call, inputs=inputs)
    if children:
        node[fmt.CHILDREN] = children
    if outputs is not None:
        node[fmt.OUTPUTS] = outputs
    return node
