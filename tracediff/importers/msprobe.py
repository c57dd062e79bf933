"""The ``msprobe`` importer: a dump of Ascend's msprobe (mindstudio-probe), PyTorch or MindSpore.

msprobe writes, per step and rank, ``dump.json`` (``task``, ``level``,
``framework`` and ``data``: one record per call, in the order the calls
finished), ``construct.json`` (each record's enclosing module call) and,
for task ``tensor``, ``dump_tensor_data/`` with one ``.pt`` (PyTorch) or
``.npy`` (MindSpore) file per tensor, named by the record's ``data_name``.

How records become a trace:

* module records ``Module.{path}.{Class}.forward.{k}`` (``Cell.`` for
  MindSpore) are module calls ``{Model}.{path}``, call ``k``, nested as
  ``construct.json`` says (by module path where it is missing);
  ``input_args``/``input_kwargs`` are the inputs, ``output`` the outputs
  (a single output as itself, several as a list);
* API records ``Functional.linear.0.forward``, ``Tensor.__add__.0.forward``,
  ``Torch.matmul.0.forward`` ... are op nodes of their enclosing module call
  (``torch.nn.functional.linear``, ``torch.Tensor.__add__``,
  ``torch.matmul``; other prefixes keep theirs);
* module ``backward`` records are backward nodes: their ``input`` are the
  gradients that reached the module (``grad_outputs``), their ``output`` the
  gradients it produced (``grad_inputs``);
* each tensor keeps msprobe's ``Max``, ``Min`` and ``Mean`` as its
  statistics; its payload is the tensor file when the dump has one.

Left out, and said in the result's notes: the parameters msprobe records
with a module call, parameter gradients (``parameters_grad``), and the
backward records of APIs (tracediff records gradients per module). A
statistics-only dump (task ``statistics``) is compared on max, min and
mean, approximately; msprobe's ``Norm`` and ``md5`` have no counterpart.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from .. import format as fmt
from ..errors import DumpFormatError
from ..files.confine import SMALL_JSON_LIMIT, TRACE_JSON_LIMIT, read_json_file
from ._decoded import read_tensor_file
from ._files import TENSOR_SUFFIXES
from ._writer import TraceWriter
from .detect import one_msprobe_dump
from .tensors import Imported

_MODULE = re.compile(r"^(?:Module|Cell)\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward|parameters_grad)"
                     r"\.(?P<k>\d+)$")
_API = re.compile(r"^(?P<prefix>[A-Za-z_]+)\.(?P<api>.+)\.(?P<k>\d+)\.(?P<dir>forward|backward)$")
_OP_PREFIXES = {"Functional": "torch.nn.functional", "Tensor": "torch.Tensor", "Torch": "torch"}
ORDER = "the order of dump.json's records (msprobe writes each when its call finishes)"


def import_msprobe(src: Path, writer: TraceWriter, *, model_name: str) -> Imported:
    """Read the one msprobe dump in ``src`` and write it into ``writer``; the tree of the trace."""
    dump_file = one_msprobe_dump(src)
    dump = read_json_file(dump_file, limit=TRACE_JSON_LIMIT, root=src, error=DumpFormatError, what="msprobe dump.json")
    records = dump.get("data") if isinstance(dump, dict) else None
    if not isinstance(records, dict):
        raise DumpFormatError(f"{dump_file}: not an msprobe dump.json (no 'data' object of records)")
    construct_file = dump_file.with_name("construct.json")
    parents: dict[str, Any] = {}
    if construct_file.exists() or construct_file.is_symlink():
        loaded = read_json_file(construct_file, limit=SMALL_JSON_LIMIT, root=src, error=DumpFormatError,
                                what="msprobe construct.json")
        parents = loaded if isinstance(loaded, dict) else {}
    reader = _Reader(src, dump_file.with_name("dump_tensor_data"), writer, model_name)
    tree = reader.build(records, parents)
    notes = reader.notes(str(dump.get("task")))
    return Imported(tree, reader.calls, reader.tensors, ORDER, tuple(notes))


class _Reader:
    def __init__(self, root: Path, data_dir: Path, writer: TraceWriter, model_name: str) -> None:
        self.root, self.data_dir, self.writer, self.model = root, data_dir, writer, model_name
        self.calls = self.tensors = self.payloads = self.stats_only = 0
        self.left_out = {"module parameters": 0, "parameter gradients": 0, "API backward records": 0}

    def build(self, records: dict[str, Any], parents: dict[str, Any]) -> dict[str, Any]:
        nodes: dict[str, dict[str, Any]] = {}
        placed: list[tuple[str, dict[str, Any]]] = []  # (record name, node), in record order
        backward: list[dict[str, Any]] = []
        for name, record in records.items():
            if not isinstance(record, dict):
                raise DumpFormatError(f"{self.data_dir.parent / 'dump.json'}: record {name!r} is not an object")
            module, api = _MODULE.match(name), _API.match(name)
            if module and module["dir"] == "forward":
                nodes[name] = self._module_call(module, record)
                placed.append((name, nodes[name]))
            elif module and module["dir"] == "backward":
                backward.append(self._backward(module, record, len(backward)))
            elif module:
                self.left_out["parameter gradients"] += sum(len(v) if isinstance(v, list) else 1
                                                            for v in record.values())
            elif api and api["dir"] == "forward":
                placed.append((name, self._op(api, record)))
            elif api:
                self.left_out["API backward records"] += 1
        root = fmt.node_entry(self.model, module_type=self.model, call_index=0, inputs={}, children=[])
        for name, node in placed:  # in record order: a call's children finished before it, in the order they ran
            parent = nodes.get(parents.get(name) or "") or self._by_path(node, nodes, parents) or root
            parent[fmt.CHILDREN].append(node)
        for node in [root, *nodes.values()]:
            op_index = 0
            for child in node[fmt.CHILDREN]:
                if fmt.is_op_node(child):  # an op node takes its enclosing call's path and call index
                    child.update({fmt.MODULE_PATH: node[fmt.MODULE_PATH], fmt.CALL_INDEX: node[fmt.CALL_INDEX],
                                  fmt.OP_INDEX: op_index})
                    op_index += 1
            if not node[fmt.CHILDREN]:
                del node[fmt.CHILDREN]
        if backward:
            root[fmt.BACKWARD] = backward
        return root

    def _by_path(self, node: dict[str, Any], nodes: dict[str, dict[str, Any]],
                 parents: dict[str, Any]) -> dict[str, Any] | None:
        """The enclosing call of a record ``construct.json`` does not place: the longest module path prefix."""
        if parents or fmt.is_op_node(node):
            return None
        path = node[fmt.MODULE_PATH]
        best = None
        for other in nodes.values():
            other_path = other[fmt.MODULE_PATH]
            if path.startswith(other_path + ".") and other[fmt.CALL_INDEX] == node[fmt.CALL_INDEX] and (
                    best is None or len(other_path) > len(best[fmt.MODULE_PATH])):
                best = other
        return best

    def _module_call(self, match: re.Match[str], record: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        path, k = f"{self.model}.{match['path']}", int(match["k"])
        prefix = fmt.call_prefix(path, k)
        params = record.get("parameters")
        self.left_out["module parameters"] += len(params) if isinstance(params, dict) else 0
        node = fmt.node_entry(path, module_type=match["cls"], call_index=k, inputs=self._inputs(record, prefix),
                              children=[])
        node[fmt.OUTPUTS] = self._outputs(record.get("output"), fmt.payload_name(prefix, fmt.OUTPUTS))
        return node

    def _op(self, match: re.Match[str], record: dict[str, Any]) -> dict[str, Any]:
        op = f"{_OP_PREFIXES.get(match['prefix'], match['prefix'])}.{match['api']}"
        prefix = fmt.payload_stem(f"{match['prefix']}.{match['api']}.{match['k']}")
        return fmt.op_node_entry(self.model, 0, op, 0, self._inputs(record, prefix),
                                 self._outputs(record.get("output"), fmt.payload_name(prefix, fmt.OUTPUTS)))

    def _backward(self, match: re.Match[str], record: dict[str, Any], i: int) -> dict[str, Any]:
        path, k = f"{self.model}.{match['path']}", int(match["k"])
        prefix = fmt.call_prefix(path, k)
        grads = [self._value(v, fmt.payload_name(fmt.payload_name(prefix, fmt.GRAD_OUTPUTS), j))
                 for j, v in enumerate(_list(record.get("input")))]
        node = fmt.backward_node_entry(path, match["cls"], k, grads, 2 * i)
        node[fmt.GRAD_INPUTS] = [self._value(v, fmt.payload_name(fmt.payload_name(prefix, fmt.GRAD_INPUTS), j))
                                 for j, v in enumerate(_list(record.get("output")))]
        node[fmt.BACKWARD_ORDER] = [2 * i, 2 * i + 1]
        return node

    def _inputs(self, record: dict[str, Any], prefix: str) -> dict[str, Any]:
        name = fmt.payload_name(prefix, fmt.INPUTS)
        inputs: dict[str, Any] = {}
        args = _list(record.get("input_args"))
        if args:
            inputs[fmt.ARGS] = [self._value(v, fmt.payload_name(fmt.payload_name(name, fmt.ARGS), i))
                                for i, v in enumerate(args)]
        kwargs = record.get("input_kwargs")
        if isinstance(kwargs, dict) and kwargs:
            inputs[fmt.KWARGS] = {str(k): self._value(v, fmt.payload_name(fmt.payload_name(name, fmt.KWARGS), k))
                                  for k, v in kwargs.items()}
        return inputs

    def _outputs(self, value: Any, name: str) -> Any:
        items = _list(value)
        if len(items) == 1:
            return self._value(items[0], name)
        return [self._value(v, fmt.payload_name(name, i)) for i, v in enumerate(items)]

    def _value(self, value: Any, name: str) -> Any:
        if isinstance(value, list):
            return [self._value(v, fmt.payload_name(name, i)) for i, v in enumerate(value)]
        if not isinstance(value, dict):
            return None if value is None else fmt.typed_repr(type(value).__name__, repr(value))
        if isinstance(value.get("dtype"), str) and isinstance(value.get("shape"), list):
            return self._tensor(value, name)
        if "type" in value:
            content = value.get("value")
            if fmt.is_json_safe(content):
                return {fmt.PY_TYPE: str(value["type"]), fmt.PY_VALUE: fmt.as_json(content)}
            return fmt.typed_repr(str(value["type"]), repr(content))
        return {str(k): self._value(v, fmt.payload_name(name, k)) for k, v in value.items()}

    def _tensor(self, entry: dict[str, Any], name: str) -> dict[str, Any]:
        self.tensors += 1
        shape = entry["shape"]
        if not all(isinstance(d, int) and d >= 0 for d in shape) or len(shape) > 64:
            raise DumpFormatError(f"{self.data_dir.parent / 'dump.json'}: tensor {name} has shape {shape!r:.60}")
        stats: dict[str, Any] = {"numel": math.prod(shape)}
        for ours, theirs in (("mean", "Mean"), ("min", "Min"), ("max", "Max")):
            number = _number(entry.get(theirs))
            if number is not None:
                stats[ours] = number
        data_name = entry.get("data_name")
        if not isinstance(data_name, str) or not data_name.lower().endswith(TENSOR_SUFFIXES):
            self.stats_only += 1
            return self.writer.stats_entry(tuple(shape), entry["dtype"], stats)
        (tensor,) = _one(read_tensor_file(self.data_dir / data_name, self.root), self.data_dir / data_name)
        if list(tensor.shape) != shape:
            raise DumpFormatError(f"{self.data_dir / data_name}: holds shape {list(tensor.shape)}; dump.json "
                                  f"records {shape}")
        self.payloads += 1
        written = self.writer.entry(tensor, name)
        written[fmt.STATS] = {**stats, **written[fmt.STATS]}
        return written

    def notes(self, task: str) -> list[str]:
        notes = [f"{n} {what} left out" for what, n in self.left_out.items() if n]
        if self.stats_only:
            notes.append(f"{self.stats_only} of {self.tensors} tensors have statistics only (task {task}): "
                         "compared on max, min and mean, approximately")
        return notes


def _one(tensors: list[Any], path: Path) -> list[Any]:
    if len(tensors) != 1:
        raise DumpFormatError(f"{path}: holds {len(tensors)} tensors; msprobe writes one per file")
    return tensors


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None
