"""What keeps a capture's output folder safe: the folder lock, the journal, and overwrite.

* **Lock**: a capture takes its folder by creating ``.tracediff.lock``
  exclusively (``O_CREAT | O_EXCL``) before it checks that the folder is
  empty, so two captures into one folder can never both proceed: the second
  is refused while the first runs, and finds the first's trace afterwards. A
  lock left by a process that no longer runs (same host) counts as an earlier
  trace: refused without ``overwrite``, cleared with it.
* **Overwrite** removes only the files the earlier trace lists: its tree JSON
  files, the payloads they (or its journal) reference inside the folder, its
  metadata, journal and stale lock, and the same inside ``rank{r}/`` folders.
  Anything else (an inputs file, notes) stays.
* **Journal**: while the forward and backward run, one line per call started
  and finished, per op recorded (with its place among its call's children)
  and per backward node that got gradients is appended to
  ``tracediff_journal.jsonl`` (one ``write`` each, no fsync: it survives the
  process, not the machine). When the process is killed before the trace
  JSON is written, readers rebuild the tree from it, marked incomplete. It is
  removed once the trace JSON and metadata are written.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import format as fmt
from ..errors import OutputDirError, TracediffError
from ..files.atomic import check_out_dir
from ..files.confine import JOURNAL_LIMIT, TRACE_JSON_LIMIT, read_json_file

# What json.dumps(entry, separators=(",", ":"), default=str) uses, built once: json.dumps builds a new encoder
# for every line, which costs as much as encoding a small line.
_LINE_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_HELD: dict[Path, FolderClaim] = {}


@dataclass
class FolderClaim:
    """This process's hold on a capture folder, and the earlier trace's files to remove before writing."""

    folder: Path
    stale_files: list[Path] = field(default_factory=list)
    cleared: bool = False
    created: bool = False  # the folder did not exist: removed again if the capture leaves it empty
    released: bool = False
    in_use: bool = False  # a capture is writing with it

    def clear_earlier_trace(self) -> None:
        """Remove the earlier trace's listed files (once), just before the new trace is written."""
        if self.cleared:
            return
        self.cleared = True
        for path in self.stale_files:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                raise OutputDirError(f"{path}: cannot remove the earlier trace's file ({e.strerror or e})") from e
        for folder in sorted({p.parent for p in self.stale_files} - {self.folder}, reverse=True):
            try:
                folder.rmdir()  # a rank folder left empty
            except OSError:
                pass

    def release(self) -> None:
        """Remove the lock (once: a second call must not remove another capture's lock taken since)."""
        if self.released:
            return
        self.released = True
        _HELD.pop(self.folder, None)
        try:
            (self.folder / fmt.LOCK_FILE).unlink()
            if self.created:
                self.folder.rmdir()  # only when empty: the model never ran
        except OSError:
            pass


def held_claim(folder: Path) -> FolderClaim | None:
    """The claim this process took on ``folder`` for a capture not started yet (``tracediff capture`` takes it
    before the model is built); the capture that takes it over marks it ``in_use``."""
    claim = _HELD.get(folder.absolute())
    if claim is None or claim.in_use:
        return None
    claim.in_use = True
    return claim


def claim_folder(folder: Path, *, overwrite: bool) -> FolderClaim:
    """Create ``folder`` if needed and take it: lock first, then check it holds no trace (unless ``overwrite``).

    Raises ``OutputDirError`` (one line naming the folder) when it is a file,
    not writable, locked by a running capture, or not empty without ``overwrite``.
    """
    key = folder.absolute()
    if key in _HELD:
        raise OutputDirError(f"{folder}: another capture in this process is writing into it; "
                             "choose another folder")
    check_out_dir(folder, overwrite=True)  # a file, or no writable parent: the usual one-line refusals
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputDirError(f"{folder}: cannot write here ({e.strerror or e})") from e
    lock = folder / fmt.LOCK_FILE
    stale_lock = _take_lock(lock, folder)
    try:
        claim = FolderClaim(key, created=created)
        others = [entry for entry in folder.iterdir() if entry.name != fmt.LOCK_FILE]
        if (others or stale_lock) and not overwrite:
            why = "holds a trace left by a capture that did not finish" if stale_lock else "is not empty"
            raise OutputDirError(f"{folder}: {why}; refusing to overwrite a trace (use --overwrite)")
        if overwrite:
            claim.stale_files = earlier_trace_files(folder)
    except BaseException:
        lock.unlink(missing_ok=True)
        raise
    _HELD[key] = claim
    return claim


