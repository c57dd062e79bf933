"""What of A trace B lost or left without a counterpart: a finding, never rows quietly left out.

A graph runtime's node pairs with a call of A on its values (``pairing/evidence.py``): a node whose payload
was scaled, replaced or negated, or whose fields were edited, agrees with nothing and is left unpaired, and
so is the call of A it should answer; their rows are never compared, and the alignment would pass on what
is left. The same holds for what B's structure lost. Found once the plan is made, from the pairs alone:

* ``"call"``: a call of A with outputs, computing something (not idle), none of whose calls inside is
  paired, whose place in a graph trace B (between the B nodes paired with the calls of A just before and
  just after it) holds unpaired graph nodes with an output of as many elements as the call's, or with no
  output at all (a node whose ``outputs`` were removed), or holds one unpaired node only. A call that B's
  graph fuses away (an activation inside a fused SwiGLU) has nothing unpaired at its place; a call inside
  a call paired with one graph node (``experts`` with ``ffn_moe_out``) is compared through that node;
* ``"block"``: a numbered block of A (``layers.1``) that B does not hold: B's blocks of that kind, recorded
  or left out by ``do_prune_layers`` (``unrecorded``), are fewer than A's;
* ``"outputs"``: a pair whose call of B, in a trace tracediff captured, recorded no outputs where A's call
  has tensor outputs and neither raised (transformers' own debugger prunes outputs: not a loss there).

Only the topmost such call is reported (``layers.1``, not each of its leaves).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence

from ..trace.model import Node
from .pairing.calls import Matching
from .pairing.unrecorded import NUMBERED
from .result import Unplaced

_SHOWN = 3  # B's unpaired nodes named per call
_END = 1 << 62  # after every record


def find_unplaced(matching: Matching, *, b_prunes_outputs: bool,
                  not_shown: Sequence[str] = ()) -> tuple[Unplaced, ...]:
    """What of A ``matching`` leaves without a counterpart in B (see the module docstring), in A's order.

    ``b_prunes_outputs``: B comes from transformers' debugger, whose calls may hold no outputs.
    ``not_shown``: the module paths (relative to the root) B's runtime says it ran inside a fused region
    with no boundary in the run (metadata ``runtime.modules_not_shown``): a call of A there, or inside one,
    is judged through the paired call around it, whose compared tensors its result flows into.
    """
    paired_a = {id(a): b for a, b in matching.pairs}
    if not paired_a:
        return ()
    found = _missing_blocks(matching, paired_a)
    reported = {id(node) for node, _ in found}
    if not b_prunes_outputs:
        found += [(a, Unplaced(a.module_path, a.call_index, what="outputs")) for a, b in matching.pairs
                  if a.outputs() and not b.has_outputs and not b.children and b.error is None and a.error is None]
    if any(node.graph for node in matching.nodes_b):
        found += _unplaced_calls(matching, paired_a, reported, frozenset(not_shown))
    found.sort(key=lambda item: item[0].enter_order)
    return tuple(unplaced for _, unplaced in found)


def _missing_blocks(matching: Matching, paired_a: dict[int, Node]) -> list[tuple[Node, Unplaced]]:
    """A's numbered blocks beyond the count of B's blocks of the same kind (named by a pair, or the same)."""
    families_b = _families(matching.nodes_b)
    unrecorded_b = [path.partition(".")[2] for missing in matching.gaps_b.values() for path in missing]
    out = []
    for prefix, members in _families(matching.nodes_a).items():
        paired = next((paired_a[id(m)] for m in members if id(m) in paired_a), None)
        named = NUMBERED.match(paired.relative_path) if paired is not None else None
        kind_b = named[1] if named is not None else prefix
        held = {m.relative_path for m in families_b.get(kind_b, [])}
        count_b = len(held) + sum(path.rsplit(".", 1)[0] == kind_b for path in unrecorded_b)
        if not held or count_b >= len({m.relative_path for m in members}):
            continue
        lost = [m for m in members if id(m) not in paired_a and not any(id(inner) in paired_a for inner in m.walk())]
        by_name = [m for m in lost if m.relative_path not in held] if kind_b == prefix else []
        out += [(m, Unplaced(m.module_path, m.call_index, what="block")) for m in by_name or lost]
    return out


def _families(nodes: Sequence[Node]) -> dict[str, list[Node]]:
    """Numbered calls with children by their common prefix, relative to the root: ``{"layers": [...]}``."""
    out: defaultdict[str, list[Node]] = defaultdict(list)
    for node in nodes:
        match = NUMBERED.match(node.relative_path) if node.relative_path[-1:].isdigit() else None
        if match is not None and node.children:
            out[match[1]].append(node)
    return out


def _unplaced_calls(matching: Matching, paired_a: dict[int, Node], reported: set[int],
                    not_shown: frozenset[str]) -> list[tuple[Node, Unplaced]]:
    unpaired_b = [n for n in matching.unmatched_b if not n.children and id(n) not in matching.idle and n.graph]
    unpaired_b.sort(key=lambda n: n.enter_order)
    b_orders = [n.enter_order for n in unpaired_b]
    a_sorted = sorted((a for a in matching.nodes_a if id(a) in paired_a), key=lambda n: n.enter_order)
    exits = sorted((a.exit_order, id(a)) for a in a_sorted)
    enters = [a.enter_order for a in a_sorted]
    out = []
    for node in matching.nodes_a:
        if id(node) in paired_a or id(node) in matching.idle or not node.outputs() or id(node) in reported \
                or (node.parent is not None and id(node.parent) in reported):  # idle: it computes nothing
            continue
        if any(id(inner) in paired_a for inner in node.walk()[1:]) or _inside_one_node(node, paired_a) \
                or _fused_away(node, paired_a, not_shown):
            continue
        before = bisect.bisect_left(exits, (node.enter_order, -1)) - 1  # the last pair that ended before it
        after = bisect.bisect_right(enters, node.exit_order)  # the first pair that starts after it
        low = paired_a[exits[before][1]].exit_order if before >= 0 else -1
        high = paired_a[id(a_sorted[after])].enter_order if after < len(a_sorted) else _END
        low, high = min(low, high), max(low, high)  # B ran them in another order
        place = _place(node, unpaired_b[bisect.bisect_right(b_orders, low):], high)
        if place:
            out.append((node, Unplaced(node.module_path, node.call_index, tuple(place[:_SHOWN]))))
            reported.add(id(node))
    return out


def _inside_one_node(node: Node, paired_a: dict[int, Node]) -> bool:
    """Is ``node`` inside a call of A paired with one graph node (a mixture of experts' ``experts`` with
    ggml's ``ffn_moe_out``)? B computes that call in nodes that answer none of its inner calls, and compares
    it through the node it hands on: the inner calls have no place of their own."""
    up = node.parent
    while up is not None and id(up) not in paired_a:
        up = up.parent
    partner = paired_a.get(id(up)) if up is not None else None
    return partner is not None and partner.graph and not partner.children


def _fused_away(node: Node, paired_a: dict[int, Node], not_shown: frozenset[str]) -> bool:
    """Is ``node`` (or a call around it) one B's runtime ran inside a fused region, under a paired call?"""
    if not not_shown:
        return False
    up: Node | None = node
    hidden = False
    while up is not None and id(up) not in paired_a:
        hidden = hidden or up.relative_path in not_shown
        up = up.parent
    return hidden and up is not None


def _place(node: Node, candidates: Sequence[Node], high: int) -> list[str]:
    """B's unpaired nodes before ``high`` whose output could be ``node``'s (as many elements, or none), or
    the one node there (its recorded shape may be wrong: the payload is compared as it is)."""
    sizes = {_numel(record.shape) for record in node.outputs()}
    there = [candidate for candidate in candidates if candidate.enter_order < high]
    fitting = [candidate for candidate in there if not candidate.outputs()
               or any(_numel(record.shape) in sizes for record in candidate.outputs())]
    chosen = fitting or (there if len(there) == 1 else [])
    return [f"{candidate.module_path}#{candidate.call_index}" for candidate in chosen]


def _numel(shape: tuple[int, ...] | None) -> int | None:
    return math.prod(shape) if shape is not None else None
