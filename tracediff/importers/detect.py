"""Which kind of dump a folder holds, when the evidence says so unambiguously.

* ``msprobe``: one ``dump.json`` in the folder or up to three levels below
  it (``step0/rank0/dump.json``); several are refused (name one folder);
* ``polygraphy``: a Polygraphy RunResults JSON file (``polygraphy run
  --save-outputs``), or a folder holding one and no tensor files;
* ``tensors``: tensor files (``.npy``, ``.npz``, ``.safetensors``, ``.pt``,
  ``.pth``), except in a folder that holds tracediff's own files (metadata,
  journal, lock) or only ``.safetensors`` files at its top: that is a trace
  whose JSON is missing, and the trace reader's message says so.

A folder whose entries are traces (``rank{r}/`` folders of a multi-process
capture, or any trace JSON or tracediff file below the top) is never a dump:
its files are traces, and reading them as loose tensors would compare
nothing that pairs; ``align`` reads a multi-rank folder (``rank{r}/`` traces and
``tracediff_ranks.json``) as one sharded trace.
"""

from __future__ import annotations

from pathlib import Path

from .. import format as fmt
from ..errors import DumpFormatError
from ._files import TENSOR_SUFFIXES, walk

#: The kinds ``import_dump`` reads.
KINDS = ("tensors", "msprobe", "polygraphy")
MSPROBE_FILE = "dump.json"


def msprobe_dumps(folder: Path) -> list[Path]:
    """The ``dump.json`` files in ``folder`` or below it (three levels at most), the nearest level's, sorted."""
    found: list[Path] = []
    for pattern in (MSPROBE_FILE, f"*/{MSPROBE_FILE}", f"*/*/{MSPROBE_FILE}", f"*/*/*/{MSPROBE_FILE}"):
        found.extend(sorted(folder.glob(pattern)))
        if found:
            break
    return found


def one_msprobe_dump(folder: Path) -> Path:
    """The single ``dump.json`` of ``folder`` (``DumpFormatError`` for none or several)."""
    found = msprobe_dumps(folder)
    if not found:
        raise DumpFormatError(f"{folder}: no {MSPROBE_FILE} here or up to three folders below; not an msprobe dump")
    if len(found) > 1:
        shown = ", ".join(str(p.parent.relative_to(folder)) for p in found[:4])
        more = ", ..." if len(found) > 4 else ""
        raise DumpFormatError(f"{folder}: holds {len(found)} msprobe dumps ({shown}{more}); pass the folder of one")
    return found[0]


def detect_kind(path: str | Path) -> str | None:
    """The kind of dump at ``path`` (``"msprobe"``, ``"polygraphy"``, ``"tensors"``), or None when it is not a dump
    tracediff reads (a trace, say).

    Raises ``DumpFormatError`` when the folder holds several msprobe dumps.
    """
    from .polygraphy import looks_like_run_results

    folder = Path(path)
    if not folder.is_dir():
        return "polygraphy" if looks_like_run_results(folder, folder.parent) else None
    if msprobe_dumps(folder):
        one_msprobe_dump(folder)
        return "msprobe"
    if any((folder / name).exists() for name in (fmt.METADATA_FILE, fmt.JOURNAL_FILE, fmt.LOCK_FILE)):
        return None
    names = [rel for _, rel in walk(folder)]
    if any(_is_trace_file(rel.rpartition("/")[2]) for rel in names):
        return None  # a trace, or a folder of traces (rank folders): never loose tensors
    tensor_files = [rel for rel in names if rel.lower().endswith(TENSOR_SUFFIXES)]
    if not tensor_files:
        found = [p for p in folder.glob("*.json") if looks_like_run_results(p, folder)]
        return "polygraphy" if len(found) == 1 else None
    if all("/" not in rel and rel.endswith(fmt.PAYLOAD_SUFFIX) for rel in tensor_files):
        return None  # a trace's payloads without its JSON
    return "tensors"


def _is_trace_file(name: str) -> bool:
    """A trace's JSON tree or one of tracediff's own files, at any depth."""
    return name.endswith((fmt.FULL_SUFFIX, fmt.SUMMARY_SUFFIX)) or name in (fmt.METADATA_FILE, fmt.JOURNAL_FILE,
                                                                             fmt.LOCK_FILE)
