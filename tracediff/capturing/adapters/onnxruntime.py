"""The ONNX Runtime adapter: every node of an ONNX graph, as ONNX Runtime computed it, with its module scopes.

ONNX Runtime runs no Python: it optimizes the graph (fusing nodes, folding constants) and computes it. To see
the values inside, the adapter does what Polygraphy does: it adds every node's output to the graph's outputs
("mark all") and runs one ``InferenceSession`` on the CPU (``CPUExecutionProvider``) at ONNX Runtime's
default optimization level (``ORT_ENABLE_ALL``) unless ``graph_optimization`` says otherwise. ONNX Runtime's
optimizers keep every marked value: a fusion that would drop one is not made, so the values recorded are
those of the graph as exported, computed by ONNX Runtime's kernels. The graph is also run once as exported,
nothing marked, and how far each of its outputs lies from the marked run's is written in the metadata
(``runtime.unmarked_max_abs_difference``): 0 where no fusion was kept from happening, a rounding's worth
(1e-7 in float32) where one was.

Each recorded node (:mod:`.onnx_nodes`) carries the chain of modules it was exported from (torch's dynamo
exporter's name scopes, else the legacy exporter's node-name path), its op (``op_type``), its dataflow (the
value names it read: an initializer, a ``Constant`` or a graph input is an input from outside the trace) and
its short attributes (an epsilon, an axis). A node of several outputs is recorded once per output
(``{name}_output_{i}``). The whole run is one step.

Models are read from untrusted files with their external data confined to the model's folder
(:mod:`.onnx_file`). The graph's inputs are fed by name from the inputs file (``kwargs.NAME``, ``NAME``, or
``args.i`` by position among the graph's inputs), each cast to the element type the graph declares (token
ids saved as int64 feed an int32 input). onnx and onnxruntime are imported only when an ONNX model exists in
the process or an ``.onnx`` file is captured.

    tracediff capture model.onnx --inputs inputs.safetensors --out onnx/ [--graph-optimization basic]
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from ...trace.vocabulary import GraphVocabulary
from .base import AdapterBase, Installed, Recorder, RuntimeOption
from .onnx_file import check_graph, import_onnx, read_model_file, refuse_external
from .onnx_inputs import graph_feeds, graph_inputs, type_name
from .onnx_nodes import PlannedOutput, marked_bytes, plan_outputs

if TYPE_CHECKING:
    import numpy as np


FRAMEWORK = "onnxruntime"
INSTALL = 'pip install -c constraints.txt -e ".[onnx]"'
PROVIDER = "CPUExecutionProvider"
#: ``--graph-optimization`` choices and the ``GraphOptimizationLevel`` each names.
GRAPH_OPTIMIZATIONS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
                       "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}

_ORT_ERROR = re.compile(r"^\[ONNXRuntimeError\] : \d+ : (?P<kind>\w+) : (?P<rest>.*)$")
_SOURCE_LOCATION = re.compile(r"^\S+\.(?:cc|h|cpp):\d+ ")

#: ONNX ops that move no value (followed through when looking for what reads a tensor) and those among them
#: that keep the values' order.
_SAME_VALUES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
VOCABULARY = GraphVocabulary(scopes="modules", views=_SAME_VALUES | {"Transpose", "Expand"},
                             same_values=_SAME_VALUES)


def import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError as e:
        raise UsageError(f"onnxruntime is not installed ({e}): {INSTALL}") from None
    return onnxruntime


class ONNXModel:
    """An ONNX model loaded for a capture: its graph, the outputs to record and ONNX Runtime's session.

    Made by :meth:`OnnxRuntimeAdapter.load`; the session returns every recorded value besides the graph's own
    outputs."""

    def __init__(self, proto: Any, label: str, optimization: str | None) -> None:
        ort = import_onnxruntime()
        self.proto, self.label = proto, label
        self.planned, self.scope_sources = plan_outputs(proto.graph)
        self.inputs = graph_inputs(proto)
        self.options = ort.SessionOptions()
        self.options.log_severity_level = 3  # errors only: its warnings (an unused initializer) are not ours to print
        if optimization is not None:
            self.options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                                            GRAPH_OPTIMIZATIONS[optimization])
        try:
            self._serialized: bytes | None = proto.SerializeToString()  # kept for the unmarked run, then dropped
        except (ValueError, OverflowError, MemoryError) as e:  # over protobuf's 2 GiB
            raise UsageError(f"{label}: the model cannot be handed to ONNX Runtime as one protobuf "
                             f"({_first_line(e)}); models over 2 GiB are not supported") from None
        try:
            self.session = ort.InferenceSession(marked_bytes(proto, [p.key for p in self.planned], self._serialized),
                                                self.options, providers=[PROVIDER])
        except Exception as e:  # noqa: BLE001 - ONNX Runtime's Fail, InvalidGraph, NotImplemented...
            raise UsageError(f"{label}: ONNX Runtime could not load it: {_first_line(e)}") from None
        self.recorder: Recorder | None = None
        self.casts: dict[str, str] = {}
        self.unmarked: dict[str, float] = {}  # graph output -> max |marked run - run as exported|

    def compare_unmarked(self, feeds: Mapping[str, np.ndarray], values: dict[str, np.ndarray]) -> None:
        """Run the graph as exported (no value marked, so every fusion ONNX Runtime makes at this level) and
        keep how far each float graph output of the marked run lies from it: the evidence that the recorded
        values are those of ONNX Runtime's own run (marking keeps a fusion from dropping a marked value)."""
        import numpy as np

        ort = import_onnxruntime()
        serialized, self._serialized = self._serialized or self.proto.SerializeToString(), None
        try:
            plain = ort.InferenceSession(serialized, self.options, providers=[PROVIDER])
            names = [output.name for output in self.proto.graph.output]
            results = plain.run(names, dict(feeds))
        except Exception:  # noqa: BLE001 - the evidence is left out, the capture is not refused
            return
        for name, result in zip(names, results):
            marked = values.get(name)
            if isinstance(result, np.ndarray) and isinstance(marked, np.ndarray) and result.dtype.kind == "f" \
                    and marked.shape == result.shape and result.size:
                self.unmarked[name] = float(np.max(np.abs(marked.astype(np.float64) - result.astype(np.float64))))

    def feeds(self, inputs: Mapping[str, Any], source: str) -> dict[str, np.ndarray]:
        """The graph's inputs from ``inputs``, cast as the graph declares them (:func:`.onnx_inputs.graph_feeds`)."""
        return graph_feeds(self.inputs, inputs, source, self.casts)


