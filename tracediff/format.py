"""The trace format: every file name, key and entry shape of a trace, in one place.

``docs/trace-format.md`` specifies the format; ``tracediff/trace_schema.json``
is its JSON Schema. Every writer (``tracediff.capture``, the drop-in for
transformers' debugger, backward capture) builds its nodes and tensor entries
with the functions below, and every reader takes its names from here, so a
name of the format is defined once.

A trace folder holds::

    {Model}_debug_tree_FULL_TENSORS.json   the call tree, tensor entries with "value"
    {Model}_debug_tree_SUMMARY.json        the same tree, tensor entries without "value"
    {stem}.safetensors                     one payload per tensor, the tensor under key "data"
    tracediff_metadata.json                tracediff's traces only: versions, options, "complete"

This module imports nothing heavy (no torch): tools that only read or write
JSON can use it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from .errors import TraceFormatError

# --- version ------------------------------------------------------------------------------------------------

#: ``"MAJOR.MINOR"``. A reader refuses a newer MAJOR and ignores what it does not know within a MAJOR.
#: Traces of tracediff 0.1 carry the integer ``1``, read as ``"1.0"``.
FORMAT_VERSION = "1.8"

# --- files --------------------------------------------------------------------------------------------------

TREE_SUFFIX = "_debug_tree"
FULL_SUFFIX = f"{TREE_SUFFIX}_FULL_TENSORS.json"
SUMMARY_SUFFIX = f"{TREE_SUFFIX}_SUMMARY.json"
METADATA_FILE = "tracediff_metadata.json"
#: Written while a capture runs, removed once the trace JSON is written: one JSON line per call started
#: (``{"enter": id, "parent": id|null, "module_path", "call_index", "module_type"}``) and per call finished
#: (``{"exit": id, "node": {the node without "children"}}``). A folder whose capture process died (SIGKILL,
#: out of memory) holds it instead of the trace JSON; readers rebuild the tree from it, marked incomplete.
JOURNAL_FILE = "tracediff_journal.jsonl"
JOURNAL_ENTER = "enter"
JOURNAL_EXIT = "exit"
JOURNAL_PARENT = "parent"
JOURNAL_NODE = "node"
JOURNAL_OP_IN = "op_in"  # an op node recorded inside the call of this journal id
JOURNAL_AT = "at"  # the op node's index among that call's children
JOURNAL_BACKWARD = "backward"  # a backward node, as recorded so far
#: Held (created exclusively) while a capture writes into the folder: ``"{pid} {host}"``.
LOCK_FILE = ".tracediff.lock"
#: The ``error`` type of a call that had not returned when the capture process died (journal traces only).
UNFINISHED_CALL = "CaptureProcessDied"
PAYLOAD_SUFFIX = ".safetensors"
#: The one key of every payload file.
PAYLOAD_KEY = "data"
#: Payload references in ``value`` are relative to the trace folder and start with this.
PAYLOAD_REFERENCE_PREFIX = "./"
#: ``ranks="all"`` writes one trace per rank into ``{out}/rank{r}``.
RANK_FOLDER_PREFIX = "rank"
#: The manifest of a multi-rank folder (``ranks="all"`` with more than one rank), beside its ``rank{r}/`` folders.
RANKS_FILE = "tracediff_ranks.json"
#: The manifest's keys, in the order written. ``ranks``: the rank folders' names, rank 0 first.
RANKS_KEYS = ("format_version", "tracediff_version", "world_size", "ranks", "mesh", "run_started", "model_name")
TRACE_FILE_SUFFIXES = (PAYLOAD_SUFFIX, FULL_SUFFIX, SUMMARY_SUFFIX)
SCHEMA_FILE = "trace_schema.json"
#: The ``options`` key of a trace written by ``tracediff import``: ``{"kind", "source", ...}`` of the dump it came from.
IMPORTER_OPTION = "importer"

# --- payload files (safetensors) ----------------------------------------------------------------------------

#: safetensors' dtype codes, with torch's name of each dtype and its bytes per element: what a payload may hold.
PAYLOAD_DTYPES: Mapping[str, tuple[str, int]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1), "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1), "F8_E8M0": ("float8_e8m0fnu", 1),
    "C64": ("complex64", 8), "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U64": ("uint64", 8), "U32": ("uint32", 4), "U16": ("uint16", 2), "U8": ("uint8", 1), "BOOL": ("bool", 1),
}
#: The largest payload header read (safetensors' own limit).
PAYLOAD_HEADER_LIMIT = 100 << 20


@dataclass(frozen=True)
class PayloadLayout:
    """Where one tensor of a payload file lies: its dtype code, shape, first data byte and byte count."""

    dtype: str
    shape: tuple[int, ...]
    start: int
    nbytes: int


def payload_header(code: str, shape: list[int] | tuple[int, ...], nbytes: int) -> bytes:
    """The bytes before a payload's data: the 8-byte little-endian header length, then the JSON header of one
    tensor under ``data`` (dtype ``code``, ``shape``, ``nbytes`` of data), padded with spaces to 8 bytes, as
    ``safetensors.torch.save_file`` writes it."""
    header = json.dumps({PAYLOAD_KEY: {"dtype": code, "shape": list(shape), "data_offsets": [0, nbytes]}},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header


def payload_layouts(head: bytes, file_size: int) -> dict[str, PayloadLayout]:
    """The tensors of a safetensors file, from its first ``min(file_size, 8 + PAYLOAD_HEADER_LIMIT)`` bytes.

    A reader MUST check what this checks before reading data: an 8-byte
    little-endian header length within the file and the limit, a JSON object
    header, known dtype codes, byte counts that match the shapes, and data
    offsets that tile the rest of the file exactly. Raises ``ValueError`` with
    the reason otherwise.
    """
    if file_size < 8 or len(head) < 8:
        raise ValueError("shorter than its 8-byte header length")
    length = int.from_bytes(head[:8], "little")
    if length > PAYLOAD_HEADER_LIMIT or 8 + length > file_size or 8 + length > len(head):
        raise ValueError(f"header length {length:,} does not fit the file of {file_size:,} bytes")
    try:
        header = json.loads(head[8:8 + length])
    except (ValueError, RecursionError):  # invalid JSON or UTF-8
        raise ValueError("its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    layouts, spans = {}, []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        layout, begin = _payload_layout(key, entry, 8 + length)
        layouts[key] = layout
        spans.append((begin, begin + layout.nbytes))
    spans.sort()
    end = 0
    for begin, stop in spans:
        if begin != end:
            raise ValueError("its data offsets leave a gap or overlap")
        end = stop
    if 8 + length + end != file_size:
        raise ValueError(f"its data offsets end at byte {8 + length + end:,} of {file_size:,}")
    return layouts


def _payload_layout(key: str, entry: Any, data_start: int) -> tuple[PayloadLayout, int]:
    if not isinstance(entry, dict):
        raise ValueError(f"tensor {key!r} is not described by an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in PAYLOAD_DTYPES:
        raise ValueError(f"tensor {key!r} has dtype {dtype!r}, which tracediff does not read")
    if not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2 \
            or not all(type(x) is int and x >= 0 for x in [*shape, *offsets]):
        raise ValueError(f"tensor {key!r} has no valid shape and data offsets")
    begin, end = offsets
    if end - begin != math.prod(shape) * PAYLOAD_DTYPES[dtype][1]:
        raise ValueError(f"tensor {key!r}: its data offsets do not hold its shape and dtype")
    return PayloadLayout(dtype, tuple(shape), data_start + begin, end - begin), begin


# --- node keys ----------------------------------------------------------------------------------------------

MODULE_PATH = "module_path"
MODULE_TYPE = "module_type"
CALL_INDEX = "call_index"
INPUTS = "inputs"
OUTPUTS = "outputs"
CHILDREN = "children"
ERROR = "error"
ARGS = "args"
KWARGS = "kwargs"
#: The members of a key/value cache argument recorded as its layer's tensors (section 3).
CACHE_KEYS, CACHE_VALUES = "keys", "values"


def is_cache_slot(slot: str) -> bool:
    """``inputs.kwargs.<argument>.keys`` or ``.values``: a cache layer's tensors, positions along dim -2."""
    parts = slot.split(".")
    return len(parts) == 4 and parts[0] == INPUTS and parts[1] == KWARGS and parts[3] in (CACHE_KEYS, CACHE_VALUES)
