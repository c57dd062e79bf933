"""Tensor files read through numpy or torch: ``.npz`` archives, ``.pt``/``.pth`` files, and the ``.npy`` files
that cannot be copied as they are (big-endian, Fortran order); and the reader of each suffix.

Nothing is unpickled: numpy reads with ``allow_pickle=False``, torch with
``weights_only=True``. Files are opened through :func:`tracediff.importers._files.open_file`
(confined to the dump, regular files only).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import format as fmt
from ..errors import DumpFormatError
from ._files import (
    NPY_CODES,
    NPZ_LIMIT,
    PT_LIMIT,
    Tensor,
    first_line,
    npy_as_is,
    open_file,
    read_safetensors,
)

if TYPE_CHECKING:
    import numpy as np
    import torch


def load_npy(path: Path, root: Path, descr: str) -> np.ndarray:
    import numpy as np

    fd, _ = open_file(path, root, "npy file")
    with os.fdopen(fd, "rb") as f:
        try:
            return np.lib.format.read_array(f, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise DumpFormatError(f"{path}: cannot read the .npy data of dtype {descr!r} ({first_line(e)})") from None


def read_npy(path: Path, root: Path) -> list[Tensor]:
    """A ``.npy`` file: copied as it is where safetensors can hold its bytes, else decoded through numpy."""
    found = npy_as_is(path, root)
    return [found] if isinstance(found, Tensor) else [from_numpy(path, (), load_npy(path, root, found))]


def read_npz(path: Path, root: Path) -> list[Tensor]:
    """An ``.npz`` archive: each ``.npy`` member, decompressed within bounds, never unpickled."""
    import zipfile

    fd, _ = open_file(path, root, "npz file")
    tensors, total = [], 0
    with os.fdopen(fd, "rb") as f:
        try:
            archive = zipfile.ZipFile(f)
            for info in archive.infolist():
                total += info.file_size
                if info.file_size > NPZ_LIMIT or total > NPZ_LIMIT:
                    raise DumpFormatError(f"{path}: member {info.filename!r} decompresses beyond the limit of "
                                          f"{NPZ_LIMIT:,} bytes; refused")
                name = info.filename.removesuffix(".npy")
                with archive.open(info) as member:
                    import numpy as np

                    array = np.lib.format.read_array(member, allow_pickle=False)
                tensors.append(from_numpy(path, (name,), array))
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError) as e:
            raise DumpFormatError(f"{path}: not a readable .npz archive ({first_line(e)})") from None
    return tensors


def read_pt(path: Path, root: Path) -> list[Tensor]:
    """A ``.pt``/``.pth`` file through ``torch.load(weights_only=True)``: a tensor, or dicts and lists of them.

    A file that needs anything else unpickled (a class, a function) is
    refused: the weights-only unpickler never runs code. Values that are not
    tensors (numbers, strings) are left out.
    """
    import pickle

    import torch

    fd, size = open_file(path, root, "PyTorch file")
    if size > PT_LIMIT:
        os.close(fd)
        raise DumpFormatError(f"{path}: the PyTorch file is {size:,} bytes, over the limit of {PT_LIMIT:,}; refused")
    with os.fdopen(fd, "rb") as f:
        try:
            loaded = _load(torch, f)
        except pickle.UnpicklingError as e:
            raise DumpFormatError(f"{path}: holds pickled objects other than tensors, which are never unpickled "
                                  f"(torch.load(weights_only=True) refused: {first_line(e)})") from None
        except (RuntimeError, ValueError, OSError, EOFError, AttributeError, KeyError, TypeError) as e:
            raise DumpFormatError(f"{path}: not a readable PyTorch file ({first_line(e)})") from None
    return [_from_torch(path, key, t) for key, t in _leaves(loaded, ())]


def _load(torch: Any, f: Any) -> Any:
    """``torch.load(weights_only=True)`` of the open file, memory-mapped where it can be.

    Mapping (``mmap=True``) needs a path: ``/proc/self/fd/N`` names the file
    already opened and checked, not the name again. The import then copies
    each tensor once instead of reading it first. Files of the legacy format,
    and systems without ``/proc``, are read through the file object.
    """
    path = f"/proc/self/fd/{f.fileno()}"
    if os.path.exists(path):
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
            f.seek(0)
    return torch.load(f, map_location="cpu", weights_only=True)


def _leaves(value: Any, key: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    import torch

    if isinstance(value, torch.Tensor):
        yield key, value
    elif isinstance(value, dict):
        for k, item in value.items():
            yield from _leaves(item, (*key, str(k)))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _leaves(item, (*key, str(i)))


def from_numpy(path: Path, key: tuple[str, ...], array: np.ndarray) -> Tensor:
    import numpy as np
    import torch

    if array.dtype.hasobject or array.dtype.str.lstrip("<>|=") not in {c.lstrip("<|") for c in NPY_CODES}:
        raise DumpFormatError(f"{path}: {'/'.join(key) or 'the array'} has dtype {array.dtype.str!r}, which "
                              "tracediff does not read")
    little = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False))
    return _from_torch(path, key, torch.from_numpy(little))


def _from_torch(path: Path, key: tuple[str, ...], tensor: torch.Tensor) -> Tensor:
    name = str(tensor.dtype).removeprefix("torch.")
    code = next((c for c, (n, _) in fmt.PAYLOAD_DTYPES.items() if n == name), None)
    if code is None:
        raise DumpFormatError(f"{path}: {'/'.join(key) or 'the tensor'} has dtype {tensor.dtype}, which cannot "
                              "be stored in a trace")
    return Tensor(path, key, name, tuple(tensor.shape), code, value=tensor)


READERS = {".npy": read_npy, ".npz": read_npz, fmt.PAYLOAD_SUFFIX: read_safetensors, ".pt": read_pt, ".pth": read_pt}


def read_tensor_file(path: Path, root: Path) -> list[Tensor]:
    """The tensors of one dump file, by its suffix (``TENSOR_SUFFIXES``)."""
    return READERS[path.suffix.lower()](path, root)
