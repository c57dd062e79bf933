"""Safe, atomic file I/O shared by capture, reading and training records.

Payloads are single-tensor safetensors files holding the key ``data``, the
layout transformers' debugger writes. We write them ourselves (header plus one
copy of the bytes) because ``safetensors.torch.save_file`` serializes into an
intermediate buffer first, and capture runs inside every module call. The
bytes are identical to what ``save_file`` writes.
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from json.encoder import encode_basestring_ascii as _quote
from pathlib import Path
from typing import Any

import torch

from .errors import OutputDirError, PayloadError, UnsafePathError

_DTYPE_CODES: dict[torch.dtype, str] = {
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
for _name, _code in [
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
    ("float8_e4m3fnuz", "F8_E4M3FNUZ"),
    ("float8_e5m2fnuz", "F8_E5M2FNUZ"),
    ("uint16", "U16"),
    ("uint32", "U32"),
    ("uint64", "U64"),
]:
    if hasattr(torch, _name):
        _DTYPE_CODES[getattr(torch, _name)] = _code


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of a CPU-contiguous copy of ``tensor``."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def write_tensor_file(path: str | os.PathLike[str], tensor: torch.Tensor) -> int:
    """Write ``tensor`` under key ``data`` as a safetensors file, atomically.

    Returns the number of payload bytes written. Raises ``OutputDirError``
    naming the file when the disk is full or the location is not writable.
    """
    code = _DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise PayloadError(f"{path}: dtype {tensor.dtype} cannot be stored in safetensors")
    data = tensor_bytes(tensor)
    header = json.dumps(
        {"data": {"dtype": code, "shape": list(tensor.shape), "data_offsets": [0, data.nbytes]}},
        separators=(",", ":"),
    ).encode()
    header += b" " * (-len(header) % 8)
    tmp = f"{path}.tmp"
    try:
        fd = os.open(tmp, _NEW_FILE_FLAGS, 0o666)
        try:
            _write_all(fd, [len(header).to_bytes(8, "little") + header, data])
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise OutputDirError(f"{path}: could not write payload: {e.strerror or e}") from e
    return data.nbytes


_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)


def _write_all(fd: int, chunks: list[bytes | memoryview]) -> None:
    """Write ``chunks`` in order with as few system calls as the OS allows (one ``writev`` as a rule)."""
    views = [memoryview(chunk).cast("B") for chunk in chunks if len(chunk)]
    while views:
        written = os.writev(fd, views) if _HAS_WRITEV else os.write(fd, views[0])
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


_HAS_WRITEV = hasattr(os, "writev")


def write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, drop_key: str | None = None) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file and a rename.

    The text is exactly ``json.dumps(obj, indent=indent)`` (see ``json_text``
    for ``drop_key``); it is built in full before the file is created, so an
    object that cannot be serialized leaves nothing behind.
    """
    path = Path(path)
    text = json_text(obj, indent=indent, drop_key=drop_key).encode("utf-8")
    fd, tmp = _temp_beside(path)
    try:
        try:
            _write_all(fd, [text])
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise OutputDirError(f"{path}: could not write: {e.strerror or e}") from e


def json_text(obj: Any, *, indent: int | None = 2, drop_key: str | None = None) -> str:
    """The text of ``json.dumps(obj, indent=indent)``, built three to four times faster.

    ``drop_key`` leaves out every dict item with that key, at any depth, as if
    it had been deleted from a copy first (e.g. ``"value"`` for a trace's
    SUMMARY file). The standard library indents JSON in pure Python; a trace
    tree is large enough for that to show next to a forward pass. This walks
    the containers in Python but has containers of plain scalars (most of a
    trace: statistics, tensor descriptions) formatted by the standard C
    encoder. Values it does not know, and circular references, go to
    ``json.dumps``, which raises as usual.
    """
    if indent is None or not isinstance(indent, int) or _make_c_encoder is None:
        return json.dumps(_without_key(obj, drop_key), indent=indent, allow_nan=True)
    try:
        return _IndentedJson(indent, drop_key).text(obj)
    except (_NotPlainJson, RecursionError):
        return json.dumps(_without_key(obj, drop_key), indent=indent, allow_nan=True)


def _without_key(value: Any, key: str | None) -> Any:
    if key is None:
        return value
    if isinstance(value, dict):
        return {k: _without_key(v, key) for k, v in value.items() if k != key}
    if isinstance(value, (list, tuple)):
        return [_without_key(v, key) for v in value]
    return value


class _NotPlainJson(Exception):
    pass


def _refuse(value: Any) -> Any:
    raise _NotPlainJson


_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
_make_c_encoder = getattr(json.encoder, "c_make_encoder", None)


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value == math.inf:
        return "Infinity"
    if value == -math.inf:
        return "-Infinity"
    return float.__repr__(value)


