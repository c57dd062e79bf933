"""Payloads decoded with numpy: what comparing a trace reads, without torch.

A payload file is safetensors (see :mod:`tracediff.format`): a JSON header,
then raw little-endian bytes. ``read_payload`` maps the file read-only
(confined to the trace folder, regular files only: :mod:`tracediff.files.confine`),
checks the header, and returns a :class:`Payload` whose ``values`` view the
mapped bytes: nothing is copied or converted until a value is needed.

numpy has no bfloat16 or float8, so those payloads keep their bit patterns
(``uint16``, ``uint8``) in ``values``; :func:`as_floats` widens them exactly,
bf16 by a 16-bit shift into float32's high half and float8 through a table of
its 256 values, as it widens every other dtype. ``dtype`` is always torch's
name of the stored dtype (``"bfloat16"``), so two payloads of other dtypes
never look alike.

Tensors passed by a user are converted at the boundary (:func:`payload_of`,
through :func:`tracediff.files.host.host_array`), the only place here that reads torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PayloadError, PayloadFormatError
from ..files.confine import map_regular_file
from ..files.host import BIT_DTYPES, host_array
from ..format import PAYLOAD_DTYPES, PAYLOAD_HEADER_LIMIT, PAYLOAD_KEY, payload_key_problem, payload_layouts

_BITS = BIT_DTYPES  # the bit patterns of the dtypes numpy lacks (tracediff.files.host)
#: The numpy dtype holding each payload dtype (bit patterns for those numpy lacks).
STORAGE: dict[str, np.dtype[Any]] = {name: _BITS[name] if name in _BITS else np.dtype(name).newbyteorder("<")
                                     for name, _ in PAYLOAD_DTYPES.values()}
STORAGE["complex128"] = np.dtype("<c16")  # only from a user's tensor or array: safetensors has no code for it
_FLOAT8 = {  # exponent bits, mantissa bits, bias, and how NaN and infinity are encoded
    "float8_e4m3fn": (4, 3, 7, "fn"), "float8_e5m2": (5, 2, 15, "ieee"),
    "float8_e4m3fnuz": (4, 3, 8, "fnuz"), "float8_e5m2fnuz": (5, 2, 16, "fnuz"),
    "float8_e8m0fnu": (8, 0, 127, "e8m0"),  # a power of two: no sign, no zero, 0xFF is NaN
}


@dataclass(frozen=True)
class Payload:
    """A tensor's values as numpy holds them, and torch's name of its dtype (``"float32"``, ``"bfloat16"``)."""

    values: np.ndarray
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def size(self) -> int:
        return int(self.values.size)

    def with_values(self, values: np.ndarray) -> Payload:
        """The same dtype over other storage (a reshaped, sliced or permuted view of ``values``)."""
        return Payload(values, self.dtype)


def is_floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def is_complex(dtype: str) -> bool:
    return dtype.startswith("complex")


def read_payload(path: Path, *, root: Path, key: str = PAYLOAD_KEY, resolved: bool = False) -> Payload:
    """The tensor ``key`` of the payload file ``path`` (inside ``root``), mapped read-only.

    ``resolved=True``: ``path`` was resolved inside ``root`` already (``Trace.payload_path``).

    Raises ``PayloadError`` naming the file when it is missing, not a regular
    file, not a valid safetensors file, or lacks ``key``; ``PayloadFormatError``
    when a trace payload (``key`` ``data``) holds another key, or more than one tensor.
    """
    data = map_regular_file(path, root=root, error=PayloadError, what="payload", missing="payload file is missing",
                            resolved=resolved)
    try:
        length = int.from_bytes(data[:8], "little")
        layouts = payload_layouts(data[:8 + min(length, PAYLOAD_HEADER_LIMIT)], len(data))
    except ValueError as e:
        raise PayloadError(f"{path}: not a readable safetensors file ({e})") from None
    problem = payload_key_problem(path, list(layouts)) if key == PAYLOAD_KEY else None
    if problem:
        raise PayloadFormatError(problem)
    layout = layouts.get(key)
    if layout is None:
        raise PayloadError(f"{path}: no tensor named {key!r} (found {list(layouts)[:5]})")
    name = PAYLOAD_DTYPES[layout.dtype][0]
    storage = STORAGE[name]
    if not layout.nbytes:
        return Payload(np.empty(layout.shape, storage), name)
    values = np.frombuffer(data, dtype=storage, count=math.prod(layout.shape), offset=layout.start)
    return Payload(values.reshape(layout.shape), name)


def as_floats(values: np.ndarray, dtype: str, work: type[np.floating[Any]], out: np.ndarray | None = None
              ) -> np.ndarray:
    """``values`` of payload dtype ``dtype`` as ``work`` (float32 or float64), exactly.

    No copy when they are so already; otherwise written into ``out`` when given (``work`` values of the
    same shape, reused from chunk to chunk), else into a new array.
    """
    if dtype in _FLOAT8:
        table = _float8_table(dtype).astype(work, copy=False)
        return table[values] if out is None else np.take(table, values, out=out, mode="clip")
    with np.errstate(invalid="ignore"):  # a signalling NaN stays NaN; numpy would warn about it
        if dtype == "bfloat16":
            if work is np.float32 and out is not None:
                np.left_shift(values, 16, out=out.view(np.uint32), dtype=np.uint32)
                return out
            wide = np.left_shift(values, 16, dtype=np.uint32).view(np.float32)
            if work is np.float32:
                return wide
            values = wide
        if values.dtype == work:
            return values
        if out is None:
            return values.astype(work)
        np.copyto(out, values, casting="unsafe")
        return out


def finite_max(dtype: str) -> float:
    """The largest finite value of a floating payload dtype (torch's ``finfo(dtype).max``)."""
    if dtype == "bfloat16":
        return float(np.array(0x7F7F0000, dtype=np.uint32).view(np.float32))
    if dtype in _FLOAT8:
        table = _float8_table(dtype)
        return float(np.max(table[np.isfinite(table)]))
    return float(np.finfo(STORAGE[dtype]).max)


@cache
def _float8_table(dtype: str) -> np.ndarray:
    """The float32 value of each of the 256 codes of a float8 dtype."""
    exp_bits, man_bits, bias, special = _FLOAT8[dtype]
    top = (1 << exp_bits) - 1
    table = np.empty(256, np.float32)
    for code in range(256):
        if special == "e8m0":
            table[code] = math.nan if code == 0xFF else math.ldexp(1.0, code - bias)
            continue
        sign = -1.0 if code & 0x80 else 1.0
        exp, man = (code >> man_bits) & top, code & ((1 << man_bits) - 1)
        if exp == 0:
            value = sign * math.ldexp(man, 1 - bias - man_bits)
        else:
            value = sign * math.ldexp((1 << man_bits) + man, exp - bias - man_bits)
        if special == "ieee" and exp == top:
            value = sign * math.inf if man == 0 else math.nan
        elif special == "fn" and exp == top and man == (1 << man_bits) - 1:
            value = math.nan
        elif special == "fnuz" and code == 0x80:
            value = math.nan
        table[code] = value
    table.flags.writeable = False
    return table


def payload_of(value: Any) -> Payload:
    """A ``Payload``, a numpy array or a torch tensor as a ``Payload`` (torch is imported only for a tensor)."""
    if isinstance(value, Payload):
        return value
    if isinstance(value, np.ndarray):
        name = "bool" if value.dtype == np.bool_ else value.dtype.name
        if name not in STORAGE:
            raise TypeError(f"numpy dtype {value.dtype} cannot be compared")
        return Payload(value, name)
    if type(value).__module__.partition(".")[0] != "torch":
        raise TypeError(f"expected a numpy array or a torch tensor, got {type(value).__name__}")
    return _tensor_payload(value)


def _tensor_payload(tensor: Any) -> Payload:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in STORAGE:
        raise TypeError(f"dtype {tensor.dtype} cannot be compared")
    return Payload(host_array(tensor), name)  # bfloat16 and float8 as their bit patterns, as a payload file holds them
