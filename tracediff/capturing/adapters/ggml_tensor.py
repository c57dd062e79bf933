"""Reading a ``struct ggml_tensor`` (ggml.h) through ctypes: what the llama.cpp adapter records of a graph node.

llama.cpp's eval callback hands a pointer to the node it just computed. Its layout is ggml.h's::

    enum ggml_type type; ggml_backend_buffer * buffer; int64_t ne[4]; size_t nb[4]; enum ggml_op op;
    int32_t op_params[16]; int32_t flags; ggml_tensor * src[10]; ggml_tensor * view_src; size_t view_offs;
    void * data; char name[64]; void * extra; char padding[8];

``ne`` counts elements innermost first and ``nb`` gives the byte strides: torch's shape and strides are
both reversed. The data of a node in a host buffer (the CPU backend's) is read in place while the
callback runs: ggml reuses a node's memory for later nodes, and the capture's encoder writes the payload,
copies it into its pool or measures it before ``record_node`` returns (tests/capturing/test_graph_nodes.py
holds it to that), so no second copy is made here. A node in a device's buffer (layers offloaded with
``n_gpu_layers``) is copied to the host first by ggml's ``ggml_backend_tensor_get``: its ``data`` is the
device's address, which the host must never read. Element types a host array holds as they are (F32, F16,
BF16, integers) keep their dtype; a quantized type (a Q8_0 KV cache) is dequantized to float32 by ggml's
own ``to_float``, and the node says so.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_DIMS, MAX_SRC, MAX_OP_PARAMS, MAX_NAME = 4, 10, 64, 64

# ggml_type values of ggml.h whose elements numpy holds directly (BF16 travels as its 16 bits)
_PLAIN_TYPES: dict[int, str] = {0: "float32", 1: "float16", 24: "int8", 25: "int16", 26: "int32", 27: "int64",
                                28: "float64", 30: "bfloat16"}
GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0 = 0, 1, 30, 8
#: The ops ggml computes nothing for (ggml-impl.h's ``ggml_op_is_empty``): the node is its source's memory, read
#: as it is. By name: the enum's numbers change between ggml versions.
EMPTY_OPS = frozenset({"NONE", "RESHAPE", "TRANSPOSE", "VIEW", "PERMUTE"})


class GgmlTensor(ctypes.Structure):
    """ggml.h's ``struct ggml_tensor``."""


GgmlTensor._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * MAX_DIMS),
    ("nb", ctypes.c_size_t * MAX_DIMS),
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * (MAX_OP_PARAMS // 4)),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(GgmlTensor) * MAX_SRC),
    ("view_src", ctypes.POINTER(GgmlTensor)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * MAX_NAME),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]


_OP, _OP_OFFSET = ctypes.c_int, GgmlTensor.op.offset


