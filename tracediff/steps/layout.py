"""The folder of a training record, written by the recorder and read by the comparison.

::

    out_dir/
      run.json              once per run (rank 0): versions, options, names, environment
      step=0/rank0.json     one record per scheduled step and per rank
      step=0/rank1.json
      step=10/rank0.json

``run.json`` holds ``"format": "tracediff-steps"`` and ``format_version``; a
folder without it is not a run. Records are found by listing ``step={k}``
folders, never through paths written in a JSON file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import OutputDirError, TraceFormatError
from ..files.atomic import ensure_writable_dir
from ..files.confine import SMALL_JSON_LIMIT, STEP_RECORD_LIMIT, read_bounded, resolve_inside

RUN_FILE = "run.json"
RUN_FORMAT = "tracediff-steps"
# 2: typed values hold their value under "py_value", as in traces (1 wrote "value"; still read).
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
_STEP_DIR = re.compile(r"step=(\d+)")
_RANK_FILE = re.compile(r"rank(\d+)\.json")


def record_path(root: Path, step: int, rank: int) -> Path:
    return root / f"step={step}" / f"rank{rank}.json"


def _rank_records(root: Path) -> dict[tuple[int, int], Path]:
    found: dict[tuple[int, int], Path] = {}
    if not root.is_dir():
        return found
    for folder in root.iterdir():
        step = _STEP_DIR.fullmatch(folder.name)
        if not step or not folder.is_dir():
            continue
        for file in folder.iterdir():
            rank = _RANK_FILE.fullmatch(file.name)
            if rank and file.is_file():
                found[(int(step.group(1)), int(rank.group(1)))] = file
    return found


def prepare_out_dir(root: Path, *, rank: int, world: int, overwrite: bool) -> None:
    """Refuse a folder that already holds a run unless ``overwrite``; then clear this rank's files.

    Rank 0 owns ``run.json`` and the records of ranks ``>= world`` (left by a
    larger earlier run); every rank owns its ``step=*/rank{r}.json``, so ranks
    starting at different moments never refuse or delete each other's fresh
    files. With ``overwrite=True`` only those files (and step folders left
    empty) are removed.
    """
    if root.exists() and not root.is_dir():
        raise OutputDirError(f"{root}: is a file, not a directory")
    mine = {key: path for key, path in _rank_records(root).items()
            if key[1] == rank or (rank == 0 and key[1] >= world)}
    run_file = root / RUN_FILE
    held = bool(mine) or (rank == 0 and run_file.exists())
    if held and not overwrite:
        raise OutputDirError(f"{root}: already holds a training record (run.json, step=*/); "
                             "refusing to overwrite it (pass overwrite=True or choose another folder)")
    if held:
        for path in mine.values():
            path.unlink()
            if not any(path.parent.iterdir()):
                path.parent.rmdir()
        if rank == 0 and run_file.exists():
            run_file.unlink()
    ensure_writable_dir(root)


@dataclass(frozen=True)
class RunFolder:
    """A training record on disk: its ``run.json`` and where each ``(step, rank)`` record is."""

    root: Path
    meta: dict[str, Any]
    records: dict[tuple[int, int], Path]

    @property
    def groups(self) -> tuple[str, ...]:
        """The groups the run recorded (``options.checksums``, checked to be a list of names by ``open_run``)."""
        return tuple(self.meta.get("options", {}).get("checksums", ()))


def open_run(path: str | Path) -> RunFolder:
    """Check that ``path`` is a training record and list its records; nothing else is read.

    Raises ``TraceFormatError`` naming the folder or file when it is not a run.
    """
    root = Path(path)
    if not root.is_dir():
        raise TraceFormatError(f"{root}: not a folder; expected a training record written by tracediff.StepRecorder")
    meta = read_json(root / RUN_FILE, what="run file", limit=SMALL_JSON_LIMIT, missing=(
        f"{root}: no {RUN_FILE}; not a training record written by tracediff.StepRecorder"))
    if not isinstance(meta, dict) or meta.get("format") != RUN_FORMAT:
        raise TraceFormatError(f"{root / RUN_FILE}: expected \"format\": \"{RUN_FORMAT}\"; "
                               "not a training record written by tracediff.StepRecorder")
    if meta.get("format_version") not in READABLE_VERSIONS or isinstance(meta.get("format_version"), bool):
        raise TraceFormatError(f"{root / RUN_FILE}: format_version {meta.get('format_version')!r} is not one this "
                               f"tracediff reads ({', '.join(map(str, READABLE_VERSIONS))}); record it again with "
                               "this version of tracediff, or upgrade tracediff")
    options = meta.get("options", {})
    checksums = options.get("checksums", ()) if isinstance(options, dict) else None
    if not isinstance(checksums, (list, tuple)) or not all(isinstance(g, str) for g in checksums):
        raise TraceFormatError(f"{root / RUN_FILE}: \"options\" must be an object whose \"checksums\" is a list of "
                               f"group names; found {json.dumps(options)[:80]}")
    records = {key: resolve_inside(root, str(p.relative_to(root)), what="step record")
               for key, p in _rank_records(root).items()}
    return RunFolder(root=root, meta=meta, records=dict(sorted(records.items())))


def read_record(run: RunFolder, step: int, rank: int) -> dict[str, Any]:
    """The record of ``step`` on ``rank``, checked to be a step record."""
    path = run.records[(step, rank)]
    record = read_json(path, what="step record", root=run.root, missing=f"{path}: step record vanished while reading")
    if not isinstance(record, dict) or not isinstance(record.get("groups"), dict) or record.get("step") != step:
        raise TraceFormatError(f"{path}: not a step record (expected \"step\": {step} and a \"groups\" object)")
    return record


def read_json(path: Path, *, what: str, missing: str, limit: int = STEP_RECORD_LIMIT,
              root: Path | None = None) -> Any:
    """A JSON file of a run: a regular file inside ``root`` (default: its folder), at most ``limit`` bytes."""
    if not path.exists() and not path.is_symlink():
        raise TraceFormatError(missing)
    data = read_bounded(path, limit=limit, root=root or path.parent, what=what)
    try:
        return json.loads(data)
    except json.JSONDecodeError as e:
        raise TraceFormatError(f"{path}: invalid JSON in the {what} ({e.msg} at line {e.lineno}); "
                               "the file is truncated or was edited") from e
    except (ValueError, RecursionError) as e:  # not UTF-8, nested too deeply, an integer of 4,300+ digits
        reason = str(e).splitlines()[0] if str(e) else "nested too deeply"
        raise TraceFormatError(f"{path}: cannot read the {what} ({reason})") from None
