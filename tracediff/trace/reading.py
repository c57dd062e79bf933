"""Reading the files of a trace folder: the tree JSON, the metadata, or the journal a dead capture left.

Every read goes through :mod:`tracediff.files.confine` (confined to the trace
folder, regular files only, bounded: ``TRACE_JSON_LIMIT`` for the tree,
``SMALL_JSON_LIMIT`` for the metadata, ``JOURNAL_LIMIT`` for the journal),
and the tree's field types are checked (:mod:`tracediff.trace.validate`)
as nodes are built from it.

A folder whose capture process was killed (SIGKILL, out of memory) holds no
tree JSON, only payloads and ``tracediff_journal.jsonl``. The tree is then
rebuilt from the journal: every call that finished, with its inputs and
outputs, and every call that had started, with an ``error`` saying the
process ended inside it, with the op nodes of op-level capture in their
places and the backward nodes recorded so far. Such a trace is incomplete
(:func:`incomplete_reason`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import format as fmt
from ..errors import TraceFormatError
from ..files.confine import JOURNAL_LIMIT, SMALL_JSON_LIMIT, TRACE_JSON_LIMIT, read_bounded, read_json_file

#: ``metadata["capture_failure"]`` of a trace rebuilt from its journal.
DIED = "the capture process ended before the trace was written (killed, or out of memory); read from its journal"


def read_tree(json_path: Path, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tree of ``json_path`` (a tree JSON or a journal) and the folder's metadata (``{}`` if none).

    The tree's field types are checked by the reader as it builds nodes from it
    (:mod:`tracediff.trace.validate`), in the same walk.
    """
    directory = json_path.parent
    if json_path.name == fmt.JOURNAL_FILE:
        tree = tree_from_journal(json_path, root)
        metadata = {fmt.PRODUCER_KEY: "unknown", fmt.COMPLETE_KEY: False, "capture_failure": DIED}
    else:
        tree = read_json_file(json_path, limit=TRACE_JSON_LIMIT, root=root, what="trace JSON")
        if not isinstance(tree, dict) or not isinstance(tree.get(fmt.MODULE_PATH), str):
            raise TraceFormatError(f"{json_path}: not a trace: expected a JSON object with a 'module_path' at the top")
        metadata_file = directory / fmt.METADATA_FILE
        metadata = read_json_file(metadata_file, root=root, limit=SMALL_JSON_LIMIT, what="metadata") \
            if metadata_file.exists() or metadata_file.is_symlink() else {}
        if not isinstance(metadata, dict):
            raise TraceFormatError(f"{metadata_file}: not a tracediff metadata object")
        fmt.check_format_version(metadata, metadata_file)  # before the tree: a newer major may change its fields
    return tree, metadata


def journal_of(folder: Path) -> Path | None:
    """The journal of a folder whose capture died (no tree JSON), or None."""
    path = folder / fmt.JOURNAL_FILE
    return path if path.is_file() or path.is_symlink() else None