class _Recording:
    """The recorder held by an ``ONNXModel`` until ``restore()``."""

    def __init__(self, model: ONNXModel, recorder: Recorder) -> None:
        self._model = model
        model.recorder = recorder

    def restore(self) -> None:
        self._model.recorder = None


class OnnxRuntimeAdapter(AdapterBase):
    """ONNX models run by ONNX Runtime on the CPU: every node's output, with its module scopes and dataflow."""

    framework = FRAMEWORK
    models = "ONNX Runtime"
    supported_options: frozenset[str] = frozenset()
    graph = VOCABULARY
    file_kind = "an ONNX model (ONNX Runtime)"
    options = (RuntimeOption("graph_optimization", choices=tuple(GRAPH_OPTIMIZATIONS),
                             help="ONNX Runtime's graph optimization level (default: ONNX Runtime's own, all)"),)

    def recognises(self, model: Any) -> bool:
        if isinstance(model, ONNXModel):
            return True
        proto = getattr(sys.modules.get("onnx"), "ModelProto", None)
        program = getattr(sys.modules.get("torch.onnx"), "ONNXProgram", None)
        return any(isinstance(kind, type) and isinstance(model, kind) for kind in (proto, program))

    def version(self) -> str | None:
        return getattr(sys.modules.get("onnxruntime"), "__version__", None)

    def opens(self, path: Path) -> bool:
        return path.suffix.lower() == ".onnx"

    def load(self, source: Any, options: Mapping[str, Any]) -> ONNXModel:
        """An ``ONNXModel`` of ``source``: an ``.onnx`` file (a Path), an ``onnx.ModelProto``, a
        ``torch.onnx.ONNXProgram`` or an ``ONNXModel`` (loaded again when ``options`` are given).

        ``options``: ``graph_optimization`` (``disable``, ``basic``, ``extended``, ``all``; default ONNX
        Runtime's, ``all``). Raises UsageError for a file that is no ONNX model, external data outside the
        model's folder or linked, or a model ONNX Runtime cannot load (the options are checked once, against the
        declared ones, by ``check_runtime_options``).
        """
        level = options.get("graph_optimization")  # checked against the declared choices (check_runtime_options)
        if isinstance(source, ONNXModel):
            return source if level is None else ONNXModel(source.proto, source.label, level)
        import_onnxruntime()
        if isinstance(source, (str, Path)):
            path = Path(source)
            return ONNXModel(read_model_file(path), str(path), level)
        proto = getattr(source, "model_proto", source)  # a torch.onnx.ONNXProgram holds its ModelProto
        check_graph(proto, "model")
        refuse_external(proto, "model")
        return ONNXModel(proto, "model", level)

    def check_run(self, model: Any, inputs: Mapping[str, Any], source: str = "inputs") -> None:
        """UsageError when ``inputs`` lack a graph input of ``model`` or hold one it cannot take (a float for
        an integer input, a shape that does not fit, an id beyond the declared integer type)."""
        self._loaded(model).feeds(inputs, source)

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> Installed:
        return _Recording(self._loaded(model), recorder)

    def run_inputs(self, model: Any, inputs: Mapping[str, Any]) -> None:
        """Run the graph once on ``inputs`` and record every planned node output, in the graph's order, as one
        step (an output that is no tensor, such as a sequence, is not recorded). The graph is also run as
        exported, unmarked, and its outputs compared with the marked run's (metadata
        ``unmarked_max_abs_difference``)."""
        import numpy as np

        loaded = self._loaded(model)
        feeds = loaded.feeds(inputs, "inputs")
        keys = [planned.key for planned in loaded.planned]
        try:
            values = loaded.session.run(keys, feeds)
        except Exception as e:  # noqa: BLE001 - ONNX Runtime's own errors, one line
            raise UsageError(f"{loaded.label}: ONNX Runtime failed to run it: {_first_line(e)}") from None
        recorder = loaded.recorder
        if recorder is None:
            return
        loaded.compare_unmarked(feeds, dict(zip(keys, values)))
        recorder.begin_step()
        for planned, value in zip(loaded.planned, values):
            if isinstance(value, np.ndarray) and value.dtype != object:
                _record(recorder, planned, value)
        recorder.end_step()

    def host(self, value: Any) -> Any:
        return value

    def metadata(self, model: Any) -> dict[str, Any]:
        return {"model_class": exported_class(model.proto) if isinstance(model, ONNXModel) else type(model).__name__,
                "runtime": runtime_facts(model) if isinstance(model, ONNXModel) else {}}

    def _loaded(self, model: Any) -> ONNXModel:
        if isinstance(model, ONNXModel):
            return model
        raise UsageError(f"model: a {type(model).__name__} is captured with tracediff.capture_file(model, out, "
                         "inputs=...), which loads it into ONNX Runtime")


