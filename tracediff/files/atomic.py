"""Every file tracediff writes: through an exclusive temporary file and a rename, never half-written.

Trace files (tree JSON, metadata, payloads through :mod:`tracediff.files.payloads`)
are written through a temporary file created exclusively beside the target
(unpredictable name, ``O_EXCL | O_NOFOLLOW``), then renamed onto it: a reader
never sees a partial file, and nothing planted beforehand can redirect the
write.

A file the user names (``-o report.html``, a suggested map) is written by
:func:`write_output`, without surprising the user:

* a regular file, or a new name: the text goes to an exclusively created
  temporary file beside it, renamed onto it; an existing file keeps its
  permission bits, a new one gets 0666 less the umask (what ``open()`` gives);
* a symbolic link: its target is written, the same way (the link stays);
* something that is not a regular file (a FIFO, ``/dev/null``,
  ``/dev/stdout``, a terminal): written in place, as a shell redirection would,
  never replaced by a regular file;
* a directory: refused with ``OutputDirError``.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import OutputDirError
from .json_text import json_text, json_text_pair


def write_output(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as described in the module docstring; ``OutputDirError`` names the file."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else path
    try:
        info: os.stat_result | None = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        info = None
    except OSError as e:
        raise OutputDirError(f"{path}: could not write: {e.strerror or e}") from e
    except ValueError as e:  # a NUL byte in the name
        raise OutputDirError(f"{path}: could not write: {e}") from e
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise OutputDirError(f"{path}: is a directory; give a file name")
    if info is not None and not stat.S_ISREG(info.st_mode):
        _write_in_place(path, target, data)
        return
    replace_with(target, data, mode=stat.S_IMODE(info.st_mode) if info is not None else None, name=path)


def _write_in_place(path: Path, target: Path, data: bytes) -> None:
    try:
        fd = os.open(target, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            _write_all(fd, [data])
        finally:
            os.close(fd)
    except OSError as e:
        raise OutputDirError(f"{path}: could not write: {e.strerror or e}") from e


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
    place (see ``tracediff.files.atomic``); otherwise (files inside a trace
    folder) ``path`` itself is replaced, a planted link included.
    """
    if user_target:
        write_output(path, data)
        return
    replace_with(path, data)


def replace_with(path: Path, data: bytes | list[bytes | memoryview], *, mode: int | None = None,
                 name: Path | None = None, what: str = "file") -> None:
    """Write ``data`` (bytes, or chunks written in order) to an exclusive temporary file beside ``path`` (with
    ``mode``), then rename it onto ``path``.

    ``OutputDirError`` names ``name`` (default ``path``): the file the user asked for, when ``path`` is a link's
    target; ``what`` says what it is (``"payload"``) when it is not a plain file.
    """
    fd, tmp = _temp_beside(path, what=what)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)
            _write_all(fd, data if isinstance(data, list) else [data])
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        label = "" if what == "file" else f" {what}"
        raise OutputDirError(f"{name or path}: could not write{label}: {e.strerror or e}") from e


def write_json_pair(path: str | os.PathLike[str], stripped_path: str | os.PathLike[str], obj: Any, *,
                    drop_key: str, indent: int | None = 2,
                    drop_where: Callable[[dict[Any, Any]], bool] | None = None,
                    repeated: Callable[[dict[Any, Any]], bool] | None = None) -> None:
    """Write ``obj`` to ``path``, and ``obj`` without its ``drop_key`` items to ``stripped_path``.

    ``drop_where`` limits the dropping to the dicts it is true for (see
    ``json_text``). Both through a temporary file and a rename, as
    ``write_json``; both texts are built before either file is made. When no
    dict in ``obj`` has the key, the text is built once and written twice (a
    trace's FULL_TENSORS and SUMMARY files are the same text when no payload
    is written).
    """
    text, stripped = json_text_pair(obj, indent=indent, drop_key=drop_key, drop_where=drop_where,
                                    repeated=repeated)
    _write_text_atomically(Path(path), text.encode("utf-8"))
    _write_text_atomically(Path(stripped_path), stripped.encode("utf-8"))


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` as UTF-8 to the user's output file ``path`` (see ``tracediff.files.atomic``).

    Lone surrogates (from crafted module names) are written as ``\\udcNN`` escapes instead of failing.
    """
    _write_text_atomically(Path(path), text.encode("utf-8", "backslashreplace"), user_target=True)


def _temp_beside(path: Path, what: str = "file") -> tuple[int, str]:
    """A new temporary file in ``path``'s folder, to be renamed onto ``path`` (OutputDirError if it cannot be made).

    Its name is unpredictable and it is created exclusively without following
    links, so nothing planted beforehand can redirect the write.
    """
    for _ in range(100):
        tmp = os.path.join(path.parent, f".{path.name[:200]}.{os.urandom(8).hex()}.tmp")
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


def check_out_dir(out_dir: Path, *, overwrite: bool) -> None:
    """Refuse an ``out_dir`` that is a file, or that is not empty unless ``overwrite``; change nothing."""
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputDirError(f"{out_dir}: is a file, not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise OutputDirError(f"{out_dir}: is not empty; refusing to overwrite a trace (use --overwrite)")
    existing = next((p for p in [out_dir, *out_dir.absolute().parents] if p.exists()), None)
    if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise OutputDirError(f"{out_dir}: cannot write here ({existing} is not a writable directory)")
