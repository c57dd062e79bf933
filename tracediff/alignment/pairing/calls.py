"""Matching the module calls of two traces, and the tensors within matched calls.

``match="auto"`` (the default) pairs the calls top down, on the strongest evidence each pair has: the
rename map, values, names, sizes (:mod:`tracediff.alignment.pairing.tree`; the map's rules are also
honoured where they cross the hierarchy). Layer blocks one side did not record (transformers' default
pruning, see :mod:`tracediff.alignment.pairing.unrecorded`) are set aside, with what lies inside them.
Backward calls pair as their forward calls did.

``match="name"`` pairs by (renamed) path and call index only: a call of A pairs with the call of B with
the same path relative to the root (the root's class name is ignored, so ``LlamaModel`` and ``MyLlama``
both start at ``""``) and the same call index; a pair whose name needed the rules is matched ``"map"``.
``match="structure"`` pairs as ``auto`` does with names and the map left out. Layout-aware pairs (fused
projections, permuted heads) are added afterwards by :mod:`tracediff.alignment.pairing.layout`.
``suggest_rename`` turns the pairs into rename rules for the user to check and reuse. Within a matched
pair, tensors pair as described in :mod:`tracediff.alignment.pairing.slots`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import UsageError
from ...maps.rules import RenameRules, apply_rename
from ...maps.suggest import suggest_rules
from ...trace.load import Trace
from ...trace.model import Node
from ..pair import CallPair, Evidence, MatchedBy
from .evidence import Values
from .slots import pair_tensors
from .tree import HANDED_ON, OUTPUTS_ONLY, TreePairing
from .unrecorded import all_unrecorded, find_unrecorded, inside

MATCH_MODES = ("auto", "name", "structure")

__all__ = ["MATCH_MODES", "Matching", "match_nodes", "pair_tensors", "suggest_rename"]


@dataclass(frozen=True)
class Matching:
    """Paired calls (in B's call order), each with how it was paired, and what is left on each side."""

    calls: tuple[CallPair, ...]
    unmatched_a: tuple[Node, ...]
    unmatched_b: tuple[Node, ...]
    structural: bool
    idle: frozenset[int] = frozenset()  # ``id`` of the calls found to compute nothing
    gaps_a: dict[str, tuple[str, ...]] = field(default_factory=dict)  # see unrecorded.find_unrecorded
    gaps_b: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # every call of each trace (``Trace.nodes()``), listed once for all the steps of an alignment
    nodes_a: list[Node] = field(default_factory=list, repr=False, compare=False)
    nodes_b: list[Node] = field(default_factory=list, repr=False, compare=False)

    @property
    def pairs(self) -> tuple[tuple[Node, Node], ...]:
        """The paired calls, A's then B's."""
        return tuple((call.node_a, call.node_b) for call in self.calls)

    @property
    def outputs_only(self) -> frozenset[tuple[int, int]]:
        """(id of A's call, id of B's call) of the pairs whose inputs are not compared (:attr:`CallPair.outputs_only`;
        for readers that look pairs of calls up by identity)."""
        return frozenset((id(call.node_a), id(call.node_b)) for call in self.calls if call.outputs_only)

    def count(self, method: MatchedBy) -> int:
        return sum(call.matched_by is method for call in self.calls)


def match_nodes(a: Trace, b: Trace, rename: RenameRules, match: str = "auto") -> Matching:
    """Pair the calls of ``a`` and ``b`` (see the module docstring for ``match``)."""
    if match not in MATCH_MODES:
        raise UsageError(f"match: {match!r} is not one of {', '.join(MATCH_MODES)}")
    nodes_a = a.nodes()
    nodes_b = nodes_a if b is a else b.nodes()  # a trace against itself: one walk
    gaps_a = find_unrecorded(nodes_a)
    gaps_b = gaps_a if b is a else find_unrecorded(nodes_b)
    pairs: list[tuple[Node, Node]] = []
    methods: list[str] = []
    evidence: list[str] = []
    idle: frozenset[int] = frozenset()
    aside: list[bool] = []  # per pair: compared on its outputs only
    if match == "name":
        by_key = {(node.phase, node.relative_path, node.call_index): node for node in nodes_b}  # Node.key
        for node in nodes_a:
            renamed = apply_rename(node.relative_path, rename) if rename else node.relative_path
            other = by_key.pop((node.phase, renamed, node.call_index), None)
            if other is not None:
                pairs.append((node, other))
                methods.append("name" if renamed == node.relative_path else "map")
        evidence = list(methods)
    else:
        tree = TreePairing(Values(a, b), list(rename), use_names=match != "structure")
        tree.run([r for r in a.roots if r.phase == "forward"], [r for r in b.roots if r.phase == "forward"])
        pairs = tree.pairs
        aside = [how in (OUTPUTS_ONLY, HANDED_ON) for how in tree.evidence]
        # a pair made on dataflow alone is reported as the weakest evidence: no value says it
        evidence = ["value" if how == OUTPUTS_ONLY else "shape" if how == HANDED_ON else how for how in tree.evidence]
        methods = [how if how in ("name", "map") else "structure" for how in evidence]
        idle = tree.idle()
        if rename and match != "structure":
            _mapped_across(pairs, methods, evidence, nodes_a, nodes_b, rename)
    named = sum(1 for (x, _), m in zip(pairs, methods) if x.relative_path and m in ("name", "map"))
    # calls lying in blocks the other side did not record have no partner to find
    hidden_b = [_relative(p) for p in all_unrecorded(gaps_b)]
    hidden_a = [apply_rename(_relative(p), rename) for p in all_unrecorded(gaps_a)]

    def explained_a(n: Node) -> bool:
        return inside(apply_rename(n.relative_path, rename), hidden_b)

    def explained_b(n: Node) -> bool:
        return inside(n.relative_path, hidden_a)

    # each call pairs at most once: as many pairs as calls on both sides means nothing is left to look for
    complete = len(pairs) == len(nodes_a) == len(nodes_b)
    paired_a = set() if complete else {id(x) for x, _ in pairs}  # kept up to date below
    paired_b = set() if complete else {id(y) for _, y in pairs}
    if match != "name" and not complete:
        if a.backward and b.backward:
            _with_backward(pairs, methods, evidence, nodes_a, nodes_b, paired_a, paired_b)
    structural = match == "structure" or (named == 0 and any(m == "structure" for m in methods))
    in_b = [(y.phase != "forward", y.enter_order) for _, y in pairs]  # forward calls first, in B's call order
    order = sorted(range(len(pairs)), key=in_b.__getitem__)
    aside += [False] * (len(pairs) - len(aside))  # calls paired later (the map across, backward) compare inputs
    return Matching(
        calls=tuple(CallPair(*pairs[i], MatchedBy(methods[i]), Evidence(evidence[i]), aside[i]) for i in order),
        unmatched_a=() if complete else tuple(n for n in nodes_a if id(n) not in paired_a and not explained_a(n)),
        unmatched_b=() if complete else tuple(n for n in nodes_b if id(n) not in paired_b and not explained_b(n)),
        structural=structural, idle=idle,
        gaps_a=gaps_a, gaps_b=gaps_b, nodes_a=nodes_a, nodes_b=nodes_b,
    )


def _mapped_across(pairs: list[tuple[Node, Node]], methods: list[str], evidence: list[str], nodes_a: list[Node],
                   nodes_b: list[Node], rename: RenameRules) -> None:
    """The user's map is honoured where it crosses the hierarchy (a rotary module inside A's first attention
    renamed to B's model-level ``rotary_emb``): calls still unpaired whose renamed path is a call of B."""
    paired_a, paired_b = {id(x) for x, _ in pairs}, {id(y) for _, y in pairs}
    by_key = {n.key: n for n in nodes_b if id(n) not in paired_b}
    for node in nodes_a:
        if id(node) in paired_a:
            continue
        renamed = apply_rename(node.relative_path, rename)
        other = by_key.pop((node.phase, renamed, node.call_index), None) if renamed != node.relative_path else None
        if other is not None:
            pairs.append((node, other))
            methods.append("map")
            evidence.append("map")


def _relative(full_path: str) -> str:
    """A full module path as a relative path (the root component removed)."""
    return full_path.split(".", 1)[1] if "." in full_path else ""


def _with_backward(pairs: list[tuple[Node, Node]], methods: list[str], evidence: list[str], nodes_a: list[Node],
                   nodes_b: list[Node], paired_a: set[int], paired_b: set[int]) -> None:
    """Backward calls pair like their forward calls (added to ``pairs``, ``methods``, ``evidence`` and the ids
    of the paired calls on each side)."""
    how = {(x.relative_path, x.call_index): (m, e) for (x, _), m, e in zip(pairs, methods, evidence)}
    path_of = {(x.relative_path, x.call_index): (y.relative_path, y.call_index) for x, y in pairs
               if x.phase == "forward"}
    by_key = {(n.relative_path, n.call_index): n for n in nodes_b if n.phase == "backward" and id(n) not in paired_b}
    for node in nodes_a:
        if node.phase != "backward" or id(node) in paired_a:
            continue
        other = by_key.pop(path_of.get((node.relative_path, node.call_index), ("", -1)), None)
        if other is not None:
            pairs.append((node, other))
            method, found = how.get((node.relative_path, node.call_index), ("structure", "shape"))
            methods.append(method)
            evidence.append(found)
            paired_a.add(id(node))
            paired_b.add(id(other))


def suggest_rename(pairs: tuple[tuple[Node, Node], ...] | list[tuple[Node, Node]]) -> RenameRules:
    """Rename rules mapping A's paths to B's for every pair (see :mod:`tracediff.maps.suggest`)."""
    return suggest_rules(pairs)
