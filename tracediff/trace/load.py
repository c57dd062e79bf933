"""Reading a trace folder: ``tracediff.load_trace``.

Accepted: a folder (or a JSON file in it) written by transformers' debugger,
with ``use_repr=False`` (safetensors payloads) or ``use_repr=True`` (repr
lines only), or by ``tracediff.capture``. ``*_FULL_TENSORS.json`` is
preferred; ``*_SUMMARY.json`` alone is accepted (statistics only).

Payloads are never read here: ``Trace.load(record)`` opens one payload
through ``safe_open`` when it is needed, after checking that its path stays
inside the trace folder.

transformers' debugger writes every call of a module to the same file names,
so in its traces only the last call's payload survives. Earlier calls that
point at an overwritten file are marked ``stale_reason`` and compared on
their recorded statistics instead.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._io import read_tensor_file, resolve_inside
from ..errors import TraceFormatError
from .model import Node, ReprValue, TensorRecord

METADATA_FILE = "tracediff_metadata.json"
_FULL_SUFFIX = "_debug_tree_FULL_TENSORS.json"
_SUMMARY_SUFFIX = "_debug_tree_SUMMARY.json"
_SHAPE = re.compile(r"-?\d+")
_SCALAR = re.compile(r"tensor\(\s*([-+0-9.eEinfa]+)")
_STRING_STATS = ("mean", "std", "min", "max")


@dataclass
class Trace:
    """A loaded trace: the call tree plus lazy access to its payloads."""

    directory: Path
    json_path: Path
    roots: list[Node]
    metadata: dict[str, Any] = field(default_factory=dict)
    backward: list[Node] = field(default_factory=list)

    @property
    def model_name(self) -> str:
        return self.roots[0].module_path

    @property
    def producer(self) -> str:
        """``"tracediff"`` for native traces, ``"transformers"`` for the standard debugger's."""
        return "tracediff" if self.metadata.get("tracediff_version") else "transformers"

    @property
    def summary_only(self) -> bool:
        return self.json_path.name.endswith(_SUMMARY_SUFFIX)

    def nodes(self) -> list[Node]:
        """Every forward node in the order the calls started, then the backward nodes in arrival order."""
        out: list[Node] = []
        for root in self.roots:
            out.extend(root.walk())
        return out + self.backward

    def records(self) -> list[tuple[Node, TensorRecord]]:
        """Every tensor record with its node, in execution order."""
        pairs = [(node, record) for node in self.nodes() for record in node.tensors]
        pairs.sort(key=lambda pair: pair[1].order)
        return pairs

    def payload_path(self, record: TensorRecord) -> Path:
        """The payload file of ``record``, resolved inside the trace folder (``UnsafePathError`` if not)."""
        if record.payload is None:
            raise TraceFormatError(f"{self.json_path}: {record.slot} has no payload")
        return resolve_inside(self.directory, record.payload)

    def load(self, record: TensorRecord) -> torch.Tensor:
        """Read the payload of ``record`` (memory-mapped through ``safe_open``)."""
        return read_tensor_file(self.payload_path(record))