def _take_lock(lock: Path, folder: Path) -> bool:
    """Create the lock file; True when a stale lock (its process gone) was taken over."""
    stale = False
    for _ in range(2):
        try:
            fd = os.open(lock, _NEW, 0o666)
        except FileExistsError:
            owner = _lock_owner(lock)
            if owner is not None:
                raise OutputDirError(f"{folder}: another capture (process {owner}) is writing into it; "
                                     "wait for it or choose another folder") from None
            stale = True
            lock.unlink(missing_ok=True)
            continue
        except OSError as e:
            raise OutputDirError(f"{folder}: cannot write here ({e.strerror or e})") from e
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {socket.gethostname()}\n")
        return stale
    raise OutputDirError(f"{folder}: another capture keeps taking its lock; choose another folder")


def _lock_owner(lock: Path) -> int | None:
    """The pid of the running process holding ``lock``; None when that process is gone (a stale lock)."""
    try:
        pid_text, _, host = lock.read_text(encoding="utf-8", errors="replace")[:200].strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return None  # unreadable or half-written: a process killed while taking it
    if host and host != socket.gethostname():
        return pid  # another machine's process: we cannot tell, so we do not take it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid if pid != os.getpid() else None


def earlier_trace_files(folder: Path) -> list[Path]:
    """The files of the trace in ``folder`` (and its ``rank{r}/`` folders) that overwrite may remove."""
    files: list[Path] = []
    for name in sorted(os.listdir(folder)):
        path = folder / name
        if name.startswith(fmt.RANK_FOLDER_PREFIX) and name[len(fmt.RANK_FOLDER_PREFIX):].isdigit() \
                and path.is_dir() and not path.is_symlink():
            files += earlier_trace_files(path)
        elif name.endswith((fmt.FULL_SUFFIX, fmt.SUMMARY_SUFFIX)) or name == fmt.JOURNAL_FILE:
            files.append(path)
            files += _referenced_payloads(folder, path)
        elif name in (fmt.METADATA_FILE, fmt.LOCK_FILE):
            files.append(path)
    unique = dict.fromkeys(files)
    return list(unique)


def _referenced_payloads(folder: Path, source: Path) -> list[Path]:
    """Payload files referenced by a tree JSON or journal in ``folder`` (references leaving it are ignored)."""
    if not source.is_file() or source.is_symlink():
        return []
    try:
        if source.name == fmt.JOURNAL_FILE:
            text = source.read_bytes()[:JOURNAL_LIMIT].decode("utf-8", "replace")
            docs = []
            for line in text.splitlines():
                try:
                    docs.append(json.loads(line))
                except (ValueError, RecursionError):
                    continue
        else:
            docs = [read_json_file(source, limit=TRACE_JSON_LIMIT, root=folder, error=OutputDirError, what="trace")]
    except (OSError, TracediffError):
        return []  # unreadable: nothing listed, nothing removed beyond the file itself
    found: list[Path] = []
    stack: list[Any] = docs
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            value = item.get(fmt.VALUE)
            if isinstance(value, str) and fmt.is_tensor_entry(item):
                path = _payload_inside(folder, value)
                if path is not None:
                    found.append(path)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _payload_inside(folder: Path, reference: str) -> Path | None:
    name = reference.removeprefix(fmt.PAYLOAD_REFERENCE_PREFIX)
    if not name or "/" in name or "\\" in name or "\0" in name or name in (".", "..") \
            or not name.endswith(fmt.PAYLOAD_SUFFIX):
        return None
    path = folder / name
    return path if path.is_file() or path.is_symlink() else None


