"""Layer blocks a trace did not record, and divergences that arose in them.

transformers' debugger, at its default ``do_prune_layers=True``, keeps only
the first and the last of a run of numbered layer blocks (``layers.0`` and
``layers.3`` of four). Such gaps are found in each trace on its own: numbered
siblings (``{prefix}.{n}``, children of the same call) whose numbers skip
values. The missing blocks are reported (``unrecorded_a``, ``unrecorded_b``),
calls recorded on the other side inside them are not counted as unmatched,
and a first divergence that appears when the next recorded block starts
(an input of ``layers.3`` after the unrecorded ``layers.1`` and ``layers.2``)
gets ``origin="unrecorded"``, with the blocks where it arose in ``unrecorded``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace

from ...trace.model import Node
from ..result import TensorComparison

#: ``prefix.N``: a numbered block, N of up to 18 digits (longer is no layer index, and int() refuses over 4,300
#: digits). The one pattern of a numbered block, for pairing and for what B lost (``alignment/unplaced.py``).
NUMBERED = re.compile(r"^(.*)\.(\d{1,18})$")


def find_unrecorded(nodes: Iterable[Node]) -> dict[str, tuple[str, ...]]:
    """For each recorded block right after a gap, the full paths of the blocks missing before it.

    ``nodes``: every call of a trace (``Trace.nodes()``). Keyed by the full
    module path of the block after the gap (``LlamaModel.layers.3``):
    ``("LlamaModel.layers.1", "LlamaModel.layers.2")``.
    """
    gaps: dict[str, tuple[str, ...]] = {}
    for node in nodes:
        if len(node.children) < 2:  # a gap lies between two numbered siblings
            continue
        groups: defaultdict[str, set[int]] = defaultdict(set)
        for child in node.children:
            match = NUMBERED.match(child.module_path) if child.module_path[-1:].isdigit() else None
            if match:
                groups[match.group(1)].add(int(match.group(2)))
        for prefix, numbers in groups.items():
            ordered = sorted(numbers)
            for before, after in zip(ordered, ordered[1:]):
                if after > before + 1:
                    gaps[f"{prefix}.{after}"] = tuple(f"{prefix}.{n}" for n in range(before + 1, after))
    return gaps


def all_unrecorded(gaps: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(path for missing in gaps.values() for path in missing)


def inside(path: str, blocks: Iterable[str]) -> bool:
    """True when ``path`` is one of ``blocks`` or lies below one of them."""
    return any(path == block or path.startswith(block + ".") for block in blocks)


def mark_unrecorded_origin(rows: Sequence[TensorComparison], gaps_a: dict[str, tuple[str, ...]],
                           gaps_b: dict[str, tuple[str, ...]]) -> list[TensorComparison]:
    """Give the first divergence ``origin="unrecorded"`` when it shows as a block after a gap starts.

    That is: it is an input (forward) of a block that directly follows blocks
    one side did not record, or of a call inside that block before any
    output of the block was compared. Other rows are returned unchanged.
    """
    out = list(rows)
    first = next((i for i, row in enumerate(out) if row.diverged), None)
    if first is None:
        return out
    row = out[first]
    if not row.tensor.startswith("inputs"):
        return out
    for side_b, gaps in ((True, gaps_b), (False, gaps_a)):
        path_of_row = row.module_path_b if side_b else row.module_path_a
        found = _gap_before(path_of_row, gaps)
        if found is None:
            continue
        block, blocks = found
        earlier_in_block = [r for r in out[:first] if inside(r.module_path_b if side_b else r.module_path_a, [block])]
        if any(not r.tensor.startswith("inputs") for r in earlier_in_block):
            return out  # the block computed something that matched first: the error arose inside it
        out[first] = replace(row, origin="unrecorded", unrecorded=blocks)
        return out
    return out


def _gap_before(path: str, gaps: dict[str, tuple[str, ...]]) -> tuple[str, tuple[str, ...]] | None:
    for block, blocks in gaps.items():
        if inside(path, [block]):
            return block, blocks
    return None


def collapse_paths(paths: Iterable[str]) -> list[str]:
    """Module paths with layer numbers folded: ``model.layers.{0..3}.self_attn.rotary_emb``, in first-seen order.

    Paths that differ only in one number are written once, with the numbers
    as ``{0..3}`` when consecutive, else ``{0,2,5}``.
    """
    groups: dict[tuple[str, ...], list[int]] = {}
    singles: list[str] = []
    order: list[tuple[str, ...] | str] = []
    for path in dict.fromkeys(paths):
        parts = path.split(".")
        numbered = [i for i, p in enumerate(parts) if p.isdigit() and len(p) <= 18]  # as NUMBERED
        if not numbered:
            singles.append(path)
            order.append(path)
            continue
        i = numbered[0]
        key = tuple(parts[:i]) + ("{}",) + tuple(parts[i + 1:])
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(parts[i]))
    out = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        numbers = sorted(set(groups[item]))
        if len(numbers) == 1:
            label = str(numbers[0])
        elif numbers == list(range(numbers[0], numbers[-1] + 1)):
            label = f"{{{numbers[0]}..{numbers[-1]}}}"
        else:
            label = "{" + ",".join(str(n) for n in numbers) + "}"
        out.append(".".join(label if p == "{}" else p for p in item))
    return out


def carry_origin(rows: Sequence[TensorComparison], marked: Sequence[TensorComparison]) -> tuple[TensorComparison, ...]:
    """``rows`` (copies of some rows, such as the error sources) with the ``unrecorded`` origin of ``marked``."""
    by_order = {row.order: row for row in marked if row.origin == "unrecorded"}
    return tuple(replace(row, origin="unrecorded", unrecorded=by_order[row.order].unrecorded)
                 if row.order in by_order else row for row in rows)
