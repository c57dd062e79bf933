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

import gc
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import format as fmt
from .._io import read_tensor_file, resolve_inside
from .._safe_read import check_regular_file
from ..errors import PayloadError, TraceFormatError
from .model import Node, ReprValue, TensorRecord
from .reading import incomplete_reason, journal_of, read_tree
from .validate import value_problem

if TYPE_CHECKING:
    import torch

_SHAPE = re.compile(r"-?\d+")
_SCALAR = re.compile(r"tensor\(\s*([-+0-9.eEinfa]+)")


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
        return "tracediff" if self.metadata.get(fmt.PRODUCER_KEY) else "transformers"

    @property
    def summary_only(self) -> bool:
        return self.json_path.name.endswith(fmt.SUMMARY_SUFFIX)

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
        """Read the payload of ``record`` (memory-mapped through ``safe_open``; a regular file inside the folder)."""
        return read_tensor_file(check_regular_file(self.payload_path(record), root=self.directory,
                                                   error=PayloadError, what="payload",
                                                   missing="payload file is missing"))

    @property
    def incomplete_reason(self) -> str | None:
        """Why this trace does not cover the whole forward (the process died, the forward raised), or None."""
        return incomplete_reason(self.metadata, self.roots)


def find_trace_json(path: str | Path) -> Path:
    """The JSON file of the trace at ``path`` (a folder or a file)."""
    p = Path(path)
    if p.is_file() or (p.exists() and not p.is_dir()):  # a FIFO or device: refused by the reader, never opened here
        return p
    if not p.is_dir():
        raise TraceFormatError(f"{p}: no such trace folder or file")
    for suffix in (fmt.FULL_SUFFIX, fmt.SUMMARY_SUFFIX):
        found = sorted(p.glob(f"*{suffix}"))
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise TraceFormatError(f"{p}: holds several traces ({names}); pass the JSON file to use")
        if found:
            return found[0]
    journal = journal_of(p)
    if journal is not None:  # a capture whose process died: its journal holds what was recorded
        return journal
    ranks = sorted(d.name for d in p.glob("rank*") if d.is_dir())
    hint = f"; it has per-rank traces, e.g. {p / ranks[0]}" if ranks else ""
    if not hint and next(p.glob(f"*{fmt.PAYLOAD_SUFFIX}"), None) is not None:
        hint = ("; it holds payloads only: the capture that wrote them ended before its trace JSON or journal "
                "was written")
    raise TraceFormatError(f"{p}: no *{fmt.FULL_SUFFIX} or *{fmt.SUMMARY_SUFFIX} found{hint}")


def load_trace(path: str | Path) -> Trace:
    """Load the trace at ``path``: a trace folder, or its FULL_TENSORS / SUMMARY JSON file.

    Raises ``TraceFormatError`` naming the file when it is missing, not JSON,
    truncated, or not a call tree, or when its metadata carries a
    ``format_version`` of a newer major version than this tracediff reads.
    """
    enabled = gc.isenabled()
    gc.disable()  # reading allocates millions of containers and frees almost none: collections would only rescan them
    try:
        return _load_trace(path)
    finally:
        if enabled:
            gc.enable()


