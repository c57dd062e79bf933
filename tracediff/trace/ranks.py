"""Recognising a multi-rank folder: ``rank{r}/`` trace folders, with or without ``tracediff_ranks.json``.

Reading one is :mod:`tracediff.sharding`'s work; this is only the test that the
trace reader, the dump detector and ``align`` share.
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import format as fmt

_RANK_NAME = re.compile(rf"{fmt.RANK_FOLDER_PREFIX}(\d+)")
_MARKERS = (fmt.METADATA_FILE, fmt.JOURNAL_FILE)


def rank_folders(folder: Path) -> list[Path]:
    """The ``rank{r}`` folders of ``folder`` that hold a trace (its metadata, tree JSON or journal), by rank;
    symbolic links are not followed."""
    found = []
    for child in folder.glob(f"{fmt.RANK_FOLDER_PREFIX}*"):
        match = _RANK_NAME.fullmatch(child.name)
        if match and child.is_dir() and not child.is_symlink() and _holds_trace(child):
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def _holds_trace(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _MARKERS) or \
        next(folder.glob(f"*{fmt.FULL_SUFFIX}"), None) is not None or \
        next(folder.glob(f"*{fmt.SUMMARY_SUFFIX}"), None) is not None


def is_multi_rank(path: str | Path) -> bool:
    """True for a folder written by ``capture(..., ranks="all")`` under more than one rank: it holds
    ``tracediff_ranks.json``, or ``rank{r}/`` trace folders and no trace of its own."""
    folder = Path(path)
    if not folder.is_dir():
        return False
    if (folder / fmt.RANKS_FILE).is_file():
        return True
    own = next(folder.glob(f"*{fmt.FULL_SUFFIX}"), None) or next(folder.glob(f"*{fmt.SUMMARY_SUFFIX}"), None)
    return own is None and bool(rank_folders(folder))