#: On the root node: later top-level calls of the model (tracediff only).
SUBSEQUENT_CALLS = "subsequent_calls"
#: On a top-level call made by ``generate``: its decode step (0 the prefill, k the pass reading the k-th new token).
STEP = "step"
#: The ``options`` key of a capture's decode steps: ``{"selected": [...] | null, "recorded": n, "full": [...]}``.
STEPS_OPTION = "steps"
STEPS_SELECTED = "selected"
STEPS_RECORDED = "recorded"
STEPS_FULL = "full"
STEPS_OTHERS = "others"  # what the steps not selected keep: "stats" (statistics) or "tree" (shapes and dtypes)
#: On a top-level call made by ``generate``: the tokens of its step (``docs/trace-format.md``, 2.2):
#: ``{"chosen": [id per sequence], "argmax": [...], "forced": true?, "prompt": [[...]] and "vocab_size": n on step 0}``.
TOKENS = "tokens"
TOKENS_CHOSEN = "chosen"
TOKENS_ARGMAX = "argmax"
TOKENS_FORCED = "forced"
TOKENS_PROMPT = "prompt"
TOKENS_VOCAB_SIZE = "vocab_size"
#: The ``options`` key of a teacher-forced capture: ``{"reference": folder, "steps": tokens fed}`` or null.
TEACHER_FORCING_OPTION = "teacher_forcing"
TEACHER_FORCING_REFERENCE = "reference"
TEACHER_FORCING_STEPS = "steps"
#: On the root node: backward nodes in the order their gradients arrived (tracediff only).
BACKWARD = "backward"
GRAD_OUTPUTS = "grad_outputs"
GRAD_INPUTS = "grad_inputs"
BACKWARD_ORDER = "backward_order"
#: ``error`` objects: the exception's type name and the first line of its message.
ERROR_TYPE = "type"
ERROR_MESSAGE = "message"
#: Op nodes (op-level capture), children of a module call: the qualified torch function name and its
#: position among the recorded ops of that call. They share the call's ``module_path`` and ``call_index``.
OP = "op"
OP_INDEX = "op_index"
#: Graph nodes (a runtime whose work is a graph: llama.cpp, ONNX Runtime), children of a top-level call: what
#: each node read, one reference per input (``{"module_path": p, "call_index": k}`` of an earlier node, or
#: ``{"external": text}`` for a value no node of the trace produced), and the runtime's attributes of the node.
SOURCES = "sources"
SOURCE_EXTERNAL = "external"
ATTRIBUTES = "attributes"
#: The ``py_type`` of an input read from outside the trace (a graph node's ``sources`` entry that is external).
EXTERNAL_INPUT = "external"
#: A graph node's module scopes, outermost first (``["model", "model.layers.0", "model.layers.0.mlp"]``), where
#: its runtime's scopes are module paths (1.7); absent: the scope is the node's path less its last segment.
NODE_SCOPES = "scopes"
#: The trace metadata's graph vocabulary (1.7, :mod:`tracediff.trace.vocabulary`): how the scopes read, and the
#: runtime's ops that move no value, keep the values' order, apply a rotary embedding, or round on purpose.
GRAPH_KEY = "graph"
GRAPH_SCOPES = "scopes"
GRAPH_VIEWS = "views"
GRAPH_SAME_VALUES = "same_values"
GRAPH_ROTARY = "rotary"
GRAPH_APPROXIMATIONS = "approximations"

