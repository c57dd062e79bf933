"""The matching part of the text and Markdown reports: how calls paired, what did not, what was not recorded."""

from __future__ import annotations

from collections import Counter

from ..alignment.pairing.unrecorded import collapse_paths
from ..alignment.result import Alignment, TensorComparison, Unmatched

SHOWN_NAMES = 8  # collapsed unmatched names listed per side before "... N more"
SHOWN_RULES = 10


def pairing_counts(result: Alignment) -> str:
    """``" (2 by name, 17 by structure, 6 by layout)"`` when anything but names paired calls, else ``""``."""
    if all(row.matched_by == "name" for row in result.rows):  # the usual case: no set of every call built
        return ""
    calls: dict[str, set[tuple[str, str, int]]] = {}
    for row in result.rows:
        calls.setdefault(row.matched_by, set()).add((row.module_path_a, row.module_path_b, row.call_index_b))
    counts = Counter({how: len(pairs) for how, pairs in calls.items()})
    if set(counts) <= {"name"}:
        return ""
    order = ["name", "map", "structure", "layout"]
    return " (" + ", ".join(f"{counts[how]} by {how}" for how in order if counts[how]) + ")"


def row_label(row: TensorComparison, tensor: str) -> str:
    """The tensor cell, with how the pair was found when it was not by name: ``outputs [A[..., 0:32] ~ B]``."""
    if row.transform:
        return f"{tensor} [{row.transform}]"
    if row.matched_by in ("structure", "map"):
        return f"{tensor} [{row.matched_by}]"
    return tensor


def _names(items: tuple[Unmatched, ...]) -> list[str]:
    """Calls, then tensors grouped by slot, module paths folded: ``M.layers.{0..1}.self_attn outputs.1``."""
    calls = [u.module_path for u in items if u.tensor is None]
    by_slot: dict[str, list[str]] = {}
    for u in items:
        if u.tensor is not None:
            by_slot.setdefault(u.tensor, []).append(u.module_path)
    tensors = [f"{path} {slot}" for slot, paths in by_slot.items() for path in collapse_paths(paths)]
    return collapse_paths(calls) + tensors


def unmatched_lines(result: Alignment, *, limit: int | None = SHOWN_NAMES) -> list[str]:
    """The count line, then the unmatched calls and tensors of each side by name, layer numbers folded."""
    if not (result.unmatched_a or result.unmatched_b or result.unrecorded_a or result.unrecorded_b):
        return []
    lines = []
    if result.unmatched_a or result.unmatched_b:
        lines.append(f"unmatched: {len(result.unmatched_a)} in A only, {len(result.unmatched_b)} in B only")
    for side, items in (("A", result.unmatched_a), ("B", result.unmatched_b)):
        names = _names(items)
        if not names:
            continue
        shown = names if limit is None else names[:limit]
        more = f" ... {len(names) - len(shown)} more (--all lists every one)" if len(shown) < len(names) else ""
        lines.append(f"  only in {side}: " + ", ".join(shown) + more)
    for side, blocks in (("A", result.unrecorded_a), ("B", result.unrecorded_b)):
        if blocks:
            lines.append(f"not recorded in {side} (pruned layers): " + ", ".join(collapse_paths(blocks))
                         + "; capture with pruning off to compare them")
    return lines


def unrecorded_note(row: TensorComparison) -> str | None:
    """The line under a first divergence with ``origin="unrecorded"``."""
    if row.origin != "unrecorded" or not row.unrecorded:
        return None
    return (f"every earlier tensor matched: the divergence arose in {', '.join(collapse_paths(row.unrecorded))}, "
            "which one trace did not record (transformers' debugger prunes layers by default: capture with "
            "do_prune_layers=False or tracediff.capture)")


def suggestion_lines(result: Alignment, *, limit: int | None = SHOWN_RULES) -> list[str]:
    rules = result.suggested_rename
    if not rules:
        return []
    shown = rules if limit is None else rules[:limit]
    lines = ["", f"suggested rename rules (A -> B), {len(rules)} in all; save them with --suggest-map FILE:"]
    lines += [f"  {a!r} -> {b!r}" for a, b in shown]
    if len(shown) < len(rules):
        lines.append(f"  ... {len(rules) - len(shown)} more in the --suggest-map file")
    for pattern, slot, _ in result.suggested_slots:  # the file's slot rules: the inputs the pairing set aside
        lines.append(f"  {slot} of {pattern!r}: not compared (paired on their outputs)")
    return lines


def suggested_map(result: Alignment) -> dict[str, list[list[str | None]]]:
    """The ``--suggest-map`` file: every suggested rename rule, and the layout pairings found, for the record.

    ``slots`` entries set aside the inputs of the calls paired on their outputs
    only (``[module_regex, "inputs", null]``). ``layout`` entries
    (``[module_a, module_b, transform]``, layer numbers as
    ``N``) document the fused and re-laid-out pairs; ``align`` finds them again
    by itself and ignores them when the file is passed back with ``--map``.
    """
    import re

    layout: list[list[str | None]] = []
    for row in result.rows:
        if row.matched_by != "layout" or not row.transform:
            continue
        paths = [re.sub(r"(?<=\.)\d+(?=\.|$)", "N", path.split(".", 1)[-1])
                 for path in (row.module_path_a, row.module_path_b)]
        entry: list[str | None] = [*paths, row.transform]
        if entry not in layout:
            layout.append(entry)
    out: dict[str, list[list[str | None]]] = {"rename": [list(rule) for rule in result.suggested_rename]}
    if result.suggested_slots:  # inputs the pairing set aside: a map without them would compare them
        out["slots"] = [[pattern, slot, None] for pattern, slot, _ in result.suggested_slots]
    if layout:
        out["layout"] = layout
    return out


def argument_lines(result: Alignment, *, limit: int = 10) -> list[str]:
    """Non-tensor values that differ; those passed on one side only (caches, flags) folded into one line."""
    diffs = result.argument_diffs
    if not diffs:
        return []
    one_sided = [d for d in diffs if d.detail in ("only in A", "only in B")]
    both = [d for d in diffs if d not in one_sided]
    lines = ["", f"non-tensor values that differ ({len(diffs)}):"]
    lines += [f"  {d.module_path_b} {d.slot}: {d.detail}" for d in both[:limit]]
    if len(both) > limit:
        lines.append(f"  ... {len(both) - limit} more (--format json lists every one)")
    for side in ("A", "B"):
        names = sorted({d.slot.rsplit(".", 1)[-1] for d in one_sided if d.detail == f"only in {side}"})
        if names:
            count = sum(d.detail == f"only in {side}" for d in one_sided)
            lines.append(f"  passed only in {side} ({count} entries): {', '.join(names)}")
    return lines