class GgmlLibrary:
    """The few ggml functions the adapter calls: op and type names, sizes, host buffers, copies, dequantization."""

    def __init__(self, handle: ctypes.CDLL) -> None:
        void, size = ctypes.c_void_p, ctypes.c_size_t
        self._op_desc = _bound(handle, "ggml_op_desc", [void], ctypes.c_char_p)
        self._type_name = _bound(handle, "ggml_type_name", [ctypes.c_int], ctypes.c_char_p)
        self._op_name = _bound(handle, "ggml_op_name", [ctypes.c_int], ctypes.c_char_p)
        self._nbytes = _bound(handle, "ggml_nbytes", [void], size)
        self._is_host = _bound(handle, "ggml_backend_buffer_is_host", [void], ctypes.c_bool)
        self._tensor_get = _bound(handle, "ggml_backend_tensor_get", [void, void, size, size], None)
        self._host_buffers: dict[int, bool] = {}  # buffer address -> host memory
        self._handle = handle
        self._dequantizers: dict[int, Any] = {}
        self._type_names: dict[int, str] = {}
        self._empty: dict[int, bool] = {}  # ggml_op value -> computes nothing
        self._op_descs: dict[tuple[int, int], str] = {}

    def computes_nothing(self, address: int) -> bool:
        """True when the node at ``address`` is a view ggml computes nothing for (``EMPTY_OPS``)."""
        op = _OP.from_address(address + _OP_OFFSET).value
        empty = self._empty.get(op)
        if empty is None:  # a handful of distinct values
            empty = self._empty[op] = (self._op_name(op) or b"").decode("ascii", "replace") in EMPTY_OPS
        return empty

    def op(self, tensor: GgmlTensor) -> str:
        """ggml's name of the op (``ggml_op_desc``: a unary or GLU op by its own name, ``SILU``, ``SWIGLU``)."""
        key = (tensor.op, tensor.op_params[0])  # ggml_op_desc reads the op, and a unary/GLU op's first parameter
        desc = self._op_descs.get(key)
        if desc is None:  # a few dozen distinct keys a model
            desc = self._op_descs[key] = (self._op_desc(ctypes.addressof(tensor)) or b"?").decode("ascii", "replace")
        return desc

    def type_name(self, ggml_type: int) -> str:
        name = self._type_names.get(ggml_type)
        if name is None:  # asked for every node and each of its sources: a handful of distinct values
            name = self._type_names[ggml_type] = (self._type_name(ggml_type) or b"?").decode("ascii", "replace")
        return name

    def in_host_memory(self, tensor: GgmlTensor) -> bool:
        """True when ``tensor``'s data is host memory: its buffer (its view source's, for a view) is a host
        buffer, or it has none (a tensor of a context that allocated its own memory)."""
        buffer = _buffer(tensor)
        if not buffer:
            return True
        host = self._host_buffers.get(buffer)
        if host is None:  # a few buffers a context: the weights', the KV cache's, the compute buffer
            host = self._host_buffers[buffer] = bool(self._is_host(buffer))
        return host

    def copy_to_host(self, tensor: GgmlTensor) -> np.ndarray:
        """The bytes of ``tensor`` from its first element to its last (``ggml_nbytes``: a view's strides
        included), copied out of its buffer by the buffer's own backend (a device's memory)."""
        address = ctypes.addressof(tensor)
        size = int(self._nbytes(address))
        out = np.empty(size, dtype=np.uint8)
        if size and _buffer(tensor):  # ggml_backend_tensor_get aborts the process on a tensor without a buffer
            self._tensor_get(address, out.ctypes.data, 0, size)
        return out

    def dequantize(self, ggml_type: int, address: int, count: int) -> np.ndarray:
        """``count`` elements of a quantized row block at ``address`` as float32 (ggml's ``to_float``)."""
        to_float = self._dequantizers.get(ggml_type)
        if to_float is None:
            traits = _bound(self._handle, "ggml_get_type_traits", [ctypes.c_int], ctypes.POINTER(_TypeTraits))
            pointer = traits(ggml_type).contents.to_float
            if not pointer:
                raise ValueError(f"ggml type {self.type_name(ggml_type)} has no to_float")
            to_float = _TO_FLOAT(pointer)
            self._dequantizers[ggml_type] = to_float
        out = np.empty(count, dtype=np.float32)
        to_float(address, out.ctypes.data, count)
        return out


def n_dims(tensor: GgmlTensor) -> int:
    """``ggml_n_dims``: one more than the last dimension holding more than one element (1 at least)."""
    ne = tensor.ne
    for i in range(MAX_DIMS - 1, 0, -1):
        if ne[i] > 1:
            return i + 1
    return 1


def _bound(handle: ctypes.CDLL, name: str, argtypes: list[Any], restype: Any) -> Any:
    """``handle``'s function ``name`` with its C signature."""
    function = getattr(handle, name)
    function.argtypes, function.restype = argtypes, restype
    return function


def _buffer(tensor: GgmlTensor) -> int | None:
    """The address of the backend buffer holding ``tensor``'s data (its view source's, for a view; ggml's
    own rule), or None."""
    owner = tensor.view_src.contents if tensor.view_src else tensor
    return owner.buffer


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class _TypeTraits(ctypes.Structure):
    # ggml.h's struct ggml_type_traits: type_name, blck_size, blck_size_interleave, type_size, is_quantized,
    # to_float, from_float_ref
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


@dataclass(frozen=True)
class NodeView:
    """One computed node as the adapter records it."""

    address: int
    name: str
    op: str
    type_name: str
    shape: tuple[int, ...]  # torch's order: ne reversed, trailing 1s of ne dropped
    sources: tuple[int, ...]  # addresses of the tensors it read
    source_names: dict[int, str]
    source_types: dict[int, str]  # ggml type names (a weight's: F32, F16, Q8_0)
    attributes: dict[str, Any]


def view(lib: GgmlLibrary, address: int) -> tuple[NodeView, GgmlTensor]:
    """The node at ``address`` (its struct and what the adapter needs of it), without its data."""
    tensor = GgmlTensor.from_address(address)
    dims = n_dims(tensor)
    sources: list[int] = []
    names: dict[int, str] = {}
    types: dict[int, str] = {}
    for pointer in tensor.src:
        if not pointer:
            continue  # a missing optional source (ggml leaves a gap, as ROPE's frequency factors)
        src = ctypes.cast(pointer, ctypes.c_void_p).value or 0
        source = pointer.contents
        sources.append(src)
        names[src] = source.name.decode("utf-8", "replace")
        types[src] = lib.type_name(source.type)
    op = lib.op(tensor)
    node = NodeView(address=address, name=tensor.name.decode("utf-8", "replace"), op=op,
                    type_name=lib.type_name(tensor.type), shape=tuple(int(n) for n in tensor.ne[:dims])[::-1],
                    sources=tuple(sources), source_names=names, source_types=types,
                    attributes=op_attributes(op, tensor))
    return node, tensor


