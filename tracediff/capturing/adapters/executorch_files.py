"""Reading an ExecuTorch program (``.pte``) and its ETRecord from untrusted files, and the ETDump of a run.

* The program is a regular file (no symbolic link) of at most ``PROGRAM_LIMIT`` bytes starting with
  ExecuTorch's flatbuffer identifier (``ET`` and two digits at bytes 4 to 8); ExecuTorch's own deserializer
  reads its method's inputs (a non-tensor input, such as ``use_cache=False``, is a value the program holds)
  and its delegates. A file it cannot read is refused.
* The ETRecord is a zip file. Only its JSON members are read: the edge program the ``.pte`` was emitted from
  (``edge_dialect_exported_program/<method>``: every node's op, inputs, outputs, ``debug_handle`` and
  ``nn_module_stack``, and the method's input names), ``debug_handle_map`` (instruction -> debug handle) and
  ``delegate_map``. Its pickled members (state dicts, example inputs) are never opened. Each member is bounded.
* The ETDump is read with ExecuTorch's deserializer, and each debug event's tensor from the debug buffer
  by its offset, size and scalar type, bounds checked.

Every refusal is one :class:`tracediff.errors.UsageError` line naming the file.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from ...files.confine import GiB, MiB, open_regular, read_bounded

if TYPE_CHECKING:
    import numpy as np


#: A ``.pte`` is read into memory once (ExecuTorch loads it from that buffer).
PROGRAM_LIMIT = 16 * GiB
#: The ETRecord's edge program JSON (graph and metadata, no weights), and each of its small maps.
GRAPH_JSON_LIMIT = 2 * GiB
MAP_JSON_LIMIT = 256 * MiB
INSTALL = "pip install --no-deps executorch==1.5.1 (see README: its requirements are installed one by one)"
_EDGE = "edge_dialect_exported_program/"
# ExecuTorch's ScalarType (exir/scalar_type.py) as numpy dtypes; BFloat16 as ml_dtypes' when installed.
_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                 7: "float64", 11: "bool", 15: "bfloat16"}
# torch.export's serialized ScalarType (export/serde/schema.py) -> bytes per element, for the buffer estimate.
_SERIAL_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 2, 7: 4, 8: 8, 12: 1, 13: 2}


def import_executorch() -> Any:
    """``executorch.runtime`` (its pybinding), or UsageError saying how to install it."""
    import logging

    quiet = logging.getLogger("torchao")  # it warns on import that its C++ ops do not match this torch: unused here
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        import executorch.runtime as runtime
        import executorch.version  # noqa: F401 - the version the metadata names (1.5.1+cpu)
    except (ImportError, OSError) as e:
        raise UsageError(f"executorch cannot be imported ({_first_line(e)}): {INSTALL}") from None
    finally:
        quiet.setLevel(level)
    return runtime


@dataclass(frozen=True)
class EdgeNode:
    """One node of the ETRecord's edge program."""

    name: str
    op: str  # "aten.mm.default", "dim_order_ops._clone_dim_order.default", "getitem"
    handle: int | None
    scopes: tuple[str, ...]  # module paths, outermost first, the root left out
    inputs: tuple[str, ...]  # the tensor values it reads
    outputs: tuple[str, ...]
    strings: tuple[tuple[str, str], ...] = ()  # its string arguments: (("approximate", "tanh"),)

    @property
    def short(self) -> str:
        """The op's name without namespace and overload: ``mm``, ``_clone_dim_order``."""
        parts = self.op.split(".")
        return parts[1] if len(parts) >= 3 else parts[-1]


