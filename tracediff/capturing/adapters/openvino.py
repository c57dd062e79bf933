"""The OpenVINO adapter: every value an ``openvino.Model`` computes on the CPU, with its module scopes.

``tracediff capture model.xml --inputs inputs.safetensors --out DIR`` reads an OpenVINO IR (the ``.xml``
and the ``.bin`` beside it, same stem), makes the output of every op that computes a value of the network
a model output (``Model.add_outputs``), compiles it for the CPU at the plugin's defaults and runs it once
on the inputs file's tensors; ``tracediff.capture_file(model, DIR, inputs=...)`` does the same for an
``openvino.Model`` (``ov.convert_model(torch_model, example_input=...)``), which is copied first and
never changed. Each op's output is recorded as a graph node (:mod:`tracediff.capturing.graph`):

* its module scope chain from the op's friendly name (``__module.model.layers.0.self_attn.q_proj/...`` ->
  ``["model", "model.layers.0", "model.layers.0.self_attn", "model.layers.0.self_attn.q_proj"]``), or from
  the dataflow around it for an op OpenVINO's transformations made (:mod:`.openvino_graph`);
* its op (``MatMul``, ``Multiply``, ``ScaledDotProductAttention``), its sources by producing output
  (``friendly name:port``; weights and graph inputs are external, by name), the attributes that change
  numerics (a norm's ``epsilon``, an MVN's ``eps``) and the precision the CPU plugin ran it in
  (``runtime_precision``, from the compiled model's execution graph).

**Precision.** The CPU plugin's default ``INFERENCE_PRECISION_HINT`` is bf16 on a CPU with AVX-512 bf16
or AMX, f32 elsewhere: at the default the matrix products run in bf16 although every output is float32.
``--precision f32|bf16|f16`` (``options={"precision": "f32"}``) sets the hint; the precision that ran, read
back from the compiled model, is the trace metadata's ``runtime.inference_precision``, beside the hint
asked, the device, OpenVINO's version and the element types of the weights (``ov.save_model`` stores them
in f16 unless ``compress_to_fp16=False``); below f32 it is also the metadata's ``compute_dtype``
(``"torch.bfloat16"``), which alignment reads: B's float32 tensors are judged as bf16 ones.

Making intermediate values outputs keeps the CPU plugin from fusing across them; the capture's results
therefore can differ from a plain run's by a rounding at bf16 (identical at f32; docs/frameworks.md). openvino is never
imported unless an ``openvino.Model`` exists or an ``.xml`` is captured.
"""

from __future__ import annotations

import mmap
import os
import re
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from ...files.confine import MiB, open_regular, read_bounded
from ...trace.vocabulary import GraphVocabulary
from .base import AdapterBase, Installed, Recorder, RuntimeOption

if TYPE_CHECKING:
    import numpy as np


FRAMEWORK = "openvino"
INSTALL = 'pip install -c constraints.txt -e ".[openvino]"'
DEVICE = "CPU"
PRECISIONS = ("f32", "bf16", "f16")
#: The inference precisions below float32, as torch names the dtype: what the plugin's matrix products and
#: attention round to although every output is float32 (the trace metadata's ``compute_dtype``).
COMPUTE_DTYPES = {"bf16": "torch.bfloat16", "f16": "torch.float16"}
#: An IR's XML holds the graph only (weights are in the .bin): 256 MiB is far beyond the largest LLM's.
XML_LIMIT = 256 * MiB
_ENTITY = re.compile(rb"<!(DOCTYPE|ENTITY)", re.IGNORECASE)
_NET = re.compile(rb"^\s*(<\?xml[^>]*\?>)?\s*(<!--.*?-->\s*)*<net[\s>]", re.DOTALL)

VOCABULARY = GraphVocabulary(
    scopes="modules",
    views=frozenset({"Reshape", "Squeeze", "Unsqueeze", "Transpose", "Broadcast", "Slice", "StridedSlice",
                     "Gather", "Split", "VariadicSplit", "Concat"}),
    same_values=frozenset({"Reshape", "Squeeze", "Unsqueeze"}),
)


def openvino_module() -> Any:
    """The imported ``openvino`` package, or None (never imports it)."""
    return sys.modules.get("openvino")


def is_openvino_model(model: Any) -> bool:
    """True when ``model`` is an ``openvino.Model`` (without importing openvino)."""
    model_type = getattr(openvino_module(), "Model", None)
    return isinstance(model_type, type) and isinstance(model, model_type)