def _record(recorder: Recorder, planned: PlannedOutput, value: np.ndarray) -> None:
    recorder.record_node(key=planned.key, name=planned.name, op=planned.op,
                         scope=list(planned.scope) if planned.scope else None,
                         output=value, sources=list(planned.sources), attributes=dict(planned.attributes))


def runtime_facts(model: ONNXModel) -> dict[str, Any]:
    """The trace metadata's ``runtime``: ONNX Runtime, the level it optimized at, and what the model says of
    its exporter, opsets and weights."""
    ort = import_onnxruntime()
    proto = model.proto
    level = model.session.get_session_options().graph_optimization_level
    levels = {getattr(ort.GraphOptimizationLevel, value): key for key, value in GRAPH_OPTIMIZATIONS.items()}
    weights: dict[str, int] = {}
    onnx = import_onnx()
    for tensor in proto.graph.initializer:
        kind = type_name(tensor.data_type)
        weights[kind] = weights.get(kind, 0) + 1
    exporter = " ".join(part for part in (proto.producer_name, proto.producer_version) if part) or None
    return {
        "onnxruntime_version": ort.__version__,
        "onnx_version": onnx.__version__,
        "provider": model.session.get_providers()[0],
        "graph_optimization": levels.get(level, str(level)),
        "intra_op_threads": int(model.options.intra_op_num_threads),  # 0: ONNX Runtime's default
        "exporter": exporter,
        "opset": {entry.domain or "ai.onnx": int(entry.version) for entry in proto.opset_import},
        "ir_version": int(proto.ir_version),
        "model": Path(model.label).name,
        "scopes_from": dict(sorted(model.scope_sources.items())),
        "recorded_outputs": len(model.planned),
        "inputs": {i.name: type_name(i.elem_type) for i in model.inputs},
        "inputs_cast": dict(model.casts),
        "unmarked_max_abs_difference": dict(model.unmarked),
        "initializer_types": dict(sorted(weights.items())),
    }


def exported_class(proto: Any) -> str:
    """The class the graph was exported from (the dynamo exporter's class hierarchy), else ``ONNXModel``."""
    from .onnx_nodes import parse_name_scopes

    for node in proto.graph.node:
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.class_hierarchy":
                classes = parse_name_scopes(prop.value)
                if classes:
                    return classes[0].rsplit(".", 1)[-1]
    return "ONNXModel"


def _first_line(e: BaseException) -> str:
    """ONNX Runtime's message without its source location and C++ signature: ``[ONNXRuntimeError] : 1 : FAIL :
    /src/model.cc:256 onnxruntime::Model::Model(...) Unsupported model IR version: 14`` -> ``FAIL: Unsupported
    model IR version: 14``."""
    lines = str(e).strip().splitlines()
    text = lines[0] if lines else type(e).__name__
    match = _ORT_ERROR.match(text)
    if match is not None:
        kind, text = match["kind"], match["rest"]
        located = _SOURCE_LOCATION.match(text)
        if located is not None:  # skip the function's signature: up to the parenthesis that closes it
            depth, rest = 0, text[located.end():]
            for index, char in enumerate(rest):
                depth += {"(": 1, ")": -1}.get(char, 0)
                if char == ")" and depth == 0:
                    text = rest[index + 1:].strip() or text
                    break
        text = f"{kind}: {text}"
    return text[:300]


__all__ = ["FRAMEWORK", "GRAPH_OPTIMIZATIONS", "ONNXModel", "OnnxRuntimeAdapter", "VOCABULARY", "exported_class",
           "runtime_facts"]
