"""Reading the dumps other tools write: ``tracediff.importers.import_dump``.

Porting between engines often leaves two dumps in two formats. An importer
turns one into a standard trace (the format of ``docs/trace-format.md``,
payloads as safetensors), which ``tracediff align`` and ``show`` then read
like a capture::

    from tracediff.importers import import_dump

    result = import_dump("tensors", "dumps/reference", out="traces/reference")
    print(result.calls, result.order)         # calls written, and what ordered them
    import_dump("msprobe", "msprobe_dump/step0", out="traces/port")

Kinds (``KINDS``):

* ``tensors``: a folder (nested or flat) of ``.npy``, ``.npz``,
  ``.safetensors`` and ``.pt``/``.pth`` files, one tensor or a dict of
  tensors per file; file names give module paths, calls and slots
  (:mod:`tracediff.importers.names`), ``pattern=`` says how when the
  default reading does not fit;
* ``msprobe``: a dump of Ascend's msprobe (``dump.json``, with one ``.pt``
  or ``.npy`` per tensor, or statistics only), forward and backward, module
  and API records (:mod:`tracediff.importers.msprobe`);
* ``polygraphy``: the per-layer outputs NVIDIA's Polygraphy saves from ONNX
  Runtime or TensorRT (``polygraphy run --onnx-outputs mark all
  --save-outputs``), one op node per ONNX node output, in module scopes
  (:mod:`tracediff.importers.polygraphy`).

The rules of every reader of tracediff hold: files are read confined to the
dump folder (a link out of it is refused), regular files only, with bounded
reads; nothing is unpickled (``.pt`` only through
``torch.load(weights_only=True)``); anything malformed raises
``DumpFormatError`` naming the file; nothing is written into the dump
folder; the trace is written into a staging folder renamed onto ``out``, so
a failed import leaves nothing behind.

:func:`opened` lets a command take a dump where it takes a trace: a folder
that is not a trace and whose kind :func:`detect_kind` recognises
unambiguously is imported into a temporary folder for the time of the block.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..display import short_repr, summary_html
from ..errors import DumpFormatError, TraceFormatError, UsageError
from .detect import KINDS, detect_kind

__all__ = ["import_dump", "ImportResult", "KINDS", "detect_kind", "opened", "Opened"]

#: The root module's name in an imported trace (a dump does not record the model's class).
DEFAULT_MODEL_NAME = "Model"


@dataclass(frozen=True)
class ImportResult:
    """What ``import_dump`` wrote. ``order`` says which evidence put the calls in execution order."""

    kind: str
    source: Path
    out: Path
    calls: int
    tensors: int
    payload_files: int
    payload_bytes: int
    seconds: float
    order: str
    notes: tuple[str, ...] = ()

    @property
    def gb_per_second(self) -> float:
        """Payload bytes written per second (10^9 bytes)."""
        return self.payload_bytes / 1e9 / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "source": str(self.source), "out": str(self.out), "notes": list(self.notes)}

    def __repr__(self) -> str:
        return short_repr(self, kind=self.kind, source=str(self.source), out=str(self.out), calls=self.calls,
                          tensors=self.tensors)

    def _repr_html_(self) -> str:
        facts = [("kind", self.kind), ("source", self.source), ("trace written", self.out), ("calls", self.calls),
                 ("tensors", self.tensors), ("payload bytes", f"{self.payload_bytes:,}"),
                 ("seconds", f"{self.seconds:.2f}"), ("calls ordered by", self.order),
                 *(("note", note) for note in self.notes)]
        return summary_html("ImportResult", facts)


def import_dump(kind: str, src: str | Path, *, out: str | Path, pattern: str | None = None,
                model_name: str = DEFAULT_MODEL_NAME, overwrite: bool = False) -> ImportResult:
    """Write the dump ``src`` of ``kind`` as a trace into the folder ``out``.

    Args:
        kind: ``"tensors"``, ``"msprobe"`` or ``"polygraphy"`` (``KINDS``);
            ``detect_kind(src)`` tells which a folder is.
        src: the dump folder (for ``polygraphy``, also the JSON file). Nothing is written into it.
        out: the trace folder to write; it must not exist or be empty, or, with
            ``overwrite``, hold only a trace's files. It must not lie inside ``src``.
        pattern: ``tensors`` only: how names map to module path, call and slot,
            e.g. ``"{order}_{module}.{io}"`` (see :mod:`tracediff.importers.names`).
            Default: read from the names as documented there.
        model_name: the root module's name in the trace (default ``"Model"``).
        overwrite: replace a trace already in ``out`` (default False).

    Raises:
        DumpFormatError: ``src`` is not a dump of ``kind``, or a file of it is
            malformed; the message names the file.
        UnsafePathError: a link in ``src`` leads out of it.
        OutputDirError: ``out`` holds other files, lies inside ``src``, or cannot be written.
        UsageError: an unknown ``kind``, a bad ``pattern``, or ``pattern`` with ``msprobe``.
    """
    from ._writer import TraceWriter, staged_trace

    if kind not in KINDS:
        raise UsageError(f"unknown dump kind {kind!r}; the kinds are {', '.join(KINDS)}")
    if pattern is not None and kind != "tensors":
        raise UsageError(f"pattern= applies to the tensors kind only, not to {kind}")
    source, target = Path(src), Path(out)
    if not source.is_dir() and not (kind == "polygraphy" and source.is_file()):
        raise DumpFormatError(f"{source}: {'not a folder' if source.exists() else 'no such folder'}; a dump is a "
                              "folder (for one tensor file, put it in a folder of its own)")
    started = time.perf_counter()
    with staged_trace(target, source, overwrite=overwrite) as staging:
        writer = TraceWriter(staging, (source if source.is_dir() else source.parent).resolve())
        if kind == "tensors":
            from .tensors import import_tensors

            built = import_tensors(source, writer, model_name=model_name, pattern=pattern)
        elif kind == "msprobe":
            from .msprobe import import_msprobe

            built = import_msprobe(source, writer, model_name=model_name)
        else:
            from .polygraphy import import_polygraphy

            built = import_polygraphy(source, writer, model_name=model_name)
        settings = {"kind": kind, "source": str(source), "order": built.order}
        if pattern is not None:
            settings["pattern"] = pattern
        writer.finish(built.tree, model_name, settings, built.calls)
    return ImportResult(kind=kind, source=source, out=target, calls=built.calls, tensors=built.tensors,
                        payload_files=writer.files, payload_bytes=writer.payload_bytes,
                        seconds=time.perf_counter() - started, order=built.order, notes=built.notes)


@dataclass(frozen=True)
class Opened:
    """A path to read as a trace: the path given, or a temporary trace imported from it (``imported`` set)."""

    given: str
    trace: str
    imported: ImportResult | None = None


@contextmanager
def opened(path: str | Path) -> Iterator[Opened]:
    """``path`` as a trace for the time of the block: a trace as it is, a recognised dump imported.

    A dump is imported into a temporary folder (removed at the end of the
    block) when ``path`` is a folder that holds no trace and
    :func:`detect_kind` recognises one kind there. Otherwise the trace
    reader's own error stands, and for a folder holding several dumps the
    ``DumpFormatError`` of :func:`detect_kind`.
    """
    from ..trace.load import find_trace_json, is_trace_folder

    if is_trace_folder(path):  # a multi-rank folder is read by align as one sharded trace
        yield Opened(str(path), str(path))
        return
    kind = detect_kind(path) if Path(path).is_file() else None  # a Polygraphy JSON, or a trace JSON (None)
    if kind is None:
        try:
            find_trace_json(path)
        except TraceFormatError:
            kind = detect_kind(path)
            if kind is None:
                raise
        else:
            yield Opened(str(path), str(path))
            return
    folder = Path(tempfile.mkdtemp(prefix="tracediff-import-"))
    try:
        result = import_dump(kind, path, out=folder / "trace")
        yield Opened(str(path), str(result.out), result)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