# --- tensor entries -----------------------------------------------------------------------------------------

SHAPE = "shape"
DTYPE = "dtype"
#: A payload reference (``"./name.safetensors"``) or the tensor's repr lines; absent in SUMMARY files.
VALUE = "value"
STATS = "stats"
DEVICE = "device"
DTENSOR = "dtensor"
DTENSOR_GLOBAL_SHAPE = "global_shape"
DTENSOR_PLACEMENTS = "placements"
DTENSOR_RECORDED = "recorded"
#: A tensor's distributed layout (tracediff, ``ranks="all"``): one placement per mesh dimension, where it came from.
LAYOUT = "layout"
LAYOUT_PLACEMENTS = "placements"
LAYOUT_SOURCE = "source"
LAYOUT_GLOBAL_SHAPE = "global_shape"
LAYOUT_STYLE = "style"
#: ``source`` of a layout: a DTensor's own placements, the parallel style of the module that took or made the
#: tensor, or a rule of a ``--shards`` file (never written into a trace; a reader applies it).
LAYOUT_SOURCES = ("dtensor", "style", "declared")
#: Placement codes: replicated, sharded along tensor dim d (``S(-1)``: the last), a partial sum.
REPLICATE = "R"
PARTIAL = "P"
_SHARD_CODE = re.compile(r"S\((-?\d+)\)")
#: The ``mesh`` of a rank's metadata and of the manifest: its ``shape``, dimension names, this rank's coordinates.
MESH_SHAPE = "shape"
MESH_DIM_NAMES = "dim_names"
MESH_COORDINATES = "coordinates"
#: Statistics as ``repr()`` strings (``"tensor(0.0123)"``), as transformers' debugger writes them.
STRING_STAT_KEYS = ("mean", "std", "min", "max")
#: Statistics as JSON numbers under ``stats`` (tracediff only).
STAT_KEYS = ("numel", "mean", "std", "min", "max", "abs_mean", "nan", "posinf", "neginf", "zeros")
#: The ``stats`` keys that are exact counts.
COUNT_STAT_KEYS = ("numel", "nan", "posinf", "neginf", "zeros")
#: The ``stats`` keys whose values are moments or extremes of the elements (compared with a tolerance).
MOMENT_STAT_KEYS = ("mean", "std", "min", "max", "abs_mean")

