"""Reading a trace folder: ``tracediff.load_trace``.

Accepted: a folder (or a JSON file in it) written by transformers' debugger,
with ``use_repr=False`` (safetensors payloads) or ``use_repr=True`` (repr
lines only), or by ``tracediff.capture``. ``*_FULL_TENSORS.json`` is
preferred; ``*_SUMMARY.json`` alone is accepted (statistics only).

Payloads are never read here: ``Trace.load_payload(record)`` maps one payload
with numpy when it is needed (what ``align`` uses: no torch), and
``Trace.load(record)`` reads it as a torch tensor through ``safe_open``, both
after checking that its path stays inside the trace folder.

transformers' debugger writes every call of a module to the same file names,
so in its traces only the last call's payload survives. Earlier calls that
point at an overwritten file are marked ``stale_reason`` and compared on
their recorded statistics instead.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .. import format as fmt
from ..errors import PayloadError, TraceFormatError
from ..files.confine import check_regular_file, resolve_inside, resolved_folder
from ..files.payloads import read_tensor_file
from .frozen import frozen_builder
from .graph_scopes import group_scopes
from .model import Node, ReprValue, StepTokens, TensorRecord
from .ranks import is_multi_rank
from .reading import incomplete_reason, journal_of, read_tree
from .validate import TreeChecker, check_graph_order, value_problem
from .vocabulary import GraphVocabulary, trace_vocabulary

if TYPE_CHECKING:
    import torch

    from .payload import Payload

_SHAPE = re.compile(r"-?\d+")
_SCALAR = re.compile(r"tensor\(\s*([-+0-9.eEinfa]+)")
_build_record = frozen_builder(TensorRecord)  # TensorRecord(...), faster: a record per tensor of the trace


@dataclass
class Trace:
    """A loaded trace: the call tree plus lazy access to its payloads."""

    #: A multi-rank folder read as one global trace (:class:`tracediff.sharding.ShardedTrace`).
    sharded: ClassVar[bool] = False

    directory: Path
    json_path: Path
    roots: list[Node]
    metadata: dict[str, Any] = field(default_factory=dict)
    backward: list[Node] = field(default_factory=list)
    #: The decode step of each of ``roots`` (``step`` of a top-level call made by ``generate``), None for others.
    root_steps: list[int | None] = field(default_factory=list)
    #: The tokens of each of ``roots`` (``tokens`` of a decode step: chosen, argmax), None where not recorded.
    root_tokens: list[StepTokens | None] = field(default_factory=list)
    _parameters: dict[str, tuple[str, ...]] | None = field(default=None, init=False, repr=False, compare=False)
    #: ``layout`` objects of tensor entries (multi-rank captures), by the record's ``order``; read by
    #: :mod:`tracediff.sharding`, unchecked here
    layouts: dict[int, Any] = field(default_factory=dict, repr=False, compare=False)
    # payload reference -> its file, resolved inside the folder once: an alignment reads a payload several times
    _resolved: dict[str, Path] = field(default_factory=dict, init=False, repr=False, compare=False)
    _real_directory: Path | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def model_name(self) -> str:
        return self.roots[0].module_path

    @property
    def compute_dtype(self) -> str | None:
        """The floating dtype the runtime computed in where the tensors do not show it (metadata ``compute_dtype``:
        ``"torch.bfloat16"`` for OpenVINO's bf16 inference precision), else None."""
        found = self.metadata.get(fmt.COMPUTE_DTYPE)
        return found if isinstance(found, str) and found.startswith(("torch.float", "torch.bfloat")) else None

    @property
    def graph(self) -> GraphVocabulary | None:
        """What the graph runtime's ops and scopes mean (metadata ``graph``), None for a trace of module calls."""
        return trace_vocabulary(self.metadata)

    @property
    def producer(self) -> str:
        """``"tracediff"`` for native traces, ``"transformers"`` for the standard debugger's."""
        return "tracediff" if self.metadata.get(fmt.PRODUCER_KEY) else "transformers"

    @property
    def importer(self) -> str | None:
        """The kind of dump this trace was imported from (``"msprobe"``, ``"tensors"``), or None for a capture."""
        options = self.metadata.get("options")
        found = options.get(fmt.IMPORTER_OPTION) if isinstance(options, dict) else None
        kind = found.get("kind") if isinstance(found, dict) else None
        return kind if isinstance(kind, str) else None

    def forward_parameters(self, node: Node) -> tuple[str, ...] | None:
        """The parameter names of ``node``'s ``forward`` (metadata ``forward_parameters``), or None when unknown."""
        if self._parameters is None:
            self._parameters = fmt.forward_parameters(self.metadata)
        return self._parameters.get(node.module_type) if node.module_type else None

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
        path = self._resolved.get(record.payload)
        if path is None:
            if self._real_directory is None:
                self._real_directory = resolved_folder(self.directory)
            path = self._resolved[record.payload] = resolve_inside(self.directory, record.payload,
                                                                   real_root=self._real_directory)
        return path

    def load(self, record: TensorRecord) -> torch.Tensor:
        """Read the payload of ``record`` (memory-mapped through ``safe_open``; a regular file inside the folder)."""
        return read_tensor_file(check_regular_file(self.payload_path(record), root=self.directory,
                                                   error=PayloadError, what="payload",
                                                   missing="payload file is missing"), payload=True)

    def load_payload(self, record: TensorRecord) -> Payload:
        """Read the payload of ``record`` with numpy, no torch (memory-mapped; a regular file inside the folder)."""
        from .payload import read_payload  # numpy is imported once a payload is read

        return read_payload(self.payload_path(record), root=self.directory, resolved=True)

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


def is_trace_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder read as a trace as it is: one rank's trace (or a crashed capture's
    journal), or a multi-rank folder; never another tool's dump, which the importers would take."""
    if not Path(path).is_dir():
        return False
    if is_multi_rank(path):
        return True
    try:
        find_trace_json(path)
    except TraceFormatError:
        return False
    return True