def find_trace_json(path: str | Path) -> Path:
    """The JSON file of the trace at ``path`` (a folder or a file)."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        raise TraceFormatError(f"{p}: no such trace folder or file")
    for suffix in (_FULL_SUFFIX, _SUMMARY_SUFFIX):
        found = sorted(p.glob(f"*{suffix}"))
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise TraceFormatError(f"{p}: holds several traces ({names}); pass the JSON file to use")
        if found:
            return found[0]
    ranks = sorted(d.name for d in p.glob("rank*") if d.is_dir())
    hint = f"; it has per-rank traces, e.g. {p / ranks[0]}" if ranks else ""
    raise TraceFormatError(f"{p}: no *{_FULL_SUFFIX} or *{_SUMMARY_SUFFIX} found{hint}")


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{path}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg}); "
                               "the file may be truncated") from e
    except UnicodeDecodeError as e:
        raise TraceFormatError(f"{path}: not UTF-8 text, so not a trace JSON") from e
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e.strerror or e})") from e


def load_trace(path: str | Path) -> Trace:
    """Load the trace at ``path``: a trace folder, or its FULL_TENSORS / SUMMARY JSON file.

    Raises ``TraceFormatError`` naming the file when it is missing, not JSON,
    truncated, or not a call tree.
    """
    json_path = find_trace_json(path)
    tree = _read_json(json_path)
    if not isinstance(tree, dict) or not isinstance(tree.get("module_path"), str):
        raise TraceFormatError(f"{json_path}: not a trace: expected a JSON object with a 'module_path' at the top")
    directory = json_path.parent
    metadata_file = directory / METADATA_FILE
    metadata = _read_json(metadata_file) if metadata_file.is_file() else {}
    if not isinstance(metadata, dict):
        raise TraceFormatError(f"{metadata_file}: not a tracediff metadata object")
    builder = _Builder(json_path)
    roots = [builder.node(tree, None, 0)]
    for later in tree.get("subsequent_calls", []):
        roots.append(builder.node(later, None, 0))
    backward = builder.backward(tree.get("backward") or [])
    trace = Trace(directory=directory, json_path=json_path, roots=roots, metadata=metadata, backward=backward)
    if trace.producer == "transformers":
        _mark_overwritten_payloads(trace)
    return trace


class _Builder:
    def __init__(self, json_path: Path) -> None:
        self.json_path = json_path
        self.order = 0
        self.calls: defaultdict[str, int] = defaultdict(int)

    def _tick(self) -> int:
        self.order += 1
        return self.order - 1

    def node(self, obj: Any, parent: Node | None, depth: int) -> Node:
        if not isinstance(obj, dict) or not isinstance(obj.get("module_path"), str):
            where = parent.module_path if parent else "the top"
            raise TraceFormatError(f"{self.json_path}: a child of {where} is not a node (no 'module_path')")
        path = obj["module_path"]
        call_index = obj.get("call_index")
        if not isinstance(call_index, int):
            call_index = self.calls[path]
        self.calls[path] = max(self.calls[path], call_index + 1)
        node = Node(module_path=path, relative_path=path.split(".", 1)[1] if "." in path else "",
                    call_index=call_index, module_type=obj.get("module_type"), depth=depth,
                    enter_order=self.order, parent=parent, error=obj.get("error"))
        self._flatten(obj.get("inputs"), "inputs", node)
        children = obj.get("children") or []
        if not isinstance(children, list):
            raise TraceFormatError(f"{self.json_path}: 'children' of {path} is not a list")
        node.children = [self.node(child, node, depth + 1) for child in children]
        node.exit_order = self.order
        if obj.get("outputs") is not None:
            node.has_outputs = True
            self._flatten(obj["outputs"], "outputs", node)
        return node

    def backward(self, entries: Any) -> list[Node]:
        """Backward nodes, their records ordered by the clock the capture kept."""
        if not isinstance(entries, list):
            raise TraceFormatError(f"{self.json_path}: 'backward' is not a list")
        nodes, events = [], []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("module_path"), str):
                raise TraceFormatError(f"{self.json_path}: backward entry {i} is not a node")
            path = entry["module_path"]
            node = Node(module_path=path, relative_path=path.split(".", 1)[1] if "." in path else "",
                        call_index=int(entry.get("call_index", 0)), module_type=entry.get("module_type"),
                        depth=0, enter_order=-1, phase="backward", has_outputs=True)
            nodes.append(node)
            arrival, departure = (list(entry.get("backward_order") or []) + [None, None])[:2]
            events.append((arrival if arrival is not None else 2 * i, node, entry.get("grad_outputs"), "grad_outputs"))
            if "grad_inputs" in entry:
                events.append((departure if departure is not None else 2 * i + 1, node, entry["grad_inputs"],
                               "grad_inputs"))
        for _, node, value, slot in sorted(events, key=lambda e: e[0]):
            if node.enter_order < 0:
                node.enter_order = self.order
            self._flatten(value, slot, node)
            node.exit_order = self.order
        return nodes

    def _flatten(self, value: Any, slot: str, node: Node) -> None:
        if value is None:
            return
        if isinstance(value, dict) and isinstance(value.get("shape"), str) and isinstance(value.get("dtype"), str):
            node.tensors.append(_tensor_record(value, slot, self._tick()))
        elif isinstance(value, dict) and "py_type" in value:
            node.values[slot] = _typed_value(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                self._flatten(item, f"{slot}.{key}", node)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self._flatten(item, f"{slot}.{i}", node)
        else:
            node.values[slot] = ReprValue(value) if isinstance(value, str) else value


def _typed_value(entry: dict[str, Any]) -> Any:
    if "py_value" not in entry:
        return ReprValue(str(entry.get("repr", "")))
    value = entry["py_value"]
    return tuple(value) if entry["py_type"] == "tuple" and isinstance(value, list) else value


def _tensor_record(entry: dict[str, Any], slot: str, order: int) -> TensorRecord:
    stored = entry.get("value")
    stats = entry.get("stats")
    if not isinstance(stats, dict):
        stats = {key: parsed for key in _STRING_STATS if (parsed := parse_scalar(entry.get(key))) is not None}
    return TensorRecord(
        slot=slot,
        order=order,
        shape=parse_shape(entry["shape"]),
        dtype=entry["dtype"],
        stats={k: v for k, v in stats.items() if isinstance(v, (int, float))},
        payload=stored if isinstance(stored, str) else None,
        repr_lines=tuple(stored) if isinstance(stored, list) else None,
    )


def parse_shape(text: str) -> tuple[int, ...] | None:
    """``"torch.Size([1, 7, 32])"`` -> ``(1, 7, 32)``."""
    if "Size" not in text and "[" not in text and "(" not in text:
        return None
    return tuple(int(n) for n in _SHAPE.findall(text.split("Size", 1)[-1]))


def parse_scalar(text: Any) -> float | None:
    """``"tensor(1.2300e-03)"`` or ``"tensor(nan, dtype=torch.bfloat16)"`` -> a float."""
    if not isinstance(text, str):
        return None
    match = _SCALAR.search(text)
    if not match:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return None


def _mark_overwritten_payloads(trace: Trace) -> None:
    users: defaultdict[str, list[tuple[Node, int]]] = defaultdict(list)
    for node in trace.nodes():
        for i, record in enumerate(node.tensors):
            if record.payload is not None:
                users[record.payload].append((node, i))
    for refs in users.values():
        if len(refs) < 2:
            continue
        refs.sort(key=lambda ref: ref[0].tensors[ref[1]].order)
        for node, i in refs[:-1]:
            record = node.tensors[i]
            reason = "payload overwritten by a later call of the same module (standard trace)"
            node.tensors[i] = TensorRecord(**{**record.__dict__, "stale_reason": reason})