def _import_openvino() -> Any:
    try:
        import openvino
    except ImportError as e:
        raise UsageError(f"openvino is not installed ({e}): {INSTALL}") from None
    return openvino


class OpenVINOModel:
    """An ``openvino.Model`` prepared for capture: every recorded value an output, compiled for the CPU."""

    def __init__(self, model: Any, *, source: str, precision: str | None, weights: Any = None) -> None:
        from .openvino_graph import graph_nodes, output_key

        ov = _import_openvino()
        self.source = source
        self.precision_asked = precision
        self._weights = weights  # the .bin's mapping: the model's constants may point into it
        self.model = model.clone()  # the caller's model is never changed
        self.inputs = [(parameter.get_names() or {parameter.get_friendly_name()}, parameter)
                       for parameter in self.model.inputs]
        self.nodes = graph_nodes(self.model.get_ordered_ops())
        self.model.add_outputs([node.output for node in self.nodes])
        self.output_index: dict[str, int] = {}  # a value already a model output (the logits) is not added again
        for index, result in enumerate(self.model.get_results()):
            self.output_index.setdefault(output_key(result.input_value(0)), index)
        config = {} if precision is None else {"INFERENCE_PRECISION_HINT": precision}
        core = ov.Core()
        try:
            self.compiled = core.compile_model(self.model, DEVICE, config)
        except RuntimeError as e:
            raise UsageError(f"{source}: OpenVINO could not compile it for the {DEVICE}: {_reason(e)}") from None
        self.inference_precision = _type_name(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        self.default_precision = _type_name(core.get_property(DEVICE, "INFERENCE_PRECISION_HINT"))
        self.node_precisions = _runtime_precisions(self.compiled)
        self.weight_types = _weight_types(model)
        self.request: Any = None
        self.recorder: Recorder | None = None  # while a capture is installed

    def feed(self, inputs: Mapping[str, Any], source: str = "inputs") -> dict[str, np.ndarray]:
        """The inputs file's tensors by graph input name (``kwargs.NAME``, ``NAME`` or ``args.i``), as numpy."""
        feed: dict[str, np.ndarray] = {}
        for position, (names, parameter) in enumerate(self.inputs):
            keys = [f"kwargs.{name}" for name in sorted(names)] + sorted(names) + [f"args.{position}"]
            key = next((k for k in keys if k in inputs), None)
            name = parameter.get_any_name() if parameter.get_names() else sorted(names)[0]
            if key is None:
                raise UsageError(f"{source}: graph input {name!r} is not in the file (it holds "
                                 f"{', '.join(sorted(inputs)) or 'nothing'})")
            feed[name] = _as_input(inputs[key], parameter, source, key)
        return feed


def _as_input(value: Any, parameter: Any, source: str, key: str) -> np.ndarray:
    import numpy as np
    import torch

    tensor = value.detach().cpu() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    array = tensor.numpy()
    element = parameter.get_element_type()
    if element.is_dynamic():
        return array
    wanted = np.dtype(element.to_dtype())
    if array.dtype != wanted:
        if array.dtype.kind != wanted.kind and not (array.dtype.kind in "iu" and wanted.kind in "iu"):
            raise UsageError(f"{source}: {key} is {array.dtype}, the graph input {parameter.get_any_name()!r} "
                             f"takes {wanted}")
        array = array.astype(wanted)
    return array


def _type_name(value: Any) -> str:
    """``<Type: 'bfloat16'>`` as OpenVINO's short name, ``bf16``."""
    name = getattr(value, "get_type_name", None)
    return str(name()) if callable(name) else str(value)


def _runtime_precisions(compiled: Any) -> dict[str, tuple[str, str]]:
    """Friendly name -> (the plugin's layer type, the precision it reports running it in), from the compiled
    model's execution graph (a fused ``Subgraph`` reports its first input's precision)."""
    precisions: dict[str, tuple[str, str]] = {}
    try:
        for op in compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            if "runtimePrecision" not in info or "originalLayersNames" not in info:
                continue
            ran = (info["layerType"].astype(str) if "layerType" in info else "?", info["runtimePrecision"].astype(str))
            for name in info["originalLayersNames"].astype(str).split(","):
                if name:
                    precisions.setdefault(name, ran)
    except (RuntimeError, AttributeError, KeyError):  # a plugin without an execution graph: said nowhere
        return {}
    return precisions


def _weight_types(model: Any) -> dict[str, int]:
    """How many weight constants of each element type (floating ones of more than one element, integer ones
    of two dimensions or more: a quantized weight)."""
    import numpy as np

    counts: Counter[str] = Counter()
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Constant":
            continue
        element, shape = op.get_output_element_type(0), op.get_output_partial_shape(0)
        if not shape.is_static:
            continue
        dims = [int(d.get_length()) for d in shape]
        if (element.is_real() and int(np.prod(dims)) > 1) or (element.is_integral() and len(dims) >= 2):
            counts[_type_name(element)] += 1
    return dict(sorted(counts.items()))


def _reason(error: BaseException) -> str:
    """The last informative line of an OpenVINO error (its first lines are source locations)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Exception from", "Check '"))]
    return (useful or lines or [type(error).__name__])[-1][:300]


def check_ir(path: Path) -> tuple[bytes, Any]:
    """The XML text and the mapped ``.bin`` of the IR ``path``, checked before OpenVINO sees either.

    Refused (UsageError, one line): a path that is not a regular ``.xml`` file, or is a symbolic link; a
    ``.bin`` that is a link, not a regular file, or lies outside the XML's folder; XML that is not an IR
    (no ``<net>`` element first) or declares a DTD or entities. OpenVINO parses the XML from memory and
    reads the weights from the mapping, so it opens no file itself.
    """
    for candidate in (path, path.with_suffix(".bin")):
        if candidate.is_symlink():
            raise UsageError(f"{candidate}: a symbolic link; refused (give the IR's own files)")
    folder = path.parent
    xml = read_bounded(path, limit=XML_LIMIT, root=folder, error=UsageError, what="OpenVINO IR")
    if not _NET.match(xml[:4096]):
        raise UsageError(f"{path}: not an OpenVINO IR (no <net> element at its start)")
    try:  # the names OpenVINO hands back are decoded as UTF-8: a damaged file fails there, not here
        xml.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not an OpenVINO IR (not UTF-8 text at byte {e.start})") from None
    if _ENTITY.search(xml):
        raise UsageError(f"{path}: declares a DTD or entities; refused")
    bin_path = path.with_suffix(".bin")
    if not bin_path.exists():
        return xml, None
    fd, size = open_regular(bin_path, root=folder, error=UsageError, what="IR weights")
    try:  # copy-on-write: OpenVINO wants a writable buffer; the file is never written
        return xml, mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else None
    except (OSError, ValueError) as e:
        raise UsageError(f"{bin_path}: cannot map the IR weights ({e})") from None
    finally:
        os.close(fd)


def _read_ir(path: Path) -> tuple[Any, Any]:
    """The ``openvino.Model`` of the IR ``path`` and the buffer its weights live in (kept alive with it)."""
    import numpy as np

    xml, weights = check_ir(path)
    ov = _import_openvino()
    buffer = np.frombuffer(weights, dtype=np.uint8) if weights is not None else np.zeros(0, dtype=np.uint8)
    try:
        model = ov.Core().read_model(xml, ov.Tensor(buffer, shared_memory=True))
    except RuntimeError as e:
        raise UsageError(f"{path}: OpenVINO could not read it: {_reason(e)}") from None
    if not model.outputs:
        raise UsageError(f"{path}: the IR has no outputs")
    return model, buffer


class OpenVINOAdapter(AdapterBase):
    """OpenVINO models (an ``openvino.Model``, an IR ``.xml``): every value the CPU plugin computes."""

    framework = FRAMEWORK
    models = "OpenVINO"
    supported_options: frozenset[str] = frozenset()
    graph = VOCABULARY
    file_kind = "an OpenVINO IR .xml, its .bin beside it (OpenVINO)"
    options = (RuntimeOption("precision", help="the CPU plugin's INFERENCE_PRECISION_HINT (default: the plugin's "
                             "own, bf16 on a CPU with AVX-512 bf16 or AMX, else f32)", choices=PRECISIONS),)

    def recognises(self, model: Any) -> bool:
        return isinstance(model, OpenVINOModel) or is_openvino_model(model)

    def version(self) -> str | None:
        return getattr(openvino_module(), "__version__", None)

    def opens(self, path: Path) -> bool:
        return path.suffix.lower() == ".xml"

    def load(self, source: Any, options: Mapping[str, Any]) -> OpenVINOModel:
        """``source`` (an IR path, an ``openvino.Model``) prepared for capture, compiled for the CPU.

        ``options``: ``precision`` (f32, bf16, f16: the INFERENCE_PRECISION_HINT; default the plugin's).
        Raises UsageError for a file :func:`check_ir` refuses, one OpenVINO cannot read or compile, or an
        unknown precision.
        """
        precision = options.get("precision")
        if precision is not None and precision not in PRECISIONS:
            raise UsageError(f"precision={precision!r}: expected one of {', '.join(PRECISIONS)}")
        if isinstance(source, OpenVINOModel):
            if precision is not None and precision != source.precision_asked:
                return OpenVINOModel(source.model, source=source.source, precision=precision)
            return source
        if is_openvino_model(source):
            return OpenVINOModel(source, source=f"openvino.Model {source.get_friendly_name()!r}", precision=precision)
        path = Path(source)
        model, weights = _read_ir(path)
        return OpenVINOModel(model, source=path.name, precision=precision, weights=weights)

    def check_run(self, model: Any, inputs: Mapping[str, Any], source: str = "inputs") -> None:
        """UsageError naming the first graph input the inputs file lacks (or holds in a dtype it cannot take)."""
        self._prepared(model).feed(inputs, source)

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> Installed:
        prepared = self._prepared(model)
        prepared.recorder = recorder
        return _Detach(prepared)

    def run_inputs(self, model: Any, inputs: Mapping[str, Any]) -> None:
        """Run the compiled model once on ``inputs`` and record every node, in topological order, as one step."""
        prepared = self._prepared(model)
        recorder = prepared.recorder
        request = prepared.compiled.create_infer_request()
        request.infer(prepared.feed(inputs))
        prepared.request = request  # the recorded arrays are views of its tensors: kept alive with the model
        if recorder is None:
            return
        recorder.begin_step()
        for node in prepared.nodes:
            attributes = dict(node.attributes)
            ran = prepared.node_precisions.get(attributes.get("openvino_name", ""))
            if ran:
                attributes["runtime_layer"], attributes["runtime_precision"] = ran
            output = _host(request.get_output_tensor(prepared.output_index[node.key]))
            recorder.record_node(key=node.key, name=node.name, op=node.op, scope=node.scope, output=output,
                                 sources=node.sources, attributes=attributes)
        recorder.end_step()

    def host(self, value: Any) -> Any:
        return value

    def metadata(self, model: Any) -> dict[str, Any]:
        prepared = self._prepared(model)
        names = (node.attributes["openvino_name"] for node in prepared.nodes)
        ran = Counter(prepared.node_precisions[name][1] for name in names if name in prepared.node_precisions)
        found: dict[str, Any] = {"model_class": "openvino.Model", "runtime": {
            "runtime": FRAMEWORK, "openvino_version": self.version(), "device": DEVICE, "source": prepared.source,
            "precision_hint": prepared.precision_asked, "default_precision": prepared.default_precision,
            "inference_precision": prepared.inference_precision,
            "runtime_precisions": dict(sorted(ran.items())), "weight_types": prepared.weight_types,
            "recorded_outputs": len(prepared.nodes)}}
        if prepared.inference_precision in COMPUTE_DTYPES:  # the tensors say float32: say what ran
            found["compute_dtype"] = COMPUTE_DTYPES[prepared.inference_precision]
        return found

    def _prepared(self, model: Any) -> OpenVINOModel:
        if isinstance(model, OpenVINOModel):
            return model
        return self.load(model, {})


class _Detach:
    """What ``install`` returns: ``restore()`` lets the prepared model forget the recorder."""

    def __init__(self, prepared: OpenVINOModel) -> None:
        self._prepared = prepared

    def restore(self) -> None:
        self._prepared.recorder = None


def _host(tensor: Any) -> Any:
    """An output tensor as a numpy array (bf16 as torch's bfloat16, which numpy lacks)."""
    import numpy as np

    data = tensor.data
    if _type_name(tensor.get_element_type()) == "bf16":
        from ...files.host import host_tensor

        return host_tensor(np.asarray(data), bits_of="bfloat16")
    return data


__all__ = ["FRAMEWORK", "OpenVINOAdapter", "OpenVINOModel", "PRECISIONS", "check_ir", "is_openvino_model"]