# --- typed non-tensor values (tracediff only) ---------------------------------------------------------------

PY_TYPE = "py_type"
PY_VALUE = "py_value"
REPR = "repr"
#: Step records of tracediff 0.1 stored typed values under this key; read, never written.
LEGACY_PY_VALUE = "value"

# --- metadata -----------------------------------------------------------------------------------------------

FORMAT_VERSION_KEY = "format_version"
PRODUCER_KEY = "tracediff_version"
COMPLETE_KEY = "complete"
FRAMEWORK = "framework"  # the framework of the captured model: "torch", "mlx" or "jax" (metadata, spec section 7)
FRAMEWORK_VERSION = "framework_version"
TORCH_FRAMEWORK = "torch"
#: Every key of ``tracediff_metadata.json``, in the order written. Adding one is a MINOR version change.
METADATA_KEYS = (
    FORMAT_VERSION_KEY, PRODUCER_KEY, FRAMEWORK, FRAMEWORK_VERSION,
    "torch_version", "python_version", "transformers_version", "model_class",
    "model_name", "devices", "dtypes", "world_size", "rank", "created", "options", COMPLETE_KEY, ERROR,
    "capture_failure", "calls", "unrecorded_calls", "payload_files", "payload_bytes", "verification",
    "forward_parameters", "compile", "mesh", "run_started", "runtime", "graph", "compute_dtype",
)
#: Facts a runtime's adapter records about the model (a JSON object of its own: a gguf file's name, ...).
RUNTIME = "runtime"
#: The floating dtype the runtime computed in where its tensors do not show it (1.7): OpenVINO's bf16 inference
#: precision returns float32 tensors. A torch dtype name, ``"torch.bfloat16"``; absent when the tensors tell.
COMPUTE_DTYPE = "compute_dtype"
FORWARD_PARAMETERS = "forward_parameters"
#: How the model ran compiled (``torch.compile``): its compiled ``regions``, how their values were ``recording``
#: taken, and what Dynamo compiled ``during_capture`` (docs/compiled.md). Absent when nothing ran compiled.
COMPILE = "compile"
#: Calls that ran and whose record could not be placed in the tree (spec section 7); the trace is incomplete.
UNRECORDED_CALLS = "unrecorded_calls"
UNRECORDED_EXAMPLES = 20  # the calls an unrecorded_calls object names; its count has them all
RETURN_NOT_RECORDED = "ReturnNotRecorded"  # the error of a call kept without outputs (spec section 7)
COMPILE_REGIONS = "regions"
COMPILE_RECORDING = "recording"
COMPILE_DURING = "during_capture"

