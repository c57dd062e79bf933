"""Non-tensor arguments and outputs that differ between matched nodes.

Values are compared as recorded: typed JSON values in tracediff traces,
sanitized reprs in standard traces. deepdiff describes what changed inside
nested values (``use_cache`` True vs False, a config-like dict with one key
changed, a different tuple of sizes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...format import sanitize_repr
from ...trace.model import Node, ReprValue
from ..result import ArgumentDiff
from .value_summary import describe_large, is_large

_ABSENT: Any = object()


def diff_arguments(pairs: Iterable[tuple[Node, Node]]) -> list[ArgumentDiff]:
    """One ``ArgumentDiff`` per slot whose non-tensor value differs between two matched nodes."""
    out = []
    for node_a, node_b in pairs:
        if node_a.values == node_b.values:
            continue
        tensor_slots_a = {t.slot for t in node_a.tensors}
        tensor_slots_b = {t.slot for t in node_b.tensors}
        both_outputs = node_a.has_outputs and node_b.has_outputs
        for slot in sorted(set(node_a.values) | set(node_b.values)):
            if slot.startswith("outputs") and not both_outputs:  # pruned parent outputs
                continue
            va = node_a.values.get(slot, _ABSENT)
            vb = node_b.values.get(slot, _ABSENT)
            if _same(va, vb):
                continue
            if (va is _ABSENT and slot in tensor_slots_a) or (vb is _ABSENT and slot in tensor_slots_b):
                detail = "a tensor on one side, a plain value on the other"
            elif va is _ABSENT or vb is _ABSENT:
                detail = f"only in {'B' if va is _ABSENT else 'A'}"
            else:
                detail = _describe(va, vb)
            out.append(ArgumentDiff(node_a.module_path, node_b.module_path, node_a.call_index, slot,
                                    None if va is _ABSENT else va, None if vb is _ABSENT else vb, detail))
    return out


def _same(va: Any, vb: Any) -> bool:
    """Equal values; a repr-only value equals a typed value whose repr it is."""
    if isinstance(va, ReprValue) != isinstance(vb, ReprValue) and va is not _ABSENT and vb is not _ABSENT:
        as_text = [v if isinstance(v, ReprValue) else sanitize_repr(repr(v)) for v in (va, vb)]
        return as_text[0] == as_text[1]
    return bool(va == vb)


def _describe(va: Any, vb: Any) -> str:
    if is_large(va) or is_large(vb):  # bounded work: deepdiff's grows with the whole value
        return describe_large(va, vb)
    from deepdiff import DeepDiff  # imported on first use: most aligns never need it

    diff = DeepDiff(va, vb, verbose_level=2)
    try:
        text = diff.pretty()
    except Exception:  # noqa: BLE001 - a description only; fall back to the raw diff
        text = str(diff)
    return " ".join(text.split())[:500] or f"{va!r} vs {vb!r}"
