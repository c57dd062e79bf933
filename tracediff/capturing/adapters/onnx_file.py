"""Reading an ONNX model from an untrusted file: bounded, confined, its external data checked before it is read.

An ``.onnx`` file is a protobuf; its large tensors may live in other files, named by each tensor's
``external_data`` ``location`` (relative to the model's folder), ``offset`` and ``length``. onnx's own loader
follows those names wherever they lead. Here:

* the model file is a regular file of at most ``MODEL_LIMIT`` bytes (protobuf's own limit), read once, parsed
  with the external data left unread; a file that does not parse, or parses into no graph, is refused;
* every external location must be a relative name inside the model's folder, reached through no symbolic
  link, naming a regular file that holds the tensor's ``offset + length`` bytes, the length the tensor's
  shape and type need; all of it together at most ``MODEL_LIMIT`` bytes (ONNX Runtime is handed the model as
  one protobuf);
* only then is each tensor's data read, from the file opened without following links, into the tensor.

Every refusal is one :class:`tracediff.errors.UsageError` line naming the model file.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import UnsafePathError, UsageError
from ...files.confine import GiB, map_regular_file, read_bounded, resolve_inside, resolved_folder

if TYPE_CHECKING:
    import onnx

#: An ONNX model (with its external data) handed to ONNX Runtime as one protobuf: protobuf's 2 GiB.
MODEL_LIMIT = 2 * GiB - 1
_LOCATION_LIMIT = 4096


def import_onnx() -> Any:
    try:
        import onnx
    except ImportError as e:
        raise UsageError(f"onnx is not installed ({e}): pip install -c constraints.txt -e \".[onnx]\"") from None
    return onnx


def read_model_file(path: Path) -> onnx.ModelProto:
    """The ONNX model of the file ``path`` with its external data read in (see the module docstring)."""
    onnx = import_onnx()
    data = read_bounded(path, limit=MODEL_LIMIT, error=UsageError, what="ONNX model")
    try:
        model = onnx.load_model_from_string(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and whatever a damaged file raises
        raise UsageError(f"{path}: not an ONNX model (the protobuf does not parse: {_first_line(e)})") from None
    del data
    check_graph(model, str(path))
    read_external_data(model, path)
    return model


def check_graph(model: onnx.ModelProto, name: str) -> None:
    """UsageError unless ``model`` holds a graph with nodes (any bytes, even none, parse as an empty model)."""
    if not model.HasField("graph") or not model.graph.node:
        raise UsageError(f"{name}: not an ONNX model (it holds no graph nodes)")
    for node in model.graph.node:  # a damaged file parses with names that are bytes, not text
        texts = [node.name, node.op_type, *node.input, *node.output]
        if not all(isinstance(text, str) for text in texts):
            raise UsageError(f"{name}: not a readable ONNX model (a node's name or values are not text)")


def tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor the model holds: initializers, Constant values, those of subgraphs and of functions."""
    graphs = [model.graph]
    nodes = [node for function in model.functions for node in function.node]
    while graphs or nodes:
        if graphs:
            graph = graphs.pop()
            yield from graph.initializer
            for sparse in graph.sparse_initializer:
                yield sparse.values
                yield sparse.indices
            nodes.extend(graph.node)
            continue
        node = nodes.pop()
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                graphs.append(attribute.g)
            graphs.extend(attribute.graphs)


def external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    onnx = import_onnx()
    return [t for t in tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL]


def refuse_external(model: onnx.ModelProto, name: str) -> None:
    """UsageError when a model given as an object still keeps tensor data in files (there is no folder to
    confine them to)."""
    external = external_tensors(model)
    if external:
        raise UsageError(f"{name}: tensor {external[0].name!r} keeps its data in an external file: load the "
                         "model with its data (onnx.load(path)) or capture the file itself")


