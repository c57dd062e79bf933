"""Bounded, confined, regular-file-only reads of the files in a trace or run folder.

Every file tracediff reads from a trace folder or a training record goes
through here: the trace JSON, ``tracediff_metadata.json``, the capture
journal, ``run.json``, step records, rename maps, and (through
:func:`check_regular_file`) safetensors payloads. The promises:

* **confined**: with ``root`` given, the file, after following symbolic links,
  must lie inside ``root`` (itself resolved); a link leading out is refused;
* **regular files only**: the file is opened with ``O_NONBLOCK`` and its type
  checked on the open descriptor, so a FIFO never blocks, and a directory,
  device (``/dev/zero``) or socket is refused before a byte is read;
  a payload is memory-mapped from that same descriptor (:func:`map_regular_file`);
* **bounded**: at most ``limit`` bytes are read; a larger file is refused
  with its size and the limit in the message (the bounds are below, and in
  ``docs/safety.md``);
* **parsed defensively**: JSON nested deeper than Python's recursion limit,
  integers of more than 4,300 digits, invalid UTF-8 and lone surrogates in
  keys become one-line errors of the caller's error class, never tracebacks.
"""

from __future__ import annotations

import json
import mmap
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import TracediffError, TraceFormatError, UnsafePathError

MiB = 1 << 20
GiB = 1 << 30
#: A trace's FULL_TENSORS or SUMMARY JSON file.
TRACE_JSON_LIMIT = 4 * GiB
#: ``tracediff_metadata.json``, ``run.json``, rename maps.
SMALL_JSON_LIMIT = 64 * MiB
#: One step record (``step=K/rankR.json``) of a training run.
STEP_RECORD_LIMIT = 1 * GiB
#: The capture journal of a trace whose process died.
JOURNAL_LIMIT = 4 * GiB

_O_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def confined(path: Path, root: Path | None) -> Path:
    """``path`` with links followed, checked to lie inside ``root`` (``UnsafePathError`` if not)."""
    try:
        resolved = path.resolve(strict=False)
    except (OSError, RuntimeError, ValueError) as e:  # symlink loop, NUL byte
        raise UnsafePathError(f"{path}: cannot resolve the path ({e})") from None
    if root is None:
        return resolved
    real_root = resolved_folder(root)
    if resolved != real_root and real_root not in resolved.parents:
        raise UnsafePathError(f"{path}: links outside {root}; refused")
    return resolved


def _reason(error: OSError | ValueError) -> str:
    """An OS error's own words (``No such file or directory``), or the message of any other error."""
    return error.strerror if isinstance(error, OSError) and error.strerror else str(error)


