"""Warnings about the first divergence that the rows cannot show: the pairing it rests on is weak, or two
traces cannot decide where it arose."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .pair import Pair
from .pairing.plan import Plan
from .result import TensorComparison, Unmatched


def weak_first_divergence(rows: Iterable[TensorComparison], unmatched_b: Sequence[Unmatched]) -> str | None:
    """A warning when the first divergence rests on sizes alone, naming B's unpaired calls it could be instead."""
    first = next((row for row in rows if row.within_tolerance is False), None)
    if first is None or first.pairing != "shape":
        return None
    calls = [u.module_path for u in unmatched_b if u.tensor is None][:3]
    others = f"; unpaired calls of B: {', '.join(calls)}" if calls else ""
    return (f"the first divergence pairs {first.module_path_a} with {first.module_path_b} on sizes alone (no value, "
            f"name or map says they are the same computation): check that pair{others}")


def undecided_first_divergence(rows: Iterable[TensorComparison], pairs: Sequence[Pair], plan: Plan) -> str | None:
    """When the first divergence arose between recorded calls, the unpaired calls that ran before it: one of
    them may hold the mistake, and two traces cannot tell (a rotary table one side computes in a call of
    its own, the other inside its attention)."""
    first = next((row for row in rows if row.within_tolerance is False), None)
    if first is None or first.origin != "between modules" or first.order >= len(pairs):
        return None
    node_a, node_b = pairs[first.order].node_a, pairs[first.order].node_b
    relaid = {id(n) for pair in plan.layout_nodes for n in pair}  # fused calls: paired by layout
    matching = plan.matching
    candidates = [n for n in matching.unmatched_b if n.enter_order < node_b.enter_order and not n.children
                  and id(n) not in relaid and id(n) not in matching.idle]
    candidates += [n for n in matching.unmatched_a if n.enter_order < node_a.enter_order and not n.children
                   and id(n) not in relaid and id(n) not in matching.idle]
    if not candidates:
        return None
    named = ", ".join(n.module_path for n in candidates[:6]) + (", ..." if len(candidates) > 6 else "")
    return (f"the first divergence arose between recorded calls ({first.module_path_b} {first.tensor}); calls "
            f"that ran before it have no partner and may hold the mistake, which two traces cannot decide: "
            f"{named}")