def read_external_data(model: onnx.ModelProto, path: Path) -> None:
    """Check every external location of ``model`` (the file ``path``), then read the data into the tensors."""
    tensor_proto = import_onnx().TensorProto
    external = external_tensors(model)
    if not external:
        return
    folder = path.parent
    real_folder = resolved_folder(folder)
    plans: list[tuple[onnx.TensorProto, Path, int, int]] = []
    total = model.ByteSize()
    for tensor in external:
        where = _entries(tensor, path)
        location = where.get("location", "")
        if len(location) > _LOCATION_LIMIT:
            raise UsageError(f"{path}: tensor {tensor.name!r}: an external data location of {len(location):,} "
                             "characters; refused")
        try:
            resolved = resolve_inside(folder, location, what="external data location", real_root=real_folder)
        except UnsafePathError:
            raise UsageError(f"{path}: tensor {tensor.name!r} keeps its data in {location!r}, outside the "
                             "model's folder; refused") from None
        if resolved != real_folder.joinpath(location):  # a link on the way, even one that stays inside
            raise UsageError(f"{path}: tensor {tensor.name!r} keeps its data in {location!r}, a symbolic link; "
                             "refused")
        offset, length = _int(where, "offset", tensor, path), _int(where, "length", tensor, path)
        plans.append((tensor, resolved, offset, length))
    maps: dict[Path, mmap.mmap | bytes] = {}
    for tensor, resolved, offset, length in plans:
        if resolved not in maps:
            maps[resolved] = map_regular_file(resolved, resolved=True, error=UsageError, what="external data file")
        size = len(maps[resolved])
        end = size if length < 0 else offset + length
        if offset > size or end > size:
            raise UsageError(f"{path}: tensor {tensor.name!r} needs bytes {offset:,} to {end:,} of "
                             f"{resolved.name}, which holds {size:,}; the file is truncated")
        expected = _expected_bytes(tensor)
        if expected is not None and end - offset != expected:
            raise UsageError(f"{path}: tensor {tensor.name!r} ({_shape(tensor)}) needs {expected:,} bytes, its "
                             f"external data holds {end - offset:,}")
        total += end - offset
        if total > MODEL_LIMIT:
            raise UsageError(f"{path}: the model and its external data are over {MODEL_LIMIT:,} bytes, more than "
                             "ONNX Runtime takes as one protobuf; refused")
    for tensor, resolved, offset, length in plans:
        data = maps[resolved]
        end = len(data) if length < 0 else offset + length
        tensor.raw_data = bytes(data[offset:end])
        del tensor.external_data[:]
        tensor.data_location = tensor_proto.DEFAULT
    for data in maps.values():
        if isinstance(data, mmap.mmap):
            data.close()


def _entries(tensor: onnx.TensorProto, path: Path) -> dict[str, str]:
    entries = {entry.key: entry.value for entry in tensor.external_data}
    if not entries.get("location"):
        raise UsageError(f"{path}: tensor {tensor.name!r} is external but names no location")
    return entries


def _int(entries: dict[str, str], key: str, tensor: onnx.TensorProto, path: Path) -> int:
    """An external data ``offset`` (default 0) or ``length`` (default -1: to the end of the file)."""
    text = entries.get(key)
    if text is None:
        return 0 if key == "offset" else -1
    if not text.isdigit() or len(text) > 20:
        raise UsageError(f"{path}: tensor {tensor.name!r}: external data {key} {text[:40]!r} is not a "
                         "non-negative integer")
    return int(text)


def _expected_bytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes a tensor of this shape and fixed-size type holds; None for strings and packed 4-bit types."""
    onnx = import_onnx()
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None
    if tensor.data_type in (onnx.TensorProto.STRING,) or itemsize == 0:
        return None
    if tensor.data_type in {getattr(onnx.TensorProto, n, -1) for n in ("INT4", "UINT4", "FLOAT4E2M1")}:
        return None
    return math.prod(tensor.dims) * itemsize


def _shape(tensor: onnx.TensorProto) -> str:
    return "[" + ", ".join(str(d) for d in tensor.dims) + "]"


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else type(e).__name__


__all__ = ["MODEL_LIMIT", "check_graph", "import_onnx", "read_model_file", "refuse_external", "tensors"]