def load_trace(path: str | Path) -> Trace:
    """Load the trace at ``path``: a trace folder, or its FULL_TENSORS / SUMMARY JSON file.

    Raises ``TraceFormatError`` naming the file when it is missing, not JSON,
    truncated, or not a call tree, or when its metadata carries a
    ``format_version`` of a newer major version than this tracediff reads.
    """
    json_path = find_trace_json(path)
    directory = json_path.parent
    # confined to the folder given (or the JSON file's folder), bounded, regular files only
    tree, metadata = read_tree(json_path, Path(path) if Path(path).is_dir() else directory)
    metadata_file = directory / fmt.METADATA_FILE
    fmt.check_format_version(metadata, metadata_file)
    builder = _Builder(json_path)  # checks every field's type as it reads it (tracediff.trace.validate)
    later, backward_entries = builder.check.top(tree)
    try:
        roots = [builder.node(tree, None, 0, "the top")]
        for call in later:
            roots.append(builder.node(call, None, 0, "the top"))
        steps = [builder.check.step(call) for call in [tree, *later]]
        tokens = [builder.check.tokens(call, step) for call, step in zip([tree, *later], steps)]
        backward = builder.backward(backward_entries)
    except RecursionError:
        raise TraceFormatError(f"{json_path}: the call tree nests too deeply to be read; refused") from None
    del tree, later, backward_entries
    check_graph_order(roots, json_path)
    vocabulary = trace_vocabulary(metadata)
    group_scopes([root for root, step in zip(roots, steps) if step is not None],  # graph nodes: graph_scopes.py
                 vocabulary.scopes if vocabulary is not None else "blocks")
    trace = Trace(directory=directory, json_path=json_path, roots=roots, metadata=metadata, backward=backward,
                  root_steps=steps, root_tokens=tokens, layouts=builder.layouts)
    if trace.producer == "transformers":
        _mark_overwritten_payloads(trace)
    return trace