class Journal:
    """The append-only record of calls started and finished (see the module docstring).

    A node's line is written once its entries are complete: its payloads on
    disk and its statistics known. Pass ``after_written``, which runs a
    callback then (the capture passes ``Encoder.when_complete``: payload
    writer threads and statistics read back from a device defer it); without
    it the node must already be complete. A journal that cannot be written is
    given up silently: it is a safety net, never a reason to break the user's
    forward.
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / fmt.JOURNAL_FILE
        self._ids: dict[int, int] = {}
        self._next = 0
        try:
            self._fd: int | None = os.open(self.path, _NEW | os.O_APPEND, 0o666)
        except OSError:
            self._fd = None

    def entered(self, node: dict[str, Any], parent: dict[str, Any] | None) -> None:
        if self._fd is None:
            return
        self._ids[id(node)] = self._next
        self._write({fmt.JOURNAL_ENTER: self._next,
                     fmt.JOURNAL_PARENT: self._ids.get(id(parent)) if parent is not None else None,
                     fmt.MODULE_PATH: node.get(fmt.MODULE_PATH), fmt.CALL_INDEX: node.get(fmt.CALL_INDEX),
                     fmt.MODULE_TYPE: node.get(fmt.MODULE_TYPE)})
        self._next += 1

    def finished(self, node: dict[str, Any],
                 after_written: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Record ``node`` as finished, once its payloads are on disk.

        ``after_written`` (an asynchronous payload writer's) defers the line until
        then. The node's keys are taken now, while it is as the call left it;
        the line is encoded when written, so that it holds the statistics the
        writer computed with the payloads.
        """
        if self._fd is None or id(node) not in self._ids:
            return
        body = {key: value for key, value in node.items() if key != fmt.CHILDREN}
        self._append_when_written({fmt.JOURNAL_EXIT: self._ids[id(node)], fmt.JOURNAL_NODE: body}, after_written)

    def op(self, node: dict[str, Any], call: dict[str, Any], at: int,
           after_written: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Record op node ``node``, child ``at`` of ``call``, once its payloads are on disk (as ``finished``)."""
        if self._fd is None or id(call) not in self._ids:
            return
        self._append_when_written(
            {fmt.JOURNAL_OP_IN: self._ids[id(call)], fmt.JOURNAL_AT: at, fmt.JOURNAL_NODE: dict(node)}, after_written)

    def backward(self, node: dict[str, Any], after_written: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Record backward node ``node`` as it is now, once its payloads are on disk (as ``finished``)."""
        if self._fd is not None:
            self._append_when_written({fmt.JOURNAL_BACKWARD: dict(node)}, after_written)

    def _append_when_written(self, entry: dict[str, Any],
                             after_written: Callable[[Callable[[], None]], None] | None) -> None:
        if after_written is None:
            self._write(entry)
        else:
            after_written(lambda: self._write(entry))

    def _write(self, entry: dict[str, Any]) -> None:
        line = self._line(entry)
        if line is not None:
            self._append(line)

    def _line(self, entry: dict[str, Any]) -> bytes | None:
        try:
            return _LINE_ENCODER.encode(entry).encode("utf-8", "backslashreplace") + b"\n"
        except (ValueError, TypeError, RecursionError):
            self.close()
            return None

    def _append(self, line: bytes) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            os.write(fd, line)  # one write per line: O_APPEND keeps lines whole
        except OSError:
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> None:
        """The trace JSON is written: the journal is no longer needed."""
        self.close()
        try:
            self.path.unlink()
        except OSError:
            pass