_UNSAFE_FILE_CHARS = re.compile(r"[^\w.@+=-]")
_PLAIN_SCALARS = (type(None), bool, int, float, str)
_ABSENT: Any = object()


# --- file names ---------------------------------------------------------------------------------------------


def trace_file_names(model_name: str) -> tuple[str, str]:
    """The FULL_TENSORS and SUMMARY file names of a trace of ``model_name`` (the root module's class name)."""
    return f"{model_name}{FULL_SUFFIX}", f"{model_name}{SUMMARY_SUFFIX}"


def is_trace_file(name: str) -> bool:
    """True for the names of the files a trace consists of (tree JSONs, payloads, metadata)."""
    return name == METADATA_FILE or name.endswith(TRACE_FILE_SUFFIXES)


def call_prefix(module_path: str, call_index: int) -> str:
    """Payload-name prefix of one module call: ``path`` for the first call, ``path@k`` for the k-th after it."""
    return module_path if call_index == 0 else f"{module_path}@{call_index}"


def payload_name(parent: str, key: str | int) -> str:
    """The name of a nested value: ``{parent}_{key}`` (``X_inputs_args_0``, ``X_outputs_last_hidden_state``)."""
    return f"{parent}_{key}"


def payload_stem(name: str) -> str:
    """``name`` with characters unsafe in file names replaced by ``_`` (before a ``~k`` collision suffix)."""
    return _UNSAFE_FILE_CHARS.sub("_", name)


def unique_payload_stem(name: str, taken: set[str], last: dict[str, int] | None = None) -> str:
    """``payload_stem(name)``, with ``~1``, ``~2``, ... appended when it is in ``taken``; added to ``taken``.

    ``last`` (kept by the caller from name to name) remembers the suffix each stem got last, so that the
    next call of the same module (a decode step: every module again) starts there, not at ``~1``.
    """
    stem = base = payload_stem(name)
    k = last.get(base, 0) if last is not None else 0
    if k:
        stem = f"{base}~{k}"
    while stem in taken:
        k += 1
        stem = f"{base}~{k}"
    taken.add(stem)
    if last is not None:
        last[base] = k
    return stem


def payload_file_name(stem: str) -> str:
    return f"{stem}{PAYLOAD_SUFFIX}"


def payload_reference(file_name: str) -> str:
    """The ``value`` of a tensor entry whose payload is ``file_name`` in the trace folder."""
    return f"{PAYLOAD_REFERENCE_PREFIX}{file_name}"


# --- entries ------------------------------------------------------------------------------------------------


def node_entry(
    module_path: str,
    *,
    module_type: str | None = None,
    call_index: int | None = None,
    inputs: Any = _ABSENT,
    outputs: Any = _ABSENT,
    children: Any = _ABSENT,
) -> dict[str, Any]:
    """A node of the call tree, keys in the order written; optional fields are left out when not given.

    The standard trace has ``module_path``, ``inputs``, ``outputs`` and
    ``children``; tracediff adds ``module_type`` and ``call_index``.
    """
    node: dict[str, Any] = {MODULE_PATH: module_path}
    if module_type is not None:
        node[MODULE_TYPE] = module_type
    if call_index is not None:
        node[CALL_INDEX] = call_index
    for key, value in ((INPUTS, inputs), (OUTPUTS, outputs), (CHILDREN, children)):
        if value is not _ABSENT:
            node[key] = value
    return node