class _Builder:
    """One walk over the JSON tree: each part is checked, then turned into nodes and tensor records."""

    def __init__(self, json_path: Path) -> None:
        self.json_path = json_path
        self.check = TreeChecker(json_path)
        self.order = 0
        self.layouts: dict[int, Any] = {}
        self.calls: dict[str, int] = {}

    def node(self, obj: Any, parent: Node | None, depth: int, parent_path: str) -> Node:
        children = self.check.node(obj, parent_path)
        path = obj[fmt.MODULE_PATH]
        call_index = obj.get(fmt.CALL_INDEX)
        seen = self.calls.get(path, 0)
        if call_index is None:
            call_index = seen
        self.calls[path] = call_index + 1 if call_index >= seen else seen
        # by position, the rest set after: binding keywords cost more than building the node (one per call)
        node = Node(path, path.partition(".")[2], call_index, obj.get(fmt.MODULE_TYPE), depth, self.order)
        node.parent = parent
        node.error = obj.get(fmt.ERROR)
        attributes = obj.get(fmt.ATTRIBUTES)
        if isinstance(attributes, dict):
            node.attributes = attributes
        node.graph = fmt.SOURCES in obj
        scopes = obj.get(fmt.NODE_SCOPES)
        if node.graph and isinstance(scopes, list) and scopes and all(isinstance(s, str) and s for s in scopes):
            node.scopes = tuple(scopes)
        inputs = obj.get(fmt.INPUTS)
        if inputs is not None:
            self._flatten(inputs, "inputs", node)
        for child in children:  # op nodes (op-level capture) go to ``ops``, module calls to ``children``
            if fmt.is_op_node(child):
                self.check.node(child, path)
                node.ops.append(self.op_node(child, node, depth + 1))
            else:
                node.children.append(self.node(child, node, depth + 1, path))
        node.exit_order = self.order
        outputs = obj.get(fmt.OUTPUTS)
        if outputs is not None:
            node.has_outputs = True
            self._flatten(outputs, "outputs", node)
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

    def backward(self, entries: list[Any]) -> list[Node]:
        """Backward nodes, their records ordered by the clock the capture kept."""
        nodes, events = [], []
        for i, entry in enumerate(entries):
            self.check.backward_entry(i, entry)
            path = entry[fmt.MODULE_PATH]
            node = Node(module_path=path, relative_path=path.partition(".")[2],
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
        kind = type(value)
        if kind is dict:  # the rules of fmt.is_typed_value and fmt.is_tensor_entry, inlined: a call per value
            if type(value.get(fmt.PY_TYPE)) is str:
                node.values[slot] = _typed_value(value)
            elif fmt.PY_TYPE not in value and type(value.get(fmt.SHAPE)) is str and type(value.get(fmt.DTYPE)) is str:
                node.tensors.append(self._tensor_record(value, slot, node))
            else:
                for key, item in value.items():
                    self._flatten(item, f"{slot}.{key}", node)
        elif kind is list:
            for i, item in enumerate(value):
                self._flatten(item, f"{slot}.{i}", node)
        elif value is not None:
            node.values[slot] = ReprValue(value) if isinstance(value, str) else value

    def _tensor_record(self, entry: dict[str, Any], slot: str, node: Node) -> TensorRecord:
        stats = self.check.tensor(entry, node)
        if stats is None:
            stats = {key: parsed for key in fmt.STRING_STAT_KEYS
                     if (parsed := parse_scalar(entry.get(key))) is not None}
        stored = entry.get(fmt.VALUE)
        problem = None if stored is None or type(stored) is str else value_problem(stored)
        layout = entry.get(fmt.LAYOUT)
        if layout is not None:
            self.layouts[self.order] = layout
        self.order += 1
        # by position (slot, order, shape, dtype, stats, payload, repr_lines, stale_reason): one call per tensor
        return _build_record(slot, self.order - 1, parse_shape(entry[fmt.SHAPE]), entry[fmt.DTYPE], stats,
                             stored if type(stored) is str else None,
                             tuple(stored) if type(stored) is list and problem is None else None,
                             problem)  # a 'value' that is a number or an object: said in the row


def _typed_value(entry: dict[str, Any]) -> Any:
    known, value = fmt.typed_value_content(entry)
    return value if known else ReprValue(str(entry.get(fmt.REPR, "")))


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
            node.tensors[i] = replace(record, stale_reason=reason)
