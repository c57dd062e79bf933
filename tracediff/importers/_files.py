"""Reading the files of a dump: one walk of the folder, and the formats whose bytes are copied as they are.

Every file goes through :mod:`tracediff.files.confine` (confined to the dump
folder after following links, regular files only, bounded). ``.npy`` and
``.safetensors`` files are read by their headers only, checked against the
file's size: a reader returns :class:`Tensor` items that say where the bytes
are, and the writer copies them (:mod:`tracediff.importers._writer`). The
formats read through numpy or torch (``.npz``, ``.pt``) are in
:mod:`tracediff.importers._decoded`, which also maps each suffix to its reader (this module imports nothing
of it).
"""

from __future__ import annotations

import ast
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import format as fmt
from ..errors import DumpFormatError
from ..files.confine import GiB, MiB, confined, open_regular, parse_json

if TYPE_CHECKING:
    import torch

#: File name endings read as tensor files.
TENSOR_SUFFIXES = (".npy", ".npz", fmt.PAYLOAD_SUFFIX, ".pt", ".pth")
#: At most this many files are looked at in a dump folder, this many levels deep.
MAX_FILES = 1_000_000
MAX_DEPTH = 32
#: A ``.npy`` header; a ``.safetensors`` header (the safetensors library's own limit).
NPY_HEADER_LIMIT = 1 * MiB
SAFETENSORS_HEADER_LIMIT = 100 * MiB
#: A ``.pt`` file (read whole by ``torch.load``), an ``.npz`` member once decompressed, and all of an ``.npz``.
PT_LIMIT = 64 * GiB
NPZ_LIMIT = 64 * GiB

#: numpy's little-endian (or byte-order-free) dtype strings -> safetensors codes.
NPY_CODES = {"<f8": "F64", "<f4": "F32", "<f2": "F16", "<i8": "I64", "<i4": "I32", "<i2": "I16", "|i1": "I8",
             "|u1": "U8", "|b1": "BOOL", "<u2": "U16", "<u4": "U32", "<u8": "U64", "<c8": "C64"}


@dataclass(frozen=True)
class Tensor:
    """One tensor of a dump: where it came from, its name inside the file, and how to get its bytes.

    Either ``offset`` (its bytes lie in ``path`` from there, in C order,
    little-endian: copied as they are) or ``value`` (already read: a torch
    tensor) is set.
    """

    path: Path
    key: tuple[str, ...]  # () for a file holding one tensor; the keys leading to it in a dict file
    dtype: str  # torch's name: "float32"
    shape: tuple[int, ...]
    code: str  # safetensors' dtype code
    offset: int | None = None
    nbytes: int = 0
    value: torch.Tensor | None = None


def walk(folder: Path) -> Iterator[tuple[Path, str]]:
    """Every regular file name under ``folder`` as ``(path, relative path with "/")``, sorted, links not followed.

    A link (to a file or a folder) that leads out of ``folder`` raises
    ``UnsafePathError`` naming it; a link to a folder inside is not followed.
    """
    root = folder.resolve()
    count = 0
    for base, dirs, files in os.walk(folder, followlinks=False):
        here = Path(base)
        depth = len(here.relative_to(folder).parts)
        if depth >= MAX_DEPTH:
            raise DumpFormatError(f"{here}: folders nest more than {MAX_DEPTH} levels deep; refused")
        for name in sorted(dirs):
            if (here / name).is_symlink():
                confined(here / name, root)
        dirs.sort()
        for name in sorted(files):
            count += 1
            if count > MAX_FILES:
                raise DumpFormatError(f"{folder}: holds more than {MAX_FILES:,} files; refused")
            path = here / name
            if path.is_symlink():
                confined(path, root)
            yield path, path.relative_to(folder).as_posix()


def open_file(path: Path, root: Path, what: str) -> tuple[int, int]:
    return open_regular(path, root=root, error=DumpFormatError, what=what)