_PARAMETRIZED = frozenset({"RMS_NORM", "NORM", "ROPE", "ROPE_BACK", "SOFT_MAX", "FLASH_ATTN_EXT", "SCALE"})


def op_attributes(op: str, tensor: GgmlTensor) -> dict[str, Any]:
    """The op parameters that change numerics, by name (eps, rope mode and base, attention scale)."""
    if op not in _PARAMETRIZED:
        return {}
    raw = bytes(tensor.op_params)

    def floats(first: int, count: int) -> tuple[float, ...]:
        return struct.unpack_from(f"<{count}f", raw, 4 * first)

    def ints(first: int, count: int) -> tuple[int, ...]:
        return struct.unpack_from(f"<{count}i", raw, 4 * first)

    if op in ("RMS_NORM", "NORM"):
        return {"eps": floats(0, 1)[0]}
    if op in ("ROPE", "ROPE_BACK"):
        n_dims, mode, _, n_ctx_orig = ints(1, 4)
        freq_base, freq_scale, ext_factor, attn_factor = floats(5, 4)
        return {"n_dims": n_dims, "rope_mode": mode, "n_ctx_orig": n_ctx_orig, "freq_base": freq_base,
                "freq_scale": freq_scale, "ext_factor": ext_factor, "attn_factor": attn_factor}
    if op == "SOFT_MAX":
        scale, max_bias = floats(0, 2)
        return {"scale": scale, "max_bias": max_bias}
    if op == "FLASH_ATTN_EXT":
        scale, max_bias, softcap = floats(0, 3)
        return {"scale": scale, "max_bias": max_bias, "logit_softcap": softcap}
    if op == "SCALE":
        scale, bias = floats(0, 2)
        return {"scale": scale, "bias": bias}
    return {}


def read_data(lib: GgmlLibrary, tensor: GgmlTensor, shape: tuple[int, ...]) -> np.ndarray:
    """The node's data in torch's order (``shape``), of its own dtype; quantized: float32.

    A plain type in host memory is a view of ggml's memory, valid only until the eval callback returns; in a
    device's memory, a view of a host copy; a quantized one is a dequantized copy. BF16 comes back as its 16
    bits (``uint16``): the caller views them as bfloat16. Raises ValueError for a node without data.
    """
    if not tensor.data:
        raise ValueError("no data (not allocated)")
    host: np.ndarray | None = None
    base = tensor.data
    if not lib.in_host_memory(tensor):
        host = lib.copy_to_host(tensor)  # a device's memory: never read from the host
        base = host.ctypes.data
    dtype_name = _PLAIN_TYPES.get(tensor.type)
    if dtype_name is None:
        return _dequantized(lib, tensor, shape, base)
    storage = np.dtype("uint16") if dtype_name == "bfloat16" else np.dtype(dtype_name)
    if 0 in shape:
        return np.empty(shape, dtype=storage)
    strides = tuple(int(s) for s in tensor.nb[:len(shape)])[::-1]
    if host is not None:
        return np.ndarray(shape, dtype=storage, buffer=host, strides=strides)
    extent = storage.itemsize + sum((n - 1) * s for n, s in zip(shape, strides))
    buffer = memoryview((ctypes.c_char * extent).from_address(base)).cast("B")
    return np.ndarray(shape, dtype=storage, buffer=buffer, strides=strides)


def _dequantized(lib: GgmlLibrary, tensor: GgmlTensor, shape: tuple[int, ...], base: int) -> np.ndarray:
    """A quantized node's rows (ne[0] elements each, contiguous within a row) as float32, in torch's order;
    ``base`` is the host address of its first byte."""
    n_dims = len(shape)
    ne = [int(n) for n in tensor.ne[:n_dims]]
    nb = [int(s) for s in tensor.nb[:n_dims]]
    rows = np.empty((int(np.prod(ne[1:], dtype=np.int64)) if n_dims > 1 else 1, ne[0]), dtype=np.float32)
    for index, offsets in enumerate(np.ndindex(*ne[1:][::-1]) if n_dims > 1 else [()]):
        offset = sum(i * s for i, s in zip(offsets[::-1], nb[1:]))
        rows[index] = lib.dequantize(tensor.type, base + offset, ne[0])
    return rows.reshape(shape)
