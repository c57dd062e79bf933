"""The ``polygraphy`` importer: the per-layer outputs NVIDIA's Polygraphy saves from an inference engine.

``polygraphy run model.onnx --onnxrt --onnx-outputs mark all --save-outputs
outputs.json`` (or ``--trt``, with ``--trt-outputs mark all``) runs the model in
ONNX Runtime or TensorRT and writes every intermediate output into one JSON
file, a ``RunResults``: for each runner, a list of iterations, each mapping
output names to arrays (``.npy`` bytes in base64, read here with
``allow_pickle=False``).

How outputs become a trace: an ONNX model exported from PyTorch names each
node's output by the module scope it ran in, ``/layers.0/fc/MatMul_output_0``:
the scope (``layers.0.fc``) is a module call, and the output an op node of it
(``onnx.MatMul``). Scopes nest (``layers.0`` holds ``layers.0.fc``); an output
without a scope (a graph output, ``26``) belongs to the root. The order of the
outputs is the graph's (topological) order, as Polygraphy lists them;
iteration ``k`` is call ``k``. ONNX does not record a module's own outputs, so
modules are compared through the ops inside them.

``SRC`` is the JSON file, or a folder holding exactly one such file. A file
with results of several runners is refused: save one runner per file.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from pathlib import Path
from typing import Any

from .. import format as fmt
from ..errors import DumpFormatError
from ..files.confine import TRACE_JSON_LIMIT, read_json_file
from ..files.trace_writing import scope_call
from ._decoded import from_numpy
from ._files import read_head
from ._writer import TraceWriter
from .tensors import Imported

RUN_RESULTS = "RunResults"
ORDER = "the order of Polygraphy's outputs (the graph's topological order)"
_OUTPUT = re.compile(r"^(?P<op>.+?)_output_(?P<i>\d+)$")


def is_run_results(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("polygraphy_class") == RUN_RESULTS and isinstance(obj.get("lst"), list)


def results_file(src: Path) -> Path:
    """The RunResults JSON of ``src`` (the file itself, or the one ``*.json`` in the folder that is one)."""
    if not src.is_dir():
        return src
    found = [p for p in sorted(src.glob("*.json")) if looks_like_run_results(p, src)]
    if len(found) != 1:
        names = ", ".join(p.name for p in found[:4]) or "none"
        raise DumpFormatError(f"{src}: expected one Polygraphy RunResults JSON (polygraphy run --save-outputs), "
                              f"found {len(found)} ({names}); pass the file")
    return found[0]


def looks_like_run_results(path: Path, root: Path) -> bool:
    """True when ``path`` starts like a RunResults file (``{"lst": [[runner name, ...``): a cheap test."""
    if path.suffix.lower() != ".json" or not path.is_file():
        return False
    try:
        head = read_head(path, root, 64)
    except DumpFormatError:
        return False
    return re.match(rb'\s*\{\s*"lst"\s*:\s*\[\s*\[', head) is not None


def import_polygraphy(src: Path, writer: TraceWriter, *, model_name: str) -> Imported:
    path = results_file(src)
    root = src if src.is_dir() else src.parent
    results = read_json_file(path, limit=TRACE_JSON_LIMIT, root=root, error=DumpFormatError,
                             what="Polygraphy RunResults JSON")
    if not is_run_results(results):
        raise DumpFormatError(f"{path}: not a Polygraphy RunResults JSON (no polygraphy_class RunResults with 'lst')")
    runners = [item for item in results["lst"] if isinstance(item, list) and len(item) == 2]
    if len(runners) != 1 or not isinstance(runners[0][1], list):
        names = ", ".join(str(item[0]) for item in runners[:4])
        raise DumpFormatError(f"{path}: holds the results of {len(runners)} runners ({names}); save one runner's "
                              "outputs per file")
    runner, iterations = runners[0]
    writer.framework = _framework(str(runner))
    calls: list[dict[str, Any]] = []
    tensors = 0
    for k, iteration in enumerate(iterations):
        outputs = iteration.get("outputs") if isinstance(iteration, dict) else None
        if not isinstance(outputs, dict):
            raise DumpFormatError(f"{path}: iteration {k} of {runner} has no 'outputs' object")
        call, count = _iteration(outputs, k, writer, model_name, path)
        calls.append(call)
        tensors += count
    if not calls:
        raise DumpFormatError(f"{path}: {runner} recorded no iteration")
    tree = calls[0]
    if len(calls) > 1:
        tree[fmt.SUBSEQUENT_CALLS] = calls[1:]
    modules = sum(1 for call in calls for _ in _walk(call))
    return Imported(tree, modules, tensors, ORDER, (f"the outputs of {runner}",))


def _iteration(outputs: dict[str, Any], k: int, writer: TraceWriter, model_name: str,
               path: Path) -> tuple[dict[str, Any], int]:
    root = fmt.node_entry(model_name, module_type=model_name, call_index=k, inputs={}, children=[])
    scopes: dict[str, dict[str, Any]] = {"": root}
    ops: dict[str, int] = {}
    graph_outputs: list[dict[str, Any]] = []
    for name, value in outputs.items():
        scope, _, last = name.rpartition("/")
        match = _OUTPUT.match(last)
        module = ".".join(part for part in scope.split("/") if part)
        array = _array(value, name, path)
        if not module or match is None:  # a graph output
            prefix = fmt.payload_name(fmt.call_prefix(model_name, k), fmt.OUTPUTS)
            graph_outputs.append(writer.entry(array, fmt.payload_name(prefix, len(graph_outputs))))
            continue
        node = scope_call(scopes, module, model_name, k)
        op_index = ops.get(module, 0)
        ops[module] = op_index + 1
        op = _op_type(match["op"])
        stem = fmt.payload_name(fmt.call_prefix(node[fmt.MODULE_PATH], k), f"op{op_index}_{op}")
        node[fmt.CHILDREN].append(fmt.op_node_entry(node[fmt.MODULE_PATH], k, f"onnx.{op}", op_index, {},
                                                    writer.entry(array, fmt.payload_name(stem, fmt.OUTPUTS))))
    for node in scopes.values():
        if not node[fmt.CHILDREN]:
            del node[fmt.CHILDREN]
    if graph_outputs:
        root[fmt.OUTPUTS] = graph_outputs[0] if len(graph_outputs) == 1 else graph_outputs
    return root, len(outputs)


def _framework(runner: str) -> str | None:
    """The engine a Polygraphy runner ran (``onnxrt-runner-N0-...``: ONNX Runtime), None when its name does not
    say."""
    for prefix, framework in (("onnxrt", "onnxruntime"), ("trt", "tensorrt")):
        if runner.startswith(prefix):
            return framework
    return None


def _op_type(op: str) -> str:
    """``MatMul`` from ``MatMul`` and ``Mul_1`` (the exporter numbers repeated node names)."""
    return re.sub(r"_\d+$", "", op)


def _array(value: Any, name: str, path: Path) -> Any:
    import numpy as np

    array = value.get("values") if isinstance(value, dict) and value.get("polygraphy_class") == "LazyArray" else value
    encoded = array.get("array") if isinstance(array, dict) and array.get("polygraphy_class") == "ndarray" else None
    if not isinstance(encoded, str):
        raise DumpFormatError(f"{path}: output {name!r} is not an encoded array (polygraphy_class ndarray)")
    try:
        loaded = np.lib.format.read_array(io.BytesIO(base64.b64decode(encoded, validate=True)), allow_pickle=False)
    except (binascii.Error, ValueError, OSError, EOFError) as e:
        raise DumpFormatError(f"{path}: output {name!r} cannot be decoded ({str(e).splitlines()[0][:200]})") from None
    return from_numpy(path, (name,), loaded)


def _walk(node: dict[str, Any]) -> Any:
    yield node
    for child in node.get(fmt.CHILDREN, []):
        if not fmt.is_op_node(child):
            yield from _walk(child)