def read_head(path: Path, root: Path, size: int) -> bytes:
    """The first ``size`` bytes (at most) of the regular file ``path`` inside ``root``: to recognise a file."""
    fd, _ = open_file(path, root, "file")
    try:
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def _pread(fd: int, size: int, offset: int, path: Path, what: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise DumpFormatError(f"{path}: the {what} is truncated (expected {size:,} bytes at {offset:,}, "
                              f"found {len(data):,})")
    return data


def npy_as_is(path: Path, root: Path) -> Tensor | str:
    """A ``.npy`` file's header, checked against the file's size: the tensor whose data is copied later, as it
    is, or the file's dtype string when its data must be decoded first (big-endian, Fortran order, a dtype
    safetensors has no code for; :func:`tracediff.importers._decoded.read_npy` does that)."""
    fd, size = open_file(path, root, "npy file")
    try:
        head = os.pread(fd, 12, 0)
        if len(head) < 10 or head[:6] != b"\x93NUMPY":
            raise DumpFormatError(f"{path}: not a .npy file (no \\x93NUMPY magic at the start)")
        major = head[6]
        width = 2 if major == 1 else 4
        if major not in (1, 2, 3) or len(head) < 8 + width:
            raise DumpFormatError(f"{path}: .npy version {major}.{head[7]} is not one numpy writes (1, 2 or 3)")
        length = int.from_bytes(head[8:8 + width], "little")
        if length > NPY_HEADER_LIMIT:
            raise DumpFormatError(f"{path}: .npy header of {length:,} bytes, over the limit of "
                                  f"{NPY_HEADER_LIMIT:,}; refused")
        start = 8 + width + length
        text = _pread(fd, length, 8 + width, path, ".npy header")
        descr, fortran, shape = _npy_header(text, path)
        code = NPY_CODES.get(descr)
        itemsize = fmt.PAYLOAD_DTYPES[code][1] if code else 0
        nbytes = math.prod(shape) * itemsize
        if code is not None and not fortran and size != start + nbytes:
            raise DumpFormatError(f"{path}: holds {size - start:,} bytes of data; shape {list(shape)} of {descr} "
                                  f"needs {nbytes:,} (truncated or not a .npy file)")
    finally:
        os.close(fd)
    if code is not None and not fortran:
        return Tensor(path, (), fmt.PAYLOAD_DTYPES[code][0], shape, code, offset=start, nbytes=nbytes)
    return descr


def _npy_header(text: bytes, path: Path) -> tuple[str, bool, tuple[int, ...]]:
    try:
        header = ast.literal_eval(text.decode("latin-1"))
    except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
        header = None
    if not (isinstance(header, dict) and isinstance(header.get("descr"), str)
            and isinstance(header.get("fortran_order"), bool) and isinstance(header.get("shape"), tuple)
            and all(isinstance(d, int) and d >= 0 for d in header["shape"]) and len(header["shape"]) <= 64):
        raise DumpFormatError(f"{path}: .npy header is not {{'descr': str, 'fortran_order': bool, 'shape': "
                              "tuple of sizes}; refused")
    return header["descr"], header["fortran_order"], tuple(header["shape"])


def read_safetensors(path: Path, root: Path) -> list[Tensor]:
    """A ``.safetensors`` file: every tensor of its header, in the order of their data, checked against the file."""
    fd, size = open_file(path, root, "safetensors file")
    try:
        head = os.pread(fd, 8, 0)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if length < 2 or length > min(SAFETENSORS_HEADER_LIMIT, size - 8):
            raise DumpFormatError(f"{path}: not a safetensors file (header length {length:,} in a file of "
                                  f"{size:,} bytes)")
        header = parse_json(_pread(fd, length, 8, path, "safetensors header"), path=path, error=DumpFormatError,
                            what="safetensors header")
    finally:
        os.close(fd)
    if not isinstance(header, dict):
        raise DumpFormatError(f"{path}: the safetensors header is not a JSON object")
    tensors = []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        code, shape, span = _safetensors_entry(path, key, entry)
        nbytes = math.prod(shape) * fmt.PAYLOAD_DTYPES[code][1]
        if span[1] - span[0] != nbytes or span[1] > size - 8 - length:
            raise DumpFormatError(f"{path}: tensor {key!r} spans bytes {span[0]:,} to {span[1]:,} of "
                                  f"{size - 8 - length:,}; its shape {list(shape)} needs {nbytes:,}")
        tensors.append(Tensor(path, (key,), fmt.PAYLOAD_DTYPES[code][0], shape, code, offset=8 + length + span[0],
                              nbytes=nbytes))
    tensors.sort(key=lambda t: t.offset or 0)
    return tensors


def _safetensors_entry(path: Path, key: str, entry: Any) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    if not isinstance(entry, dict):
        raise DumpFormatError(f"{path}: header entry {key!r} is not an object")
    code, shape, span = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if code not in fmt.PAYLOAD_DTYPES:
        raise DumpFormatError(f"{path}: tensor {key!r} has dtype {code!r}, not one tracediff reads "
                              f"({', '.join(fmt.PAYLOAD_DTYPES)})")
    if not (isinstance(shape, list) and len(shape) <= 64 and isinstance(span, list) and len(span) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in [*shape, *span])
            and span[0] <= span[1]):
        raise DumpFormatError(f"{path}: tensor {key!r} has a malformed shape or data_offsets")
    return str(code), tuple(shape), (span[0], span[1])


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__
