"""Safe, atomic file I/O shared by capture, reading and training records.

Payloads are single-tensor safetensors files holding the key ``data``, the
layout transformers' debugger writes. We write them ourselves (header plus one
copy of the bytes) because ``safetensors.torch.save_file`` serializes into an
intermediate buffer first, and capture runs inside every module call. The
bytes are identical to what ``save_file`` writes.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._json_text import json_text, json_text_pair
from .errors import OutputDirError, PayloadError, UnsafePathError
from .format import PAYLOAD_KEY

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
    fd, tmp = _temp_beside(Path(path), what="payload")
    try:
        try:
            _write_all(fd, [len(header).to_bytes(8, "little") + header, data])
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise OutputDirError(f"{path}: could not write payload: {e.strerror or e}") from e
    return data.nbytes


# Created exclusively (never an existing file, never through a planted symbolic link), with mode 0666 less the
# umask: the permissions a plain open() gives, so a trace folder shared with a group stays readable by it.
_NEW_FILE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
                   | getattr(os, "O_CLOEXEC", 0))


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


def write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, drop_key: str | None = None,
               user_target: bool = False) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file and a rename.

    The text is exactly ``json.dumps(obj, indent=indent)`` (see ``json_text``
    for ``drop_key``); it is built in full before the file is created, so an
    object that cannot be serialized leaves nothing behind. The file gets mode
    0666 less the umask. ``user_target=True`` for a file the user named (see
    ``_write_text_atomically``).
    """
    _write_text_atomically(Path(path), json_text(obj, indent=indent, drop_key=drop_key).encode("utf-8"),
                           user_target=user_target)


def _write_text_atomically(path: Path, data: bytes, *, user_target: bool = False) -> None:
    """Write ``data`` to ``path`` through an exclusive temporary file and a rename.

    ``user_target=True`` (a file named by the user, ``-o FILE``) follows a
    symbolic link, keeps an existing file's mode and writes a FIFO or device in
    place (see ``tracediff._output_target``); otherwise (files inside a trace
    folder) ``path`` itself is replaced, a planted link included.
    """
    if user_target:
        from ._output_target import write_output

        write_output(path, data)
        return
    replace_with(path, data)


def replace_with(path: Path, data: bytes, *, mode: int | None = None, name: Path | None = None) -> None:
    """Write ``data`` to an exclusive temporary file beside ``path`` (with ``mode``), then rename it onto ``path``.

    ``OutputDirError`` names ``name`` (default ``path``): the file the user asked for, when ``path`` is a link's target.
    """
    fd, tmp = _temp_beside(path)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            _write_all(fd, [data])
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise OutputDirError(f"{name or path}: could not write: {e.strerror or e}") from e


def write_json_pair(path: str | os.PathLike[str], stripped_path: str | os.PathLike[str], obj: Any, *,
                    drop_key: str, indent: int | None = 2,
                    drop_where: Callable[[dict[Any, Any]], bool] | None = None) -> None:
    """Write ``obj`` to ``path``, and ``obj`` without its ``drop_key`` items to ``stripped_path``.

    ``drop_where`` limits the dropping to the dicts it is true for (see
    ``json_text``). Both through a temporary file and a rename, as
    ``write_json``; both texts are built before either file is made. When no
    dict in ``obj`` has the key, the text is built once and written twice (a
    trace's FULL_TENSORS and SUMMARY files are the same text when no payload
    is written).
    """
    text, stripped = json_text_pair(obj, indent=indent, drop_key=drop_key, drop_where=drop_where)
    _write_text_atomically(Path(path), text.encode("utf-8"))
    _write_text_atomically(Path(stripped_path), stripped.encode("utf-8"))


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` as UTF-8 to the user's output file ``path`` (see ``tracediff._output_target``).

    Lone surrogates (from crafted module names) are written as ``\\udcNN`` escapes instead of failing.
    """
    _write_text_atomically(Path(path), text.encode("utf-8", "backslashreplace"), user_target=True)


def _temp_beside(path: Path, what: str = "file") -> tuple[int, str]:
    """A new temporary file in ``path``'s folder, to be renamed onto ``path`` (OutputDirError if it cannot be made).

    Its name is unpredictable and it is created exclusively without following
    links, so nothing planted beforehand can redirect the write.
    """
    for _ in range(100):
        tmp = os.path.join(path.parent, f".{path.name[:200]}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, _NEW_FILE_FLAGS, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as e:
            label = "" if what == "file" else f" {what}"
            raise OutputDirError(f"{path}: could not write{label}: {e.strerror or e}") from e
    raise OutputDirError(f"{path}: could not create a temporary file beside it")


def _discard(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def resolve_inside(root: Path, relative: str, *, what: str = "tensor path") -> Path:
    """Resolve a payload path from a trace JSON, refusing anything outside ``root``.

    Absolute paths, ``..`` components, NUL bytes, lone surrogates, symbolic
    link loops, the folder itself and links that lead out of it raise ``UnsafePathError``; nothing is opened.
    """
    place = "the trace directory" if what == "tensor path" else "the folder"
    if not isinstance(relative, str) or not relative:
        raise UnsafePathError(f"{root}: {what} {relative!r} is not a relative file name")
    if "\0" in relative or not _encodable(relative):
        raise UnsafePathError(f"{root}: {what} {ascii(relative)} holds a NUL byte or an unencodable "
                              "character; refused")
    candidate = Path(relative)
    if not candidate.parts:
        raise UnsafePathError(f"{root}: {what} {relative!r} names {place} itself, not a file")
    if candidate.is_absolute() or relative.startswith(("/", "\\")) or ":" in candidate.parts[0]:
        raise UnsafePathError(f"{root}: {what} {relative!r} is absolute; refused")
    if any(part == ".." for part in Path(relative.replace("\\", "/")).parts):
        raise UnsafePathError(f"{root}: {what} {relative!r} leaves {place}; refused")
    try:
        real_root = root.resolve()
        resolved = (real_root / candidate).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symbolic link loop
        raise UnsafePathError(f"{root}: {what} {relative!r} cannot be resolved ({e}); refused") from None
    if resolved == real_root:
        raise UnsafePathError(f"{root}: {what} {relative!r} names {place} itself, not a file")
    if real_root not in resolved.parents:
        raise UnsafePathError(f"{root}: {what} {relative!r} links outside {place}; refused")
    return resolved


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from JSON's \udXXX escapes
        return False
    return True


def read_tensor_file(path: Path, key: str = PAYLOAD_KEY) -> torch.Tensor:
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
    except MemoryError:
        raise PayloadError(f"{path}: not enough memory to map the payload") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PayloadError(f"{path}: not a readable safetensors file ({first})") from e


def check_out_dir(out_dir: Path, *, overwrite: bool) -> None:
    """Refuse an ``out_dir`` that is a file, or that is not empty unless ``overwrite``; change nothing."""
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputDirError(f"{out_dir}: is a file, not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise OutputDirError(f"{out_dir}: is not empty; refusing to overwrite a trace (use --overwrite)")
    existing = next((p for p in [out_dir, *out_dir.absolute().parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputDirError(f"{out_dir}: cannot write here ({existing} is not a writable directory)")


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