def backward_node_entry(
    module_path: str, module_type: str, call_index: int, grad_outputs: Any, arrival: int
) -> dict[str, Any]:
    """A backward node; ``grad_inputs`` and the departure in ``backward_order`` are set when they are known."""
    node = node_entry(module_path, module_type=module_type, call_index=call_index)
    node[GRAD_OUTPUTS] = grad_outputs
    node[BACKWARD_ORDER] = [arrival, None]
    return node


def op_node_entry(
    module_path: str, call_index: int, op: str, op_index: int, inputs: Any, outputs: Any
) -> dict[str, Any]:
    """An op node: one torch function called by the module call ``module_path``/``call_index`` itself."""
    node = node_entry(module_path, call_index=call_index)
    node.update({OP: op, OP_INDEX: op_index, INPUTS: inputs, OUTPUTS: outputs})
    return node


def source_entry(module_path: str | None, call_index: int | None, external: str | None = None) -> dict[str, Any]:
    """One ``sources`` item of a graph node: an earlier node's identity, or ``{"external": text}``."""
    if module_path is None or call_index is None:
        return {SOURCE_EXTERNAL: external or ""}
    return {MODULE_PATH: module_path, CALL_INDEX: call_index}


def is_op_node(obj: Any) -> bool:
    """True for an op node (an object with a string ``op``) among a node's ``children``."""
    return isinstance(obj, dict) and isinstance(obj.get(OP), str)


def unrecorded_call_entry(module_path: str, call_index: int | None, why: str) -> dict[str, Any]:
    """One call of the metadata's ``unrecorded_calls``."""
    return {MODULE_PATH: module_path, CALL_INDEX: call_index, "why": why}


