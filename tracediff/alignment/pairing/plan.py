"""From two traces to the tensor pairs ``tracediff.align`` compares, and how each was found.

Calls are matched (:mod:`tracediff.alignment.pairing.calls`), tensors within
matched calls are paired (:mod:`tracediff.alignment.pairing.slots`), then layouts
relate what is left (:mod:`tracediff.alignment.pairing.layout`): fused calls among
the unpaired children of matched calls, and tensors of a matched call whose
shapes differ; last, an output of a matched call that B made in a call with
no partner is paired there too (:mod:`tracediff.alignment.pairing.producers`).
Each pair (:class:`tracediff.alignment.pairing.pair.Pair`) remembers how it was
found (``matched_by``: name, map, structure, layout or output), the evidence it
rests on and the transform relating it, if any.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...compare.shapes import squeezed
from ...maps.rules import RenameRules, SlotRules
from ...maps.suggest import any_layer, suggest_rules
from ...trace.graph_scopes import GRAPH_BLOCK
from ...trace.load import Trace
from ...trace.model import Node, TensorRecord
from ..pair import Evidence, MatchedBy, Pair
from ..result import Unmatched
from .calls import Matching, match_nodes
from .consumed import Consumption
from .evidence import Values
from .layout import Transform, find_fused, find_relayout
from .make import made_by, pair_of
from .producers import find_producers
from .slots import pair_tensors
from .unrecorded import all_unrecorded

# below this share of B's calls paired by name or map, the report warns (it never switches to structure)
LOW_COVERAGE = 0.5


@dataclass(frozen=True)
class Plan:
    """Everything pairing found, ready for the engine to compare."""

    matching: Matching
    values: Values
    pairs: tuple[Pair, ...]  # each pair knows how it was found (matched_by, evidence, transform)
    unmatched_a: tuple[Unmatched, ...]
    unmatched_b: tuple[Unmatched, ...]
    layout_nodes: tuple[tuple[Node, Node], ...]  # fused calls, paired by layout
    warnings: tuple[str, ...]
    suggested: RenameRules
    # slot rules setting aside the inputs of the pairs compared on their outputs only (CallPair.outputs_only), so
    # that a suggested map passed back with --map compares what the pairing compared
    suggested_slots: tuple[tuple[str, str, str], ...]

    @property
    def unrecorded_a(self) -> tuple[str, ...]:
        return all_unrecorded(self.matching.gaps_a)

    @property
    def unrecorded_b(self) -> tuple[str, ...]:
        return all_unrecorded(self.matching.gaps_b)

    @property
    def matched_nodes(self) -> int:
        return len(self.matching.calls) + len(set(self.layout_nodes))  # calls hash by identity


def plan_pairs(trace_a: Trace, trace_b: Trace, rules: RenameRules, *, match: str = "auto",
               slots: SlotRules | None = None) -> Plan:
    """Match calls, pair their tensors and relate layouts (see the module docstring)."""
    matching = _without_delegates_on_sizes(match_nodes(trace_a, trace_b, rules, match), trace_b)
    values = Values(trace_a, trace_b)
    consumption = Consumption(matching.pairs, matching.nodes_b, values)
    pairs: list[Pair] = []
    unmatched_a: list[Unmatched] = []
    unmatched_b: list[Unmatched] = []
    suggested_slots: list[tuple[str, str, str]] = []
    for call in matching.calls:
        node_a, node_b = call.node_a, call.node_b
        parameters = (trace_a.forward_parameters(node_a), trace_b.forward_parameters(node_b))
        tensors, only_a, only_b = pair_tensors(node_a, node_b, slots, values, parameters)
        # inputs not to compare, kept from the re-laid leftovers below: the inputs of a pair compared on its
        # outputs only (they differ by design), and those that are two points of one computation (consumed.py)
        if call.outputs_only:
            outputs = {id(record) for record in node_a.outputs()}
            aside = [(ra, rb) for ra, rb in tensors if id(ra) not in outputs]
            slots_aside = ["inputs"]
        else:
            aside = consumption.set_aside(node_a, node_b, tensors)
            slots_aside = [ra.slot for ra, _ in aside]
        if slots_aside:
            pattern = "^" + any_layer(node_a.relative_path.split(".")) + "$"
            suggested_slots += [rule for rule in dict.fromkeys((pattern, slot, "") for slot in slots_aside)
                                if rule not in suggested_slots]
        left = {id(ra) for ra, _ in aside}
        pairs += [pair_of(node_a, ra, node_b, rb, by=call.matched_by, evidence=call.evidence,
                          transform=_relayout(trace_a, ra, trace_b, rb)) for ra, rb in tensors if id(ra) not in left]
        for ra, rb, transform in _relaid_leftovers(trace_a, only_a, trace_b, only_b):
            pairs.append(pair_of(node_a, ra, node_b, rb, transform=transform))
            only_a, only_b = [t for t in only_a if t is not ra], [t for t in only_b if t is not rb]
        only_a += [ra for ra, _ in aside]
        only_b += [rb for _, rb in aside]
        unmatched_a += [Unmatched(node_a.module_path, node_a.call_index, t.slot) for t in only_a]
        unmatched_b += [Unmatched(node_b.module_path, node_b.call_index, t.slot) for t in only_b]
    # calls that compute nothing take no part in a fused projection
    unpaired_a = {id(n) for n in matching.unmatched_a if id(n) not in matching.idle}
    unpaired_b = {id(n) for n in matching.unmatched_b if id(n) not in matching.idle}
    layout_nodes: list[tuple[Node, Node]] = []
    if match != "name":
        # an exported graph's modules are its grouped calls: an op node (a delegate's boundary) is no fused module,
        # and its sizes alone would pair it with one
        fusable_b = unpaired_b - {id(n) for n in matching.unmatched_b if n.graph} if _exported(trace_b) else unpaired_b
        offered = set(fusable_b)
        for found in find_fused(trace_a, trace_b, list(matching.pairs), unpaired_a, fusable_b):
            pairs.append(pair_of(found.node_a, found.record_a, found.node_b, found.record_b, by=MatchedBy.LAYOUT,
                                 transform=found.transform))  # the fused calls' inputs too, compared as recorded
            layout_nodes.append((found.node_a, found.node_b))
        unpaired_b -= offered - fusable_b  # the calls fused above
    # an output of a paired call, made in B by a call with no partner, is compared there too
    relaid_b = {id(node_b) for _, node_b in layout_nodes}
    producers = set()
    for made in find_producers(list(pairs), unpaired_b - relaid_b):
        pairs.append(made_by(made.pair, made.node, made.record))
        producers.add(id(made.node))
        unmatched_b += [Unmatched(made.node.module_path, made.node.call_index, t.slot)
                        for t in made.node.tensors if t is not made.record]
    # calls holding no tensor (only caches, flags) are not counted as unmatched
    left_a = [n for n in matching.unmatched_a if (id(n) in unpaired_a or id(n) in matching.idle) and n.tensors]
    left_b = [n for n in matching.unmatched_b if (id(n) in unpaired_b or id(n) in matching.idle) and n.tensors
              and id(n) not in producers]
    suggested: RenameRules = []
    if matching.count(MatchedBy.STRUCTURE) or layout_nodes:
        suggested = suggest_rules(matching.pairs, [n.relative_path for n in matching.unmatched_a],
                                  [n.relative_path for n in matching.nodes_b])
    return Plan(
        matching=matching, values=values, pairs=tuple(pairs),
        unmatched_a=tuple([Unmatched(n.module_path, n.call_index) for n in left_a] + unmatched_a),
        unmatched_b=tuple([Unmatched(n.module_path, n.call_index) for n in left_b] + unmatched_b),
        layout_nodes=tuple(layout_nodes), warnings=tuple(_coverage_warnings(matching, match)),
        suggested=suggested, suggested_slots=tuple(suggested_slots),
    )


def _relayout(trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord) -> Transform | None:
    """A layout transform for a pair whose shapes differ beyond dimensions of size 1 (those compare as they are;
    in an exported graph, where a module's output may come out flattened, as the reshape it is)."""
    if ra.shape == rb.shape or ra.shape is None or rb.shape is None:
        return None
    if squeezed(ra.shape) == squeezed(rb.shape):
        return Transform("a", (("reshape", tuple(rb.shape)),)) if _exported(trace_b) else None
    return find_relayout(trace_a, ra, trace_b, rb)


def _relaid_leftovers(trace_a: Trace, only_a: list[TensorRecord], trace_b: Trace, only_b: list[TensorRecord]
                      ) -> list[tuple[TensorRecord, TensorRecord, Transform]]:
    """The one tensor left on each side of a kind (inputs, outputs), re-laid out: ``outputs`` ``[B, T, H, D]``
    against ``outputs.0`` ``[B, H, T, D]``."""
    found: list[tuple[TensorRecord, TensorRecord, Transform]] = []
    if not (only_a and only_b):
        return found
    for head in ("inputs", "outputs"):
        left_a = [t for t in only_a if t.slot.split(".")[0] == head]
        left_b = [t for t in only_b if t.slot.split(".")[0] == head]
        if len(left_a) == 1 and len(left_b) == 1:
            transform = _relayout(trace_a, left_a[0], trace_b, left_b[0])
            if transform is not None:
                found.append((left_a[0], left_b[0], transform))
    return found


def _without_delegates_on_sizes(matching: Matching, trace_b: Trace) -> Matching:
    """A delegated region's boundary (a graph node whose attributes name its ``delegate``: ExecuTorch's XNNPACK
    call) stands for the region, never for one module inside it: paired with a module call on sizes alone it is
    no evidence of one computation, so both are left unpaired (a weak pair never decides a verdict)."""
    if not _exported(trace_b):
        return matching
    weak = [call for call in matching.calls if call.evidence == Evidence.SHAPE and call.node_b.graph
            and call.node_b.module_type != GRAPH_BLOCK and "delegate" in call.node_b.attributes]
    if not weak:
        return matching
    dropped = {id(call) for call in weak}
    return replace(matching, calls=tuple(call for call in matching.calls if id(call) not in dropped),
                   unmatched_a=matching.unmatched_a + tuple(call.node_a for call in weak),
                   unmatched_b=matching.unmatched_b + tuple(call.node_b for call in weak))


def _exported(trace: Trace) -> bool:
    """A graph whose scopes are the module paths it was exported from (ONNX, OpenVINO, ExecuTorch)."""
    return trace.graph is not None and trace.graph.scopes == "modules"


def _inside_graph_call(node: Node) -> bool:
    return node.graph and node.parent is not None and node.parent.module_type == GRAPH_BLOCK


def _coverage_warnings(matching: Matching, match: str) -> list[str]:
    # a graph's op nodes inside its grouped calls have no module to pair with: only the calls are counted
    forward_b = [n for n in matching.nodes_b if n.phase == "forward" and not _inside_graph_call(n)]
    by_names = sum(1 for call in matching.calls
                   if call.matched_by in (MatchedBy.NAME, MatchedBy.MAP) and call.node_b.phase == "forward")
    by_structure = matching.count(MatchedBy.STRUCTURE)
    if match == "structure":
        return [f"matched {len(matching.pairs)} module calls by structure (--match structure); "
                "check the suggested rename map"]
    if matching.structural or not forward_b or by_names >= LOW_COVERAGE * len(forward_b):
        return []
    more = f"; {by_structure} more paired by structure" if by_structure else ""
    return [f"only {by_names} of {len(forward_b)} module calls of B matched by name or rename map{more}. "
            "Check the pairs (matched_by column) and the suggested rename map (--suggest-map FILE)"]