@dataclass
class EtRecord:
    """What capture reads of an ETRecord: the edge graph of one method and the instruction maps."""

    label: str
    method: str
    nodes: list[EdgeNode]
    input_names: list[str]  # the method's flattened inputs: "kwargs.input_ids", "args.0"
    handles: dict[int, int | list[int]]  # instruction id -> debug handle (a list for a delegate call)
    delegates: dict[int, str]  # instruction id -> backend id ("XnnpackBackend")
    tensor_bytes: int  # all node outputs together (no weights), for the debug buffer's size
    root_class: str | None  # the exported module's class, from nn_module_stack
    graph_outputs: tuple[str, ...]
    placeholders: list[str]  # the tensor inputs' own names ("input_ids"), in order
    shapes: dict[str, tuple[int | None, ...]]
    schema: str  # the export schema version of the edge program
    producers: dict[str, tuple[EdgeNode, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node in self.nodes:
            for k, name in enumerate(node.outputs):
                self.producers[name] = (node, k)


def check_program_file(path: Path) -> bytes:
    """The bytes of the ``.pte`` file ``path`` (see the module docstring)."""
    if path.is_symlink():
        raise UsageError(f"{path}: a symbolic link; refused (give the program file itself)")
    data = read_bounded(path, limit=PROGRAM_LIMIT, error=UsageError, what="ExecuTorch program")
    check_program_bytes(data, str(path))
    return data


def check_program_bytes(data: bytes, label: str) -> None:
    """UsageError unless ``data`` starts like an ExecuTorch program (flatbuffer identifier ``ETnn``)."""
    ident = data[4:8]
    if len(data) < 8 or ident[:2] != b"ET" or not ident[2:].isdigit():
        raise UsageError(f"{label}: not an ExecuTorch program (no ET flatbuffer identifier at bytes 4-8; "
                         f"found {ident!r})")


@dataclass(frozen=True)
class ProgramFacts:
    """What the program itself says: its methods, each method's non-tensor inputs and its delegates."""

    methods: tuple[str, ...]
    constants: dict[int, Any]  # input position -> the value the program was exported with (a bool, an int)
    delegate_ids: tuple[str, ...]
    operators: tuple[str, ...]
    instructions: int  # in the method's first chain
    #: delegate call instruction -> (how many of its arguments are inputs, the shapes of its outputs)
    delegate_calls: dict[int, tuple[int, tuple[tuple[int, ...], ...]]] = field(default_factory=dict)


def program_facts(data: bytes, label: str, method: str) -> ProgramFacts:
    """Read the program with ExecuTorch's deserializer; UsageError for a file it cannot read."""
    try:
        from executorch.exir._serialize._program import deserialize_pte_binary

        pte = deserialize_pte_binary(data)
    except ImportError as e:
        raise UsageError(f"executorch cannot be imported ({_first_line(e)}): {INSTALL}") from None
    except Exception as e:  # noqa: BLE001 - flatc's and the deserializer's errors for a damaged file
        raise UsageError(f"{label}: not a readable ExecuTorch program ({_first_line(e)})") from None
    program = getattr(pte, "program", pte)
    plans = {plan.name: plan for plan in program.execution_plan}
    plan = plans.get(method)
    if plan is None:
        raise UsageError(f"{label}: the program has no method {method!r} (it has {', '.join(sorted(plans))})")
    constants: dict[int, Any] = {}
    for position, index in enumerate(plan.inputs):
        value = getattr(plan.values[index], "val", None)
        if type(value).__name__ != "Tensor":
            constants[position] = next((getattr(value, name) for name in ("bool_val", "int_val", "double_val")
                                        if hasattr(value, name)), None)
    return ProgramFacts(methods=tuple(plans), constants=constants,
                        delegate_ids=tuple(delegate.id for delegate in plan.delegates),
                        operators=tuple(f"{op.name}.{op.overload}" if op.overload else op.name
                                        for op in plan.operators),
                        instructions=len(plan.chains[0].instructions) if plan.chains else 0,
                        delegate_calls=_delegate_calls(plan))


def _delegate_calls(plan: Any) -> dict[int, tuple[int, tuple[tuple[int, ...], ...]]]:
    """Each delegate call's arguments split into inputs and outputs: its outputs are the trailing arguments
    no earlier instruction wrote (a kernel call writes its last argument, its ``out``)."""
    values = plan.values
    defined = set(plan.inputs)
    calls: dict[int, tuple[int, tuple[tuple[int, ...], ...]]] = {}
    for position, instruction in enumerate(plan.chains[0].instructions if plan.chains else ()):
        call = instruction.instr_args
        args = list(getattr(call, "args", None) or [])
        if type(call).__name__ == "DelegateCall":
            first = len(args)
            while first > 0 and args[first - 1] not in defined and _is_planned_tensor(values[args[first - 1]]):
                first -= 1
            calls[position] = (first, tuple(tuple(int(n) for n in values[i].val.sizes) for i in args[first:]))
            defined.update(args)
        elif args:
            defined.add(args[-1])
    return calls


def _is_planned_tensor(value: Any) -> bool:
    """A tensor the memory plan places (not a constant weight)."""
    tensor = getattr(value, "val", None)
    return type(tensor).__name__ == "Tensor" and getattr(tensor, "data_buffer_idx", 0) == 0


def read_etrecord(path: Path, method: str = "forward") -> EtRecord:
    """The edge graph and maps of the ETRecord ``path`` (a zip; only its JSON members are read)."""
    if path.is_symlink():
        raise UsageError(f"{path}: a symbolic link; refused (give the ETRecord file itself)")
    fd, _ = open_regular(path, error=UsageError, what="ETRecord")
    with os.fdopen(fd, "rb") as f:
        try:
            archive = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise UsageError(f"{path}: not an ETRecord (not a zip file: {_first_line(e)})") from None
        with archive:
            names = set(archive.namelist())
            graph_name = _EDGE + method
            if graph_name not in names:
                methods = sorted(name[len(_EDGE):] for name in names
                                 if name.startswith(_EDGE) and "/" not in name[len(_EDGE):]
                                 and not name.endswith(("_state_dict", "_constants", "_example_inputs")))
                raise UsageError(f"{path}: not an ETRecord of method {method!r} (no {graph_name}; its methods: "
                                 f"{', '.join(methods) or 'none'})")
            graph = _member_json(archive, graph_name, GRAPH_JSON_LIMIT, path)
            handle_map = _member_json(archive, "debug_handle_map", MAP_JSON_LIMIT, path) \
                if "debug_handle_map" in names else {}
            delegate_map = _member_json(archive, "delegate_map", MAP_JSON_LIMIT, path) \
                if "delegate_map" in names else {}
    try:
        return _parse_etrecord(str(path), method, graph, handle_map, delegate_map)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise UsageError(f"{path}: not an ETRecord this version reads ({type(e).__name__}: "
                         f"{_first_line(e)})") from None


def _member_json(archive: zipfile.ZipFile, name: str, limit: int, path: Path) -> Any:
    info = archive.getinfo(name)
    if info.file_size > limit:
        raise UsageError(f"{path}: ETRecord member {name} is {info.file_size:,} bytes, over the limit of "
                         f"{limit:,}; refused")
    try:
        with archive.open(info) as member:
            data = member.read(limit + 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise UsageError(f"{path}: ETRecord member {name} cannot be read ({_first_line(e)})") from None
    if len(data) > limit:
        raise UsageError(f"{path}: ETRecord member {name} is over the limit of {limit:,} bytes; refused")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{path}: ETRecord member {name} is not JSON ({_first_line(e)})") from None


def _parse_etrecord(label: str, method: str, graph: Any, handle_map: Any, delegate_map: Any) -> EtRecord:
    module = graph["graph_module"]
    body = module["graph"]
    nodes = [_edge_node(raw) for raw in body["nodes"]]
    values = body.get("tensor_values", {})
    tensor_bytes = sum(_value_bytes(values[name]) for node in nodes for name in node.outputs if name in values)
    handles: dict[int, int | list[int]] = {}
    for instruction, handle in dict(handle_map.get(method, {})).items():
        handles[int(instruction)] = [int(h) for h in handle] if isinstance(handle, list) else int(handle)
    delegates = {int(instruction): str(entry.get("name", "delegate"))
                 for instruction, entry in dict(delegate_map.get(method, {})).items()}
    root_class = next((_root_class(raw) for raw in body["nodes"] if _root_class(raw)), None)
    placeholders = [name for spec in module.get("signature", {}).get("input_specs", [])
                    if "user_input" in spec for name in _tensor_names(spec["user_input"])]
    shapes = {str(name): tuple(size.get("as_int") if isinstance(size, dict) else None
                               for size in value.get("sizes", []))
              for name, value in body.get("tensor_values", {}).items()}
    version = graph.get("schema_version") or {}
    return EtRecord(label=label, method=method, nodes=nodes, input_names=_input_names(module),
                    handles=handles, delegates=delegates, tensor_bytes=tensor_bytes, root_class=root_class,
                    graph_outputs=tuple(_tensor_names(body.get("outputs", []))), placeholders=placeholders,
                    shapes=shapes, schema=f"{version.get('major', '?')}.{version.get('minor', '?')}")


def _edge_node(raw: dict[str, Any]) -> EdgeNode:
    meta = raw.get("metadata") or {}
    handle = meta.get("debug_handle")
    target = str(raw["target"])
    for prefix in ("executorch.exir.dialects.edge.ops.", "torch.ops.", "_operator."):
        target = target.removeprefix(prefix)
    return EdgeNode(name=str(raw["name"]), op=target,
                    handle=int(handle) if isinstance(handle, (str, int)) and str(handle).isdigit() else None,
                    scopes=module_scopes(meta.get("nn_module_stack")),
                    inputs=tuple(_tensor_names(raw.get("inputs", []))),
                    outputs=tuple(_tensor_names(raw.get("outputs", []))), strings=_string_arguments(raw))


def _string_arguments(raw: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """A serialized node's string arguments (``approximate="tanh"`` of a GELU), as (name, value) pairs."""
    found: list[tuple[str, str]] = []
    for item in raw.get("inputs") or []:
        arg = item.get("arg") if isinstance(item, dict) else None
        if isinstance(arg, dict) and isinstance(arg.get("as_string"), str) and isinstance(item.get("name"), str):
            found.append((item["name"], arg["as_string"]))
    return tuple(found)


def module_scopes(stack: Any) -> tuple[str, ...]:
    """A serialized ``nn_module_stack`` (``"key,path,type;key,path,type"``) as its module paths, outermost
    first, the root ``""`` left out: ``("model", "model.layers.0", "model.layers.0.mlp")``."""
    if not isinstance(stack, str) or not stack:
        return ()
    paths: list[str] = []
    for entry in stack.split(";"):
        parts = entry.split(",")
        path = ",".join(parts[1:-1]) if len(parts) >= 3 else ""
        if path and path not in paths:
            paths.append(path)
    return tuple(paths)


def _root_class(raw: dict[str, Any]) -> str | None:
    stack = (raw.get("metadata") or {}).get("nn_module_stack")
    if not isinstance(stack, str) or not stack:
        return None
    parts = stack.split(";")[0].split(",")
    return parts[-1].rsplit(".", 1)[-1] if len(parts) >= 3 and not parts[1] else None


def _tensor_names(value: Any) -> Iterator[str]:
    """The tensor value names in a serialized node's ``inputs`` or ``outputs``, in order."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("as_tensor", "as_optional_tensor") and isinstance(item, dict) and "name" in item:
                yield str(item["name"])
            elif key in ("as_tensors", "as_optional_tensors") and isinstance(item, list):
                for entry in item:
                    if isinstance(entry, dict) and "name" in entry:
                        yield str(entry["name"])
                    else:
                        yield from _tensor_names(entry)
            else:
                yield from _tensor_names(item)
    elif isinstance(value, list):
        for item in value:
            yield from _tensor_names(item)


def _value_bytes(value: Any) -> int:
    sizes = [size.get("as_int", 1) if isinstance(size, dict) else 1 for size in value.get("sizes", [])]
    return math.prod(int(s) for s in sizes) * _SERIAL_BYTES.get(int(value.get("dtype", 7)), 8)


def _input_names(module: dict[str, Any]) -> list[str]:
    """The method's inputs in the program's order, by the name the inputs file gives them: ``args.i`` for
    positional ones, ``kwargs.NAME`` for keywords (from the exported signature's ``in_spec``)."""
    entries = module.get("module_call_graph") or []
    spec_text = next((entry.get("signature", {}).get("in_spec") for entry in entries if entry.get("fqn") == ""),
                     None)
    if not spec_text:
        return []
    spec = json.loads(spec_text)
    root = spec[1] if isinstance(spec, list) and len(spec) == 2 else spec
    children = root.get("children_spec", [])
    names: list[str] = []
    if len(children) == 2 and children[1].get("type") == "builtins.dict":
        _leaf_names(children[0], "args", names)
        _leaf_names(children[1], "kwargs", names)
    else:
        _leaf_names(root, "args", names)
    return names


def _leaf_names(spec: dict[str, Any], prefix: str, names: list[str]) -> None:
    children = spec.get("children_spec") or []
    if spec.get("type") is None and not children:
        names.append(prefix)
        return
    context = spec.get("context")
    keys = json.loads(context) if isinstance(context, str) and context not in ("null", "") else None
    for i, child in enumerate(children):
        key = keys[i] if isinstance(keys, list) and i < len(keys) else i
        _leaf_names(child, f"{prefix}.{key}", names)


@dataclass(frozen=True)
class DebugOutput:
    """One debug event of a run: an instruction's ``index``-th output, its data or None (none in the buffer)."""

    instruction: int
    index: int
    data: np.ndarray | None
    kernel: str | None  # "mm.out", from the instruction's profile event; None for a delegate call


def read_etdump(etdump: bytes, buffer: bytes) -> list[DebugOutput]:
    """The debug events of the last ``Execute`` run of an ETDump, with their tensors from ``buffer``."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    dump = deserialize_from_etdump_flatcc(etdump)
    runs = [run for run in dump.run_data if any(event.debug_event for event in (run.events or []))]
    if not runs:
        return []
    outputs: list[DebugOutput] = []
    counts: dict[int, int] = {}
    kernels: dict[int, str] = {}
    pending: list[tuple[int, Any]] = []
    for event in runs[-1].events or []:
        profile = event.profile_event
        if profile is not None and profile.name and profile.name.startswith("native_call_"):
            kernels[profile.instruction_id] = profile.name.removeprefix("native_call_")
        debug = event.debug_event
        marked = getattr(getattr(debug, "debug_entry", None), "output", None)
        if debug is not None and not getattr(marked, "bool_val", False):  # not the method's outputs, logged again
            pending.append((debug.instruction_id, debug.debug_entry))
    for instruction, entry in pending:
        for data in _entry_arrays(entry, buffer):
            index = counts.get(instruction, 0)
            counts[instruction] = index + 1
            outputs.append(DebugOutput(instruction, index, data, kernels.get(instruction)))
    return outputs


def _entry_arrays(entry: Any, buffer: bytes) -> list[np.ndarray | None]:
    if entry.val == "Tensor" and entry.tensor is not None:
        return [_tensor(entry.tensor, buffer)]
    if entry.val == "TensorList" and entry.tensor_list is not None:
        return [_tensor(tensor, buffer) for tensor in entry.tensor_list.tensors]
    return []  # an int, a float, a bool: no tensor to compare


def _tensor(tensor: Any, buffer: bytes) -> np.ndarray | None:
    import numpy as np

    name = _SCALAR_TYPES.get(int(getattr(tensor.scalar_type, "value", tensor.scalar_type)))
    if name is None or tensor.offset is None:
        return None
    if name == "bfloat16":
        try:
            import ml_dtypes

            dtype = np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return None
    else:
        dtype = np.dtype(name)
    sizes = [int(s) for s in tensor.sizes]
    size = math.prod(sizes) * dtype.itemsize
    offset = int(tensor.offset)
    if offset < 0 or offset + size > len(buffer):
        return None
    return np.frombuffer(buffer, dtype=dtype, count=math.prod(sizes), offset=offset).reshape(sizes).copy()


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(e).__name__


__all__ = ["DebugOutput", "EdgeNode", "EtRecord", "ProgramFacts", "check_program_bytes", "check_program_file",
           "import_executorch", "module_scopes", "program_facts", "read_etdump", "read_etrecord"]
