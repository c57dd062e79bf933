"""Payload files: one tensor per safetensors file, written atomically and read without unpickling.

Payloads are single-tensor safetensors files holding the key ``data``, the
layout transformers' debugger writes. We write them ourselves (header plus one
copy of the bytes) because ``safetensors.torch.save_file`` serializes into an
intermediate buffer first, and capture runs inside every module call. The
bytes are identical to what ``save_file`` writes.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PayloadError, PayloadFormatError
from ..format import PAYLOAD_DTYPES, PAYLOAD_KEY, payload_header, payload_key_problem
from .atomic import replace_with

if TYPE_CHECKING:
    import torch


@functools.lru_cache(maxsize=1)
def _dtype_codes() -> dict[torch.dtype, str]:
    """safetensors' dtype codes by torch dtype, from the trace format's table (torch is imported lazily)."""
    import torch

    return {getattr(torch, name): code for code, (name, _) in PAYLOAD_DTYPES.items() if hasattr(torch, name)}


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
    replace_with(Path(path), [payload_header(code, tuple(tensor.shape), data.nbytes), data], what="payload")
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