def _load_trace(path: str | Path) -> Trace:
    json_path = find_trace_json(path)
    directory = json_path.parent
    # confined to the folder given (or the JSON file's folder), bounded, regular files only; field types checked
    tree, metadata = read_tree(json_path, Path(path) if Path(path).is_dir() else directory)
    metadata_file = directory / fmt.METADATA_FILE
    fmt.check_format_version(metadata, metadata_file)
    builder = _Builder(json_path)
    try:
        roots = [builder.node(tree, None, 0)]
        for later in tree.get(fmt.SUBSEQUENT_CALLS, []):
            roots.append(builder.node(later, None, 0))
        backward = builder.backward(tree.get(fmt.BACKWARD) or [])
    except RecursionError:
        raise TraceFormatError(f"{json_path}: the call tree nests too deeply to be read; refused") from None
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
        if not isinstance(obj, dict) or not isinstance(obj.get(fmt.MODULE_PATH), str):
            where = parent.module_path if parent else "the top"
            raise TraceFormatError(f"{self.json_path}: a child of {where} is not a node (no 'module_path')")
        path = obj[fmt.MODULE_PATH]
        call_index = obj.get(fmt.CALL_INDEX)
        if not isinstance(call_index, int):
            call_index = self.calls[path]
        self.calls[path] = max(self.calls[path], call_index + 1)
        node = Node(module_path=path, relative_path=path.split(".", 1)[1] if "." in path else "",
                    call_index=call_index, module_type=obj.get(fmt.MODULE_TYPE), depth=depth,
                    enter_order=self.order, parent=parent, error=obj.get(fmt.ERROR))
        self._flatten(obj.get(fmt.INPUTS), "inputs", node)
        children = obj.get(fmt.CHILDREN) or []
        if not isinstance(children, list):
            raise TraceFormatError(f"{self.json_path}: 'children' of {path} is not a list")
        for child in children:  # op nodes (op-level capture) go to ``ops``, module calls to ``children``
            if fmt.is_op_node(child):
                node.ops.append(self.op_node(child, node, depth + 1))
            else:
                node.children.append(self.node(child, node, depth + 1))
        node.exit_order = self.order
        if obj.get(fmt.OUTPUTS) is not None:
            node.has_outputs = True
            self._flatten(obj[fmt.OUTPUTS], "outputs", node)
        return node

    def op_node(self, obj: dict[str, Any], parent: Node, depth: int) -> Node:
        """An op node: the enclosing call's path and call index, its own ``op`` and ``op_index``."""
        index = obj.get(fmt.OP_INDEX)
        node = Node(module_path=parent.module_path, relative_path=parent.relative_path,
                    call_index=parent.call_index, module_type=parent.module_type, depth=depth,
                    enter_order=self.order, parent=parent, op=obj[fmt.OP],
                    op_index=index if isinstance(index, int) else len(parent.ops))
        self._flatten(obj.get(fmt.INPUTS), "inputs", node)
        node.exit_order = self.order
        if obj.get(fmt.OUTPUTS) is not None:
            node.has_outputs = True
            self._flatten(obj[fmt.OUTPUTS], "outputs", node)
        return node

    def backward(self, entries: Any) -> list[Node]:
        """Backward nodes, their records ordered by the clock the capture kept."""
        if not isinstance(entries, list):
            raise TraceFormatError(f"{self.json_path}: 'backward' is not a list")
        nodes, events = [], []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get(fmt.MODULE_PATH), str):
                raise TraceFormatError(f"{self.json_path}: backward entry {i} is not a node")
            path = entry[fmt.MODULE_PATH]
            node = Node(module_path=path, relative_path=path.split(".", 1)[1] if "." in path else "",
                        call_index=int(entry.get(fmt.CALL_INDEX, 0)), module_type=entry.get(fmt.MODULE_TYPE),
                        depth=0, enter_order=-1, phase="backward", has_outputs=True)
            nodes.append(node)
            arrival, departure = (list(entry.get(fmt.BACKWARD_ORDER) or []) + [None, None])[:2]
            events.append((arrival if arrival is not None else 2 * i, node, entry.get(fmt.GRAD_OUTPUTS),
                           "grad_outputs"))
            if fmt.GRAD_INPUTS in entry:
                events.append((departure if departure is not None else 2 * i + 1, node, entry[fmt.GRAD_INPUTS],
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
        if fmt.is_tensor_entry(value):
            node.tensors.append(_tensor_record(value, slot, self._tick()))
        elif fmt.is_typed_value(value):
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
    known, value = fmt.typed_value_content(entry)
    return value if known else ReprValue(str(entry.get(fmt.REPR, "")))


def _tensor_record(entry: dict[str, Any], slot: str, order: int) -> TensorRecord:
    stored = entry.get(fmt.VALUE)
    stats = entry.get(fmt.STATS)
    if not isinstance(stats, dict):
        stats = {key: parsed for key in fmt.STRING_STAT_KEYS if (parsed := parse_scalar(entry.get(key))) is not None}
    return TensorRecord(
        slot=slot,
        order=order,
        shape=parse_shape(entry[fmt.SHAPE]),
        dtype=entry[fmt.DTYPE],
        stats={k: v for k, v in stats.items() if isinstance(v, (int, float))},
        payload=stored if isinstance(stored, str) else None,
        repr_lines=tuple(stored) if isinstance(stored, list) and value_problem(stored) is None else None,
        stale_reason=value_problem(stored),  # a 'value' that is a number or an object: said in the row
    )


@lru_cache(maxsize=4096)  # a trace repeats few shapes: parsed once, and one tuple shared by every record
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