def unrecorded_calls_entry(count: int, calls: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The metadata's ``unrecorded_calls``: None when nothing was lost."""
    return {"count": count, "calls": list(calls)[:UNRECORDED_EXAMPLES]} if count else None


def error_entry(type_name: str, message: str) -> dict[str, Any]:
    """The ``error`` of a node whose call raised."""
    return {ERROR_TYPE: type_name, ERROR_MESSAGE: message}


def tensor_entry(
    shape: str,
    dtype: str,
    value: str | list[str] | None = None,
    *,
    string_stats: Mapping[str, str] | None = None,
    stats: Mapping[str, Any] | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """A tensor entry: ``shape`` and ``dtype`` as ``repr()`` strings (``"torch.Size([1, 7])"``, ``"torch.float32"``).

    ``value`` is a payload reference (see ``payload_reference``), the repr
    lines, or None (no ``value`` key: a summary-only capture).
    ``string_stats`` are the standard trace's ``mean``/``std``/``min``/``max``
    repr strings; ``stats`` and ``device`` are tracediff's additions.
    """
    entry: dict[str, Any] = {SHAPE: shape, DTYPE: dtype}
    if value is not None:
        entry[VALUE] = value
    if string_stats:
        entry.update((key, string_stats[key]) for key in STRING_STAT_KEYS if key in string_stats)
    if stats is not None:
        entry[STATS] = stats
    if device is not None:
        entry[DEVICE] = device
    return entry


def dtensor_entry(global_shape: list[int], placements: list[str], recorded: str) -> dict[str, Any]:
    """The ``dtensor`` object of a DTensor's entry; ``recorded`` is ``"local"`` (the shard) or ``"full"``."""
    return {DTENSOR_GLOBAL_SHAPE: global_shape, DTENSOR_PLACEMENTS: placements, DTENSOR_RECORDED: recorded}


def shard_code(dim: int) -> str:
    """The placement code of a tensor sharded along ``dim``: ``"S(0)"``, ``"S(-1)"``."""
    return f"S({dim})"


def parse_placement(code: Any) -> tuple[str, int | None] | None:
    """``("R", None)``, ``("P", None)`` or ``("S", dim)`` for a placement code; None when it is not one."""
    if code in (REPLICATE, PARTIAL):
        return code, None
    match = _SHARD_CODE.fullmatch(code) if isinstance(code, str) else None
    return ("S", int(match.group(1))) if match else None


def layout_entry(placements: list[str], source: str, *, global_shape: list[int] | None = None,
                 style: str | None = None) -> dict[str, Any]:
    """The ``layout`` object of a tensor entry: placement codes (one per mesh dimension) and their ``source``."""
    entry: dict[str, Any] = {LAYOUT_PLACEMENTS: placements, LAYOUT_SOURCE: source}
    if global_shape is not None:
        entry[LAYOUT_GLOBAL_SHAPE] = global_shape
    if style is not None:
        entry[LAYOUT_STYLE] = style
    return entry


def mesh_entry(shape: list[int], dim_names: list[str], coordinates: list[int] | None = None) -> dict[str, Any]:
    """The ``mesh`` object: the device mesh's shape, its dimension names, and (per rank) this rank's coordinates."""
    entry: dict[str, Any] = {MESH_SHAPE: shape, MESH_DIM_NAMES: dim_names}
    if coordinates is not None:
        entry[MESH_COORDINATES] = coordinates
    return entry


def ranks_entry(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest object of a multi-rank folder, keys in ``RANKS_KEYS`` order, ``format_version`` first."""
    return _ordered_entry(fields, RANKS_KEYS, "manifest")


def rank_folder(rank: int) -> str:
    """The folder of rank ``rank``'s trace in a multi-rank folder: ``rank{r}``."""
    return f"{RANK_FOLDER_PREFIX}{rank}"


def is_tensor_entry(obj: Any) -> bool:
    """The rule of the specification: a JSON object whose ``shape`` and ``dtype`` are strings is a tensor entry.

    Typed values (objects with ``py_type``) are never tensor entries. In a
    tracediff trace no container holds a bare string, so the rule cannot
    mistake a container for a tensor there; in the standard trace a dict
    argument with string items named ``shape`` and ``dtype`` is ambiguous.
    """
    return (isinstance(obj, dict) and isinstance(obj.get(SHAPE), str) and isinstance(obj.get(DTYPE), str)
            and PY_TYPE not in obj)


# --- typed non-tensor values ---------------------------------------------------------------------------------


def is_json_safe(value: Any, depth: int = 0) -> bool:
    """True when ``value`` is None/bool/int/float/str or lists/tuples/str-keyed dicts of those (32 levels deep)."""
    if isinstance(value, _PLAIN_SCALARS):
        return True
    if depth > 32:
        return False
    if type(value) in (list, tuple):
        return all(is_json_safe(item, depth + 1) for item in value)
    if type(value) is dict:
        return all(isinstance(k, str) and is_json_safe(v, depth + 1) for k, v in value.items())
    return False


def as_json(value: Any) -> Any:
    """A JSON-safe value with tuples as lists (for values ``is_json_safe`` accepted)."""
    if isinstance(value, (list, tuple)):
        return [as_json(item) for item in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    return value


def typed_value(value: Any) -> dict[str, Any]:
    """``{"py_type": "int", "py_value": 3}`` for a value ``is_json_safe`` accepts (tuples stored as lists)."""
    return {PY_TYPE: type(value).__name__, PY_VALUE: as_json(value)}


def typed_repr(type_name: str, text: str) -> dict[str, Any]:
    """``{"py_type": "DynamicCache", "repr": "..."}`` for any other value."""
    return {PY_TYPE: type_name, REPR: text}


def is_typed_value(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get(PY_TYPE), str)


def typed_value_content(entry: Mapping[str, Any]) -> tuple[bool, Any]:
    """``(True, value)`` for a typed value holding its value (``py_value``, or step records' older ``value``).

    Tuples come back as tuples. ``(False, None)`` when only a ``repr`` is known.
    """
    for key in (PY_VALUE, LEGACY_PY_VALUE):
        if key in entry:
            value = entry[key]
            return True, tuple(value) if entry.get(PY_TYPE) == "tuple" and isinstance(value, list) else value
    return False, None


# --- metadata -----------------------------------------------------------------------------------------------


def metadata_entry(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata object: ``format_version`` first, then ``fields`` in the order of ``METADATA_KEYS``.

    Raises ValueError for a key this module does not define (add it to
    ``METADATA_KEYS``, the specification and the schema first).
    """
    return _ordered_entry(fields, METADATA_KEYS, "metadata")


def _ordered_entry(fields: Mapping[str, Any], keys: Sequence[str], what: str) -> dict[str, Any]:
    """``format_version`` first, then ``fields`` in the order of ``keys``; ValueError for a key not in ``keys``."""
    unknown = sorted(set(fields) - set(keys))
    if unknown:
        raise ValueError(f"{what} keys not in the trace format: {', '.join(unknown)}")
    entry = {FORMAT_VERSION_KEY: FORMAT_VERSION}
    entry.update((key, fields[key]) for key in keys if key in fields and key != FORMAT_VERSION_KEY)
    return entry


def forward_parameters(metadata: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The ``forward_parameters`` of a trace's metadata, keeping only the well-formed entries (see spec section 7).

    An entry is a class name and the parameter names of its ``forward``: a list of strings, ``"*name"`` for
    ``*args``, ``"**name"`` for ``**kwargs``, ``"*"`` before keyword-only parameters. Anything else is ignored.
    """
    table = metadata.get(FORWARD_PARAMETERS)
    if not isinstance(table, dict):
        return {}
    return {name: tuple(names) for name, names in table.items()
            if isinstance(name, str) and isinstance(names, list) and all(isinstance(n, str) for n in names)}


def positional_parameter(parameters: tuple[str, ...], index: int) -> str | None:
    """The name of the ``index``-th positional argument under ``parameters`` (``forward_parameters``), or None."""
    for name in parameters:
        if name.startswith("*"):
            return None
        if index == 0:
            return name
        index -= 1
    return None


def parse_format_version(version: Any) -> tuple[int, int] | None:
    """``"1.1"`` -> ``(1, 1)``, ``1`` -> ``(1, 0)``; None when ``version`` is neither."""
    if isinstance(version, int) and not isinstance(version, bool) and version >= 0:
        return version, 0
    if isinstance(version, str):
        match = re.fullmatch(r"(\d+)\.(\d+)", version)
        if match:
            return int(match.group(1)), int(match.group(2))
    return None


def check_format_version(metadata: Mapping[str, Any], where: object) -> None:
    """Refuse a trace whose metadata carries a malformed ``format_version`` or a newer MAJOR version.

    Metadata without ``format_version`` is accepted (older and foreign
    writers); a newer MINOR version is accepted (readers ignore unknown keys).
    """
    if FORMAT_VERSION_KEY not in metadata:
        return
    found = metadata[FORMAT_VERSION_KEY]
    parsed = parse_format_version(found)
    major = int(FORMAT_VERSION.split(".")[0])
    if parsed is None:
        raise TraceFormatError(f"{where}: format_version {json.dumps(found)} is not \"MAJOR.MINOR\"")
    if parsed[0] > major:
        raise TraceFormatError(
            f"{where}: format_version {json.dumps(found)} is newer than this tracediff reads ({major}.x); "
            "upgrade tracediff")


def schema() -> dict[str, Any]:
    """The JSON Schema of tracediff's trace files (``$defs``: ``trace``, ``metadata``, ``standard_trace``)."""
    text = resources.files("tracediff").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


_ADDRESS = re.compile(r"object at 0x[0-9A-Fa-f]+")


def sanitize_repr(text: str) -> str:
    """``text`` with every ``object at 0x...`` address masked as ``object at 0xXXXXXXXX``, so two traces diff.

    The masking is part of the format (section 3: reprs are written with memory addresses masked); align
    applies it again where it compares a repr with a typed value.
    """
    return _ADDRESS.sub("object at 0xXXXXXXXX", text)


def payload_key_problem(path: object, keys: list[str]) -> str | None:
    """Why the tensor names of a payload file break the format (one tensor, named ``data``); None when they do not."""
    if keys == [PAYLOAD_KEY]:
        return None
    found = ", ".join(repr(k) for k in keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return f"{path}: a payload holds one tensor under the key {PAYLOAD_KEY!r}: expected {PAYLOAD_KEY!r}, " \
           f"found {found or 'no tensor'}"