def _open_regular(path: Path, error: type[TracediffError], what: str, missing: str | None = None,
                  flags: int = _O_FLAGS) -> tuple[int, int]:
    """Open ``path`` without blocking and check it is a regular file; returns ``(fd, size)``."""
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{path}: {missing or what + ' not found'}") from None
    except (OSError, ValueError) as e:
        raise error(f"{path}: cannot open the {what} ({_reason(e)})") from None
    try:
        info = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise error(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise error(f"{path}: the {what} is {_kind(info.st_mode)}, not a regular file; refused")
    return fd, info.st_size


def check_regular_file(path: Path, *, root: Path | None = None, error: type[TracediffError] = TraceFormatError,
                       what: str = "file", missing: str | None = None) -> Path:
    """Check that ``path`` is a regular file inside ``root`` without reading it; return its resolved path.

    Used before handing a payload to ``safe_open``, which memory-maps the file:
    a FIFO would block it and a directory gives an obscure error.
    """
    resolved = confined(path, root)
    fd, _ = _open_regular(resolved, error, what, missing)
    os.close(fd)
    return resolved


def open_regular(path: Path, *, root: Path | None = None, error: type[TracediffError] = TraceFormatError,
                 what: str = "file") -> tuple[int, int]:
    """Open the regular file ``path`` (inside ``root`` when given) for reading; return ``(fd, size)``.

    For readers that take only part of a file (a header, then byte ranges
    copied without reading them into Python): the caller closes ``fd`` and
    bounds what it reads by ``size``. Refusals are those of ``read_bounded``.
    """
    return _open_regular(confined(path, root), error, what)


def map_regular_file(path: Path, *, root: Path | None = None, error: type[TracediffError] = TraceFormatError,
                     what: str = "file", missing: str | None = None, resolved: bool = False) -> mmap.mmap | bytes:
    """The regular file ``path`` (inside ``root`` when given) mapped read-only; ``b""`` when it is empty.

    Opened and checked as ``read_bounded`` does, then mapped from the same
    descriptor, so nothing can swap the file between the check and the map.
    Nothing is read until the caller touches the bytes. ``resolved=True`` says
    ``path`` comes from ``resolve_inside``: it is not resolved again, and a link put in its place since is
    refused (``O_NOFOLLOW``).
    """
    if resolved:
        fd, size = _open_regular(path, error, what, missing, _O_FLAGS | _NOFOLLOW)
    else:
        path = confined(path, root)
        fd, size = _open_regular(path, error, what, missing)
    try:
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else b""
    except MemoryError:
        raise error(f"{path}: not enough memory to map the {what}") from None
    except (OSError, ValueError) as e:
        raise error(f"{path}: cannot map the {what} ({_reason(e)})") from None
    finally:
        os.close(fd)


def read_bounded(path: Path, *, limit: int, root: Path | None = None,
                 error: type[TracediffError] = TraceFormatError, what: str = "file") -> bytes:
    """The bytes of the regular file ``path`` (inside ``root`` when given), at most ``limit`` of them.

    Raises ``error`` (or ``UnsafePathError`` for a link out of ``root``) with
    one line naming the file: missing, not a regular file, larger than
    ``limit``, or unreadable.
    """
    resolved = confined(path, root)
    fd, size = _open_regular(resolved, error, what)
    try:
        if size > limit:
            raise error(f"{path}: the {what} is {size:,} bytes, over the limit of {limit:,}; refused")
        chunks, total = [], 0
        while total <= limit:
            # the whole file in one read when its size is known (no copies to join); small steps otherwise
            chunk = os.read(fd, min(limit + 1 - total, size - total + 1 if size > total else MiB))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise error(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    finally:
        os.close(fd)
    if total > limit:  # the file grew while we read it
        raise error(f"{path}: the {what} is over the limit of {limit:,} bytes; refused")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def parse_json(data: bytes | str, *, path: Path, error: type[TracediffError] = TraceFormatError,
               what: str = "file") -> Any:
    """Parse JSON text read from ``path``; every failure is one line of ``error``."""
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise error(f"{path}: invalid JSON at line {e.lineno} column {e.colno} ({e.msg}); "
                    "the file may be truncated") from None
    except UnicodeDecodeError:
        raise error(_not_utf8(path, what)) from None
    except RecursionError:
        raise error(f"{path}: the {what} nests JSON too deeply to be read; refused") from None
    except ValueError as e:  # e.g. an integer of more than 4,300 digits
        raise error(f"{path}: the {what} holds a value that cannot be read ({str(e).splitlines()[0]})") from None
    except MemoryError:
        raise error(f"{path}: not enough memory to read the {what}") from None


def _not_utf8(path: Path, what: str) -> str:
    return f"{path}: not UTF-8 text, so not {'a trace JSON' if what == 'trace JSON' else 'a JSON ' + what}"


def read_json_file(path: Path, *, limit: int = SMALL_JSON_LIMIT, root: Path | None = None,
                   error: type[TracediffError] = TraceFormatError, what: str = "file") -> Any:
    """``read_bounded`` then ``parse_json``: a JSON file from a trace or run folder, defensively.

    The bytes are decoded and dropped before parsing, so that a large file is
    held once as text while its objects are built, not also as bytes.
    """
    data = read_bounded(path, limit=limit, root=root, error=error, what=what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(_not_utf8(path, what)) from None
    del data
    return parse_json(text, path=path, error=error, what=what)


def resolve_inside(root: Path, relative: str, *, what: str = "tensor path", real_root: Path | None = None) -> Path:
    """Resolve a payload path from a trace JSON, refusing anything outside ``root``.

    Absolute paths, ``..`` components, NUL bytes, lone surrogates, symbolic
    link loops, the folder itself and links that lead out of it raise ``UnsafePathError``; nothing is opened.
    ``real_root`` is ``root`` already resolved, for a caller that resolves many names in one folder
    (a link's target is resolved each time).
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
        real_root = real_root or root.resolve()
        resolved = _resolved_child(real_root, candidate)
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


def resolved_folder(root: Path) -> Path:
    """``root`` resolved, for ``resolve_inside(..., real_root=)`` (``UnsafePathError`` when it cannot be)."""
    try:
        return root.resolve()
    except (OSError, RuntimeError, ValueError) as e:
        raise UnsafePathError(f"{root}: cannot resolve the folder ({e})") from None


def _resolved_child(real_root: Path, candidate: Path) -> Path:
    """``(real_root / candidate).resolve()``; a plain file right in the folder costs one ``lstat``, not a walk.

    A name without ``/`` in a resolved folder resolves to itself unless it is a link (``.`` and ``..``
    were refused before).
    """
    if len(candidate.parts) == 1:
        path = real_root / candidate
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return path
        except OSError:
            pass  # missing or unreadable: resolve() says what it says of such a name
    return (real_root / candidate).resolve()