def tree_from_journal(path: Path, root: Path) -> dict[str, Any]:
    """The call tree recorded in a capture journal (see the module docstring)."""
    data = read_bounded(path, limit=JOURNAL_LIMIT, root=root, what="capture journal")
    nodes: dict[int, dict[str, Any]] = {}
    parents: dict[int, int | None] = {}
    finished: set[int] = set()
    ops: dict[int, list[tuple[int, dict[str, Any]]]] = {}  # call id -> (index among its children, op node)
    backward: dict[Any, dict[str, Any]] = {}  # arrival -> the backward node as last recorded
    for line in data.split(b"\n"):
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            continue  # the line being written when the process died, or damage: skipped
        if not isinstance(entry, dict):
            continue
        seq = entry.get(fmt.JOURNAL_ENTER)
        if isinstance(seq, int) and isinstance(entry.get(fmt.MODULE_PATH), str):
            parent = entry.get(fmt.JOURNAL_PARENT)
            parents[seq] = parent if isinstance(parent, int) and parent in nodes else None
            nodes[seq] = fmt.node_entry(entry[fmt.MODULE_PATH], module_type=_str_or_none(entry.get(fmt.MODULE_TYPE)),
                                        call_index=entry.get(fmt.CALL_INDEX), children=[])
            continue
        body = entry.get(fmt.JOURNAL_NODE)
        seq = entry.get(fmt.JOURNAL_EXIT)
        if isinstance(seq, int) and seq in nodes and isinstance(body, dict):
            body = {k: v for k, v in body.items() if k not in (fmt.CHILDREN, fmt.MODULE_PATH)}
            nodes[seq].update(body)
            finished.add(seq)
            continue
        grads = entry.get(fmt.JOURNAL_BACKWARD)
        if isinstance(grads, dict) and isinstance(grads.get(fmt.BACKWARD_ORDER), list) and grads[fmt.BACKWARD_ORDER]:
            arrival = grads[fmt.BACKWARD_ORDER][0]
            backward[arrival if isinstance(arrival, int) else len(backward)] = grads
            continue
        call, at = entry.get(fmt.JOURNAL_OP_IN), entry.get(fmt.JOURNAL_AT)
        if isinstance(call, int) and call in nodes and isinstance(at, int) and isinstance(body, dict) \
                and fmt.is_op_node(body):
            ops.setdefault(call, []).append((at, body))
    roots: list[dict[str, Any]] = []
    for seq in sorted(nodes):
        node = nodes[seq]
        if seq not in finished:
            node[fmt.ERROR] = fmt.error_entry(fmt.UNFINISHED_CALL, "the capture process ended inside this call")
        parent = parents[seq]
        (nodes[parent][fmt.CHILDREN] if parent is not None else roots).append(node)
    for call, placed in ops.items():  # each op where it was among the call's children, the calls in start order
        children = nodes[call][fmt.CHILDREN]
        for at, op in sorted(placed, key=lambda item: item[0]):
            children.insert(min(max(at, 0), len(children)), op)
    for node in nodes.values():
        if not node[fmt.CHILDREN]:
            del node[fmt.CHILDREN]
    if not roots:
        raise TraceFormatError(f"{path}: the capture journal records no call; {DIED.split(';')[0]}")
    tree = roots[0]
    if len(roots) > 1:
        tree[fmt.SUBSEQUENT_CALLS] = roots[1:]
    if backward:
        tree[fmt.BACKWARD] = list(backward.values())  # in arrival order: the reader orders records by the clock
    return tree


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def incomplete_reason(metadata: dict[str, Any], roots: list[Any]) -> str | None:
    """Why a trace is incomplete (None when it is complete, or when nothing says otherwise).

    A tracediff trace says so in its metadata (``complete: false``, with the
    error or the capture failure); a standard trace, whose debugger records no
    such flag, is taken as incomplete when its top-level call raised.
    """
    lost = metadata.get(fmt.UNRECORDED_CALLS)
    lost = lost if isinstance(lost, dict) and lost.get("count") else None  # incomplete, whatever `complete` says
    if metadata.get(fmt.COMPLETE_KEY) is False or lost is not None:
        failure = metadata.get("capture_failure")
        error = metadata.get(fmt.ERROR)
        if isinstance(failure, str) and failure:
            return failure
        if isinstance(error, dict):
            where = f" in {error.get(fmt.MODULE_PATH)}" if error.get(fmt.MODULE_PATH) else ""
            return f"the forward raised {error.get(fmt.ERROR_TYPE)}{where}: {error.get(fmt.ERROR_MESSAGE)}"
        if lost is not None:
            calls = lost.get("calls")
            first = calls[0] if isinstance(calls, list) and calls and isinstance(calls[0], dict) else {}
            return (f"module calls that ran were not recorded: {lost['count']} (first "
                    f"{first.get(fmt.MODULE_PATH)}: {first.get('why')})")
        return "the capture did not finish"
    for root in roots:
        error = getattr(root, "error", None)
        if isinstance(error, dict):
            return f"the forward raised {error.get(fmt.ERROR_TYPE)}: {error.get(fmt.ERROR_MESSAGE)}"
    return None
