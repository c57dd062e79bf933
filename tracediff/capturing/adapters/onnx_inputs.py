"""The graph inputs of an ONNX model, fed from an inputs file: found by name or position, cast to their types."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from .onnx_file import import_onnx

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class GraphInput:
    """One input of the graph the caller feeds (an input that is also an initializer is left out)."""

    name: str
    position: int
    elem_type: int
    dims: tuple[int | None, ...] | None  # None: no shape declared; None in it: a symbolic dimension


def graph_inputs(proto: Any) -> list[GraphInput]:
    """The inputs the caller feeds, in the graph's order (an input that is also an initializer has a default)."""
    initializers = {t.name for t in proto.graph.initializer}
    fed = [value for value in proto.graph.input if value.name not in initializers]
    return [GraphInput(value.name, i, value.type.tensor_type.elem_type, _dims(value)) for i, value in enumerate(fed)]


def graph_feeds(graph_inputs: list[GraphInput], inputs: Mapping[str, Any], source: str, casts: dict[str, str]
                ) -> dict[str, np.ndarray]:
    """The graph's inputs from ``inputs`` (``kwargs.NAME``, ``NAME`` or ``args.i``), cast to their declared
    element types (each cast noted in ``casts``); UsageError naming the first one missing or unusable."""
    fed: dict[str, np.ndarray] = {}
    for graph_input in graph_inputs:
        name = graph_input.name
        key = next((k for k in (f"kwargs.{name}", name, f"args.{graph_input.position}") if k in inputs), None)
        if key is None:
            held = ", ".join(sorted(inputs)) or "nothing"
            raise UsageError(f"{source}: graph input {name!r} is not in the file (it holds {held})")
        fed[name] = _cast(graph_input, casts, _as_numpy(inputs[key], f"{source}: {key}"), f"{source}: {key}")
    return fed


def _cast(graph_input: GraphInput, casts: dict[str, str], array: np.ndarray, where: str) -> np.ndarray:
    import numpy as np

    onnx = import_onnx()
    name = graph_input.name
    try:
        declared = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(graph_input.elem_type))
    except (KeyError, TypeError, ValueError):
        declared = array.dtype  # an element type numpy has no name for: fed as it is
    if graph_input.dims is not None:
        dims = graph_input.dims
        if len(dims) != array.ndim or any(d is not None and d != n for d, n in zip(dims, array.shape)):
            shown = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
            raise UsageError(f"{where}: shape {list(array.shape)} does not fit graph input {name!r} {shown}")
    if array.dtype == declared:
        return array
    given_float, wanted_float = array.dtype.kind in "fc", declared.kind in "fc"
    if given_float and not wanted_float:
        raise UsageError(f"{where}: {array.dtype} values for graph input {name!r}, which takes {declared}")
    if not wanted_float and array.dtype.kind in "iub" and declared.kind in "iu" and array.size:
        limits = np.iinfo(declared)
        if int(array.min()) < limits.min or int(array.max()) > limits.max:
            raise UsageError(f"{where}: values {int(array.min())} to {int(array.max())} do not fit graph "
                             f"input {name!r} ({declared})")
    casts[name] = f"{array.dtype} -> {declared}"
    return array.astype(declared)


def type_name(elem_type: int) -> str:
    """An ONNX element type as numpy names it (``float32``), else as ONNX does (``bfloat16``, ``float8e4m3fn``)."""
    import numpy as np

    onnx = import_onnx()
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        return str(onnx.TensorProto.DataType.Name(elem_type)).lower() if elem_type else "undefined"


def _dims(value: Any) -> tuple[int | None, ...] | None:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return tuple(int(d.dim_value) if d.HasField("dim_value") else None for d in tensor_type.shape.dim)


def _as_numpy(value: Any, where: str) -> np.ndarray:
    """An inputs file's tensor (a torch tensor, a numpy array, a number) as a numpy array."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            raise UsageError(f"{where}: a bfloat16 tensor; numpy, which ONNX Runtime is fed through, has no "
                             "bfloat16: save it as float32")
        return tensor.numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{where}: not a tensor ({type(value).__name__}: {e})") from None


__all__ = ["GraphInput", "graph_feeds", "graph_inputs", "type_name"]
