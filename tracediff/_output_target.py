"""Writing one output file (a report, a map, a trace JSON) without surprising the user.

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

import os
import stat
from pathlib import Path

from .errors import OutputDirError


def write_output(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as described in the module docstring; ``OutputDirError`` names the file."""
    from ._io import replace_with

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
            from ._io import _write_all

            _write_all(fd, [data])
        finally:
            os.close(fd)
    except OSError as e:
        raise OutputDirError(f"{path}: could not write: {e.strerror or e}") from e
