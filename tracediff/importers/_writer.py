"""Writing an imported dump as a trace: payloads, the two tree files and the metadata, into a staging folder
that is renamed into place at the end, so that a failed import leaves nothing behind.

Names, entries, the tree files and the metadata are written through the stage a capture writes through too
(:class:`tracediff.files.trace_writing.TraceStage`); what is the importer's own is where payload bytes come
from. A tensor whose bytes lie
in the dump file as they are (``.npy``, ``.safetensors``) is copied by the
kernel (:func:`copy_range`: ``sendfile``, no pass through Python), so an
import runs at about the speed of a plain copy.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import format as fmt
from ..errors import DumpFormatError, OutputDirError
from ..files.atomic import check_out_dir
from ..files.confine import open_regular
from ..files.payloads import write_tensor_file
from ..files.trace_writing import TraceStage
from ._files import Tensor

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class TraceWriter(TraceStage):
    """Payloads and entries of one trace being written into ``folder`` (a fresh staging folder).

    ``framework`` is what the dump's values were computed with, when the dump says (``"onnxruntime"``); it
    becomes the metadata's ``framework``.
    """

    def __init__(self, folder: Path, root: Path) -> None:
        super().__init__(folder)
        self.root = root  # the dump folder: every source file is opened confined to it
        self.framework: str | None = None

    def entry(self, tensor: Tensor, name: str) -> dict[str, Any]:
        """Write ``tensor``'s payload under ``name`` (a payload name of the format) and return its tensor entry."""
        file_name = self.payload_file(name)
        target = self.folder / file_name
        if tensor.value is not None:
            written = write_tensor_file(target, tensor.value)
        else:
            written = self._copy(tensor, target)
        self.written(written)
        return self.stats_entry(tensor.shape, tensor.dtype, {"numel": _numel(tensor.shape)},
                                value=fmt.payload_reference(file_name))

    def stats_entry(self, shape: tuple[int, ...], dtype: str, stats: Mapping[str, Any],
                    value: str | None = None) -> dict[str, Any]:
        """A tensor entry without a payload (a statistics-only record), or with ``value`` when given."""
        return self.tensor_entry(shape, dtype, value, stats=dict(stats))

    def _copy(self, tensor: Tensor, target: Path) -> int:
        header = fmt.payload_header(tensor.code, tensor.shape, tensor.nbytes)
        source, size = open_regular(tensor.path, root=self.root, error=DumpFormatError, what="tensor file")
        try:
            if tensor.offset is None or tensor.offset + tensor.nbytes > size:
                raise DumpFormatError(f"{tensor.path}: shorter than its header says (changed while importing?)")
            out = os.open(target, _NEW, 0o666)
            try:
                os.write(out, header)
                copy_range(source, out, tensor.offset, tensor.nbytes, tensor.path)
            finally:
                os.close(out)
        except OSError as e:
            raise OutputDirError(f"{target}: could not write payload: {e.strerror or e}") from None
        finally:
            os.close(source)
        return tensor.nbytes

    def finish(self, tree: dict[str, Any], model_name: str, importer: Mapping[str, Any], calls: int) -> None:
        """Write the FULL_TENSORS and SUMMARY files and the metadata of the trace."""
        self.write_tree(tree, model_name)
        self.write_metadata(self.metadata({
            "model_name": model_name, "world_size": 1, "rank": 0,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "options": {fmt.IMPORTER_OPTION: dict(importer)}, fmt.COMPLETE_KEY: True, "calls": calls,
        }, framework=self.framework))


def copy_range(source: int, target: int, offset: int, count: int, path: Path) -> None:
    """Append ``count`` bytes of ``source`` from ``offset`` to ``target``: in the kernel where it can
    (``sendfile`` between two files, Linux), else through a bounded buffer.

    ``copy_file_range`` was measured too: no faster here, and slower in some runs
    (``bench/README.md``, "Import speed").
    """
    done = 0
    use_kernel = hasattr(os, "sendfile")
    while done < count:
        step = min(count - done, 1 << 30)
        if use_kernel:
            try:
                n = os.sendfile(target, source, offset + done, step)
            except OSError:  # a system whose sendfile needs a socket: copy through a buffer
                use_kernel = False
                continue
        else:
            data = os.pread(source, min(step, 64 << 20), offset + done)
            n = os.write(target, data) if data else 0
        if n <= 0:
            raise DumpFormatError(f"{path}: ended {count - done:,} bytes early (changed while importing?)")
        done += n


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@contextmanager
def staged_trace(out: Path, source: Path, *, overwrite: bool) -> Iterator[Path]:
    """A fresh folder beside ``out`` to write the trace into, renamed onto ``out`` when the block succeeds.

    ``out`` must not exist, be empty, or (with ``overwrite``) hold only the
    files of a trace; it must not lie inside ``source``. On an error the
    staging folder is removed and ``out`` is left as it was.
    """
    real_out, real_source = out.resolve(), source.resolve()
    if real_out == real_source or real_source in real_out.parents:
        raise OutputDirError(f"{out}: inside the dump folder {source}; nothing is written there, choose another "
                             "folder for --out")
    check_out_dir(out, overwrite=overwrite)
    if out.is_dir() and overwrite:
        foreign = sorted(p.name for p in out.iterdir() if not fmt.is_trace_file(p.name))
        if foreign:
            raise OutputDirError(f"{out}: holds files that are not part of a trace ({', '.join(foreign[:3])}); "
                                 "refusing to replace it")
    parent = out.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = parent / f".{out.name}.{os.urandom(6).hex()}.importing"
        staging.mkdir()
    except OSError as e:
        raise OutputDirError(f"{out}: cannot write here ({e.strerror or e})") from None
    try:
        yield staging
        _install(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _install(staging: Path, out: Path) -> None:
    old = None
    try:
        if out.is_dir():
            if any(out.iterdir()):
                old = out.parent / f".{out.name}.{os.urandom(6).hex()}.replaced"
                os.rename(out, old)
            else:
                out.rmdir()
        os.rename(staging, out)
    except OSError as e:
        if old is not None and not out.exists():
            os.rename(old, out)
        raise OutputDirError(f"{out}: could not move the imported trace into place ({e.strerror or e})") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