def _scalar_text(value: Any) -> str | None:
    """JSON of a str/None/bool/int/float, as the standard encoder writes it; None for anything else."""
    if isinstance(value, str):
        return _quote(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return _float_text(value)
    return None


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return _quote(key)
    if isinstance(key, (bool, int, float)) or key is None:
        return '"' + str(_scalar_text(key)) + '"'
    raise _NotPlainJson


class _IndentedJson:
    def __init__(self, indent: int, drop_key: str | None) -> None:
        self.parts: list[str] = []
        self.step = " " * indent
        self.drop_key = drop_key
        self.newlines = ["\n"]  # newline plus the indentation of each depth
        self.flat_encoders: list[Any] = []  # C encoders whose item separator indents one depth

    def text(self, obj: Any) -> str:
        self._value(obj, 0)
        return "".join(self.parts)

    def _value(self, value: Any, depth: int) -> None:
        add = self.parts.append
        if isinstance(value, dict):
            if not value:
                add("{}")
                return
            drop = self.drop_key
            # Checks written as set.issuperset(map(type, ...)) run in C, with no Python loop.
            if (_PLAIN_SCALARS.issuperset(map(type, value.values())) and _STR.issuperset(map(type, value))
                    and (drop is None or drop not in value)):
                add(self._flat(value, depth, "{", "}"))
                return
            inner = self._newline(depth + 1)
            separator = "{" + inner
            for key, item in value.items():
                if key == drop and type(key) is str:
                    continue
                kind = type(item)  # exact types first: the common case, and cheaper than isinstance
                if kind is str:
                    add(separator + _key_text(key) + ": " + _quote(item))
                elif kind is float:
                    add(separator + _key_text(key) + ": " + _float_text(item))
                elif kind is int:
                    add(separator + _key_text(key) + ": " + int.__repr__(item))
                else:
                    text = _scalar_text(item)
                    add(separator + _key_text(key) + ": " + (text or ""))
                    if text is None:
                        self._value(item, depth + 1)
                separator = "," + inner
            add("{}" if separator[0] == "{" else self.newlines[depth] + "}")  # "{}" when every key was dropped
        elif isinstance(value, (list, tuple)):
            if not value:
                add("[]")
                return
            if _PLAIN_SCALARS.issuperset(map(type, value)):
                add(self._flat(value, depth, "[", "]"))
                return
            inner = self._newline(depth + 1)
            separator = "[" + inner
            for item in value:
                text = _scalar_text(item)
                add(separator + (text or ""))
                if text is None:
                    self._value(item, depth + 1)
                separator = "," + inner
            add(self.newlines[depth] + "]")
        else:
            text = _scalar_text(value)
            if text is None:
                raise _NotPlainJson
            add(text)

    def _flat(self, value: Any, depth: int, opening: str, closing: str) -> str:
        """A non-empty container of plain scalars, formatted by the C encoder, one item per line."""
        while len(self.flat_encoders) <= depth:
            inner = self._newline(len(self.flat_encoders) + 1)
            self.flat_encoders.append(_make_c_encoder(  # type: ignore[misc]
                None, _refuse, _quote, None, ": ", "," + inner, False, False, True))
        body = "".join(self.flat_encoders[depth](value, 0))
        return opening + self.newlines[depth + 1] + body[1:-1] + self.newlines[depth] + closing

    def _newline(self, depth: int) -> str:
        while len(self.newlines) <= depth:
            self.newlines.append(self.newlines[-1] + self.step)
        return self.newlines[depth]


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise OutputDirError(f"{path}: could not write: {e.strerror or e}") from e


def _temp_beside(path: Path) -> tuple[int, str]:
    """A temporary file in ``path``'s folder, to be renamed onto ``path`` (OutputDirError if it cannot be made)."""
    try:
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OutputDirError(f"{path}: could not write: {e.strerror or e}") from e


def _discard(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def resolve_inside(root: Path, relative: str) -> Path:
    """Resolve a payload path from a trace JSON, refusing anything outside ``root``.

    Absolute paths, ``..`` components and symbolic links that lead out of the
    trace directory raise ``UnsafePathError``; nothing is opened.
    """
    if not isinstance(relative, str) or not relative:
        raise UnsafePathError(f"{root}: tensor path {relative!r} is not a relative file name")
    candidate = Path(relative)
    if candidate.is_absolute() or relative.startswith(("/", "\\")) or ":" in candidate.parts[0]:
        raise UnsafePathError(f"{root}: tensor path {relative!r} is absolute; refused")
    if any(part == ".." for part in Path(relative.replace("\\", "/")).parts):
        raise UnsafePathError(f"{root}: tensor path {relative!r} leaves the trace directory; refused")
    real_root = root.resolve()
    resolved = (real_root / candidate).resolve()
    if resolved != real_root and real_root not in resolved.parents:
        raise UnsafePathError(f"{root}: tensor path {relative!r} links outside the trace directory; refused")
    return resolved


def read_tensor_file(path: Path, key: str = "data") -> torch.Tensor:
    """Read one tensor from a safetensors file through ``safe_open`` (memory-mapped, no pickle)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
            if key not in keys:
                raise PayloadError(f"{path}: no tensor named {key!r} (found {keys[:5]})")
            return f.get_tensor(key)
    except FileNotFoundError as e:
        raise PayloadError(f"{path}: payload file is missing") from e
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PayloadError(f"{path}: not a readable safetensors file ({first})") from e


def ensure_writable_dir(path: Path) -> None:
    """Create ``path`` if needed and check that files can be made in it."""
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"{path}: is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tracediff-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputDirError(f"{path}: cannot write here ({e.strerror or e})") from e
