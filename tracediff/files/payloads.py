"""Payload files: one tensor per safetensors file, written atomically and read without unpickling.

Payloads are single-tensor safetensors files holding the key ``data``, the
layout transformers' debugger writes. We write them ourselves (header plus one
copy of the bytes) because ``safetensors.torch.save_file`` serializes into an
intermediate buffer first, and capture runs inside every module call. The
bytes are identical to what ``save_file`` writes.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PayloadError, PayloadFormatError
from ..format import PAYLOAD_KEY, payload_key_problem
from .atomic import replace_with

if TYPE_CHECKING:
    import torch


@functools.lru_cache(maxsize=1)
def _dtype_codes() -> dict[torch.dtype, str]:
    """safetensors' dtype codes by torch dtype (built on first use: torch is imported lazily)."""
    import torch

    codes = {
        torch.float64: "F64",
        torch.float32: "F32",
        torch.float16: "F16",
        torch.bfloat16: "BF16",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.int16: "I16",
        torch.int8: "I8",
        torch.uint8: "U8",
        torch.bool: "BOOL",
        torch.complex64: "C64",
    }
    for name, code in [
        ("float8_e4m3fn", "F8_E4M3"),
        ("float8_e5m2", "F8_E5M2"),
        ("float8_e4m3fnuz", "F8_E4M3FNUZ"),
        ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
        ("uint16", "U16"),
        ("uint32", "U32"),
        ("uint64", "U64"),
    ]:
        if hasattr(torch, name):
            codes[getattr(torch, name)] = code
    return codes


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of a CPU-contiguous copy of ``tensor``."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(byte_view(t).numpy())  # type: ignore[arg-type]


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor`` (on its device) as a flat uint8 tensor; a copy only where the layout needs one."""
    import torch

    flat = tensor.contiguous().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # a one-element view can keep any stride and still count as contiguous
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def write_tensor_file(path: str | os.PathLike[str], tensor: torch.Tensor) -> int:
    """Write ``tensor`` under key ``data`` as a safetensors file, atomically.

    Returns the number of payload bytes written. Raises ``OutputDirError``
    naming the file when the disk is full or the location is not writable.
    """
    code = _dtype_codes().get(tensor.dtype)
    if code is None:
        raise PayloadError(f"{path}: dtype {tensor.dtype} cannot be stored in safetensors")
    data = tensor_bytes(tensor)
    header = json.dumps(
        {PAYLOAD_KEY: {"dtype": code, "shape": list(tensor.shape), "data_offsets": [0, data.nbytes]}},
        separators=(",", ":"),
    ).encode()
    header += b" " * (-len(header) % 8)
    replace_with(Path(path), [len(header).to_bytes(8, "little") + header, data], what="payload")
    return data.nbytes


def read_tensor_file(path: Path, key: str = PAYLOAD_KEY, *, payload: bool = False) -> torch.Tensor:
    """Read one tensor from a safetensors file through ``safe_open`` (memory-mapped, no pickle).

    ``payload=True``: the file is a trace payload, so it must hold exactly one
    tensor, under ``data`` (``PayloadFormatError`` otherwise, naming the keys found).
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
            problem = payload_key_problem(path, keys) if payload else None
            if problem:
                raise PayloadFormatError(problem)
            if key not in keys:
                raise PayloadError(f"{path}: no tensor named {key!r} (found {keys[:5]})")
            return f.get_tensor(key)
    except PayloadFormatError:
        raise
    except FileNotFoundError as e:
        raise PayloadError(f"{path}: payload file is missing") from e
    except MemoryError:
        raise PayloadError(f"{path}: not enough memory to map the payload") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PayloadError(f"{path}: not a readable safetensors file ({first})") from e


