"""From two traces to the tensor pairs ``tracediff.align`` compares, and how each was found.

Calls are matched (:mod:`tracediff.alignment.pairing.calls`), tensors within
matched calls are paired (:mod:`tracediff.alignment.pairing.slots`), then layouts
relate what is left (:mod:`tracediff.alignment.pairing.layout`): fused calls among
the unpaired children of matched calls, and tensors of a matched call whose
shapes differ; last, an output of a matched call that B made in a call with
no partner is paired there too (:mod:`tracediff.alignment.pairing.producers`).
Each pair remembers how it was found (``matched_by``: name, map, structure,
layout or output) and the transform relating it, if any.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ...compare.measurement import Measurement
from ...compare.shapes import squeezed
from ...maps.rules import RenameRules, SlotRules
from ...maps.suggest import any_layer, suggest_rules
from ...trace.load import Trace
from ...trace.model import Node, TensorRecord
from ..result import Job, Unmatched
from .calls import Matching, match_nodes
from .consumed import Consumption
from .evidence import Values
from .layout import Transform, compare_transformed, find_fused, find_relayout
from .producers import find_producers
from .slots import pair_tensors
from .unrecorded import all_unrecorded

# below this share of B's calls paired by name or map, the report warns (it never switches to structure)
LOW_COVERAGE = 0.5


@dataclass
class Plan:
    """Everything pairing found, ready for the engine to compare."""

    matching: Matching
    values: Values = field(default_factory=Values)
    jobs: list[Job] = field(default_factory=list)
    unmatched_a: list[Unmatched] = field(default_factory=list)
    unmatched_b: list[Unmatched] = field(default_factory=list)
    # (id of A's record, id of B's record) -> (matched_by, layout transform), for the pairs not found by name
    # alone; a pair missing here was paired by name, as is, which is what a row says by default
    how: dict[tuple[int, int], tuple[str, Transform | None]] = field(default_factory=dict)
    # (id of A's record, id of B's record) -> the evidence of the pair when it is not "name" (see Matching.evidence)
    pairing: dict[tuple[int, int], str] = field(default_factory=dict)
    layout_nodes: list[tuple[Node, Node]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    suggested: RenameRules = field(default_factory=list)
    # slot rules setting aside the inputs of the pairs compared on their outputs only (calls.Matching.outputs_only),
    # so that a suggested map passed back with --map compares what the pairing compared
    suggested_slots: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def unrecorded_a(self) -> tuple[str, ...]:
        return all_unrecorded(self.matching.gaps_a)

    @property
    def unrecorded_b(self) -> tuple[str, ...]:
        return all_unrecorded(self.matching.gaps_b)

    @property
    def matched_nodes(self) -> int:
        return len(self.matching.pairs) + len({(id(a), id(b)) for a, b in self.layout_nodes})

    def compare(self, trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord, *, atol: float,
                rtol: float) -> Measurement | None:
        """The pair's measurement when a transform relates it; None to compare it the usual way."""
        transform = self.how.get((id(ra), id(rb)), ("", None))[1]
        if transform is None:
            return None
        return compare_transformed(trace_a, ra, trace_b, rb, transform, atol=atol, rtol=rtol)

    def annotations(self, jobs: list[Job]) -> Iterator[tuple[int, str | None, str | None, str]]:
        """For each job not paired by name as is: its index, ``matched_by`` (None: as the row says),
        ``transform`` (described) and ``pairing``."""
        for i, (_, ra, _, rb) in enumerate(jobs):
            key = (id(ra), id(rb))
            method, transform = self.how.get(key, (None, None))
            evidence = "value" if method == "layout" else self.pairing.get(key)
            if method is None and evidence is None:
                continue
            text = transform.describe(len(ra.shape or ())) if transform is not None else None
            yield i, method, text, evidence or "name"

def plan_pairs(trace_a: Trace, trace_b: Trace, rules: RenameRules, *, match: str = "auto",
               slots: SlotRules | None = None) -> Plan:
    """Match calls, pair their tensors and relate layouts (see the module docstring)."""
    matching = match_nodes(trace_a, trace_b, rules, match)
    values = Values(trace_a, trace_b)
    plan = Plan(matching=matching, values=values)
    consumption = Consumption(matching.pairs, matching.nodes_b, values)
    for (node_a, node_b), method, evidence in zip(matching.pairs, matching.methods, matching.evidence):
        parameters = (trace_a.forward_parameters(node_a), trace_b.forward_parameters(node_b))
        pairs, only_a, only_b = pair_tensors(node_a, node_b, slots, values, parameters)
        # inputs not to compare, kept from the re-laid leftovers below: the inputs of a pair compared on its
        # outputs only (they differ by design), and those that are two points of one computation (consumed.py)
        if (id(node_a), id(node_b)) in matching.outputs_only:
            outputs = {id(record) for record in node_a.outputs()}
            aside = [(ra, rb) for ra, rb in pairs if id(ra) not in outputs]
            slots_aside = ["inputs"]
        else:
            aside = consumption.set_aside(node_a, node_b, pairs)
            slots_aside = [ra.slot for ra, _ in aside]
        if slots_aside:
            pattern = "^" + any_layer(node_a.relative_path.split(".")) + "$"
            plan.suggested_slots += [rule for rule in dict.fromkeys((pattern, slot, "") for slot in slots_aside)
                                     if rule not in plan.suggested_slots]
        left = {id(ra) for ra, _ in aside}
        pairs = [(ra, rb) for ra, rb in pairs if id(ra) not in left]
        for ra, rb in pairs:
            if evidence != "name":
                plan.pairing[(id(ra), id(rb))] = evidence
            transform = _relayout(trace_a, ra, trace_b, rb)
            if transform is not None or method != "name":  # rows say "name" unless told otherwise
                plan.how[(id(ra), id(rb))] = ("layout" if transform is not None else method, transform)
            plan.jobs.append((node_a, ra, node_b, rb))
        for ra, rb, transform in _relaid_leftovers(trace_a, only_a, trace_b, only_b):
            plan.how[(id(ra), id(rb))] = ("layout", transform)
            plan.jobs.append((node_a, ra, node_b, rb))
            only_a, only_b = [t for t in only_a if t is not ra], [t for t in only_b if t is not rb]
        only_a += [ra for ra, _ in aside]
        only_b += [rb for _, rb in aside]
        plan.unmatched_a += [Unmatched(node_a.module_path, node_a.call_index, t.slot) for t in only_a]
        plan.unmatched_b += [Unmatched(node_b.module_path, node_b.call_index, t.slot) for t in only_b]
    # calls that compute nothing take no part in a fused projection
    unpaired_a = {id(n) for n in matching.unmatched_a if id(n) not in matching.idle}
    unpaired_b = {id(n) for n in matching.unmatched_b if id(n) not in matching.idle}
    if match != "name":
        for found in find_fused(trace_a, trace_b, list(matching.pairs), unpaired_a, unpaired_b):
            plan.how[(id(found.record_a), id(found.record_b))] = ("layout", found.transform)
            plan.jobs.append((found.node_a, found.record_a, found.node_b, found.record_b))
            plan.layout_nodes.append((found.node_a, found.node_b))
    # an output of a paired call, made in B by a call with no partner, is compared there too
    relaid_b = {id(node_b) for _, node_b in plan.layout_nodes}
    producers = set()
    for made in find_producers(list(plan.jobs), unpaired_b - relaid_b):
        node_a, record_a, _, record_b = made.job
        key = (id(record_a), id(made.record))
        plan.how[key] = ("output", None)
        if (id(record_a), id(record_b)) in plan.pairing:
            plan.pairing[key] = plan.pairing[(id(record_a), id(record_b))]
        plan.jobs.append((node_a, record_a, made.node, made.record))
        producers.add(id(made.node))
        plan.unmatched_b += [Unmatched(made.node.module_path, made.node.call_index, t.slot)
                             for t in made.node.tensors if t is not made.record]
    # calls holding no tensor (only caches, flags) are not counted as unmatched
    left_a = [n for n in matching.unmatched_a if (id(n) in unpaired_a or id(n) in matching.idle) and n.tensors]
    left_b = [n for n in matching.unmatched_b if (id(n) in unpaired_b or id(n) in matching.idle) and n.tensors
              and id(n) not in producers]
    plan.unmatched_a = [Unmatched(n.module_path, n.call_index) for n in left_a] + plan.unmatched_a
    plan.unmatched_b = [Unmatched(n.module_path, n.call_index) for n in left_b] + plan.unmatched_b
    plan.warnings = _coverage_warnings(matching, match)
    if any(m == "structure" for m in matching.methods) or plan.layout_nodes:
        plan.suggested = suggest_rules(matching.pairs, [n.relative_path for n in matching.unmatched_a],
                                       [n.relative_path for n in matching.nodes_b])
    return plan


def _relayout(trace_a: Trace, ra: TensorRecord, trace_b: Trace, rb: TensorRecord) -> Transform | None:
    """A layout transform for a pair whose shapes differ beyond dimensions of size 1 (those compare as they are)."""
    if ra.shape == rb.shape or ra.shape is None or rb.shape is None or squeezed(ra.shape) == squeezed(rb.shape):
        return None
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


def _coverage_warnings(matching: Matching, match: str) -> list[str]:
    forward_b = [n for n in matching.nodes_b if n.phase == "forward"]
    by_names = sum(1 for (_, y), m in zip(matching.pairs, matching.methods)
                   if m in ("name", "map") and y.phase == "forward")
    by_structure = matching.count("structure")
    if match == "structure":
        return [f"matched {len(matching.pairs)} module calls by structure (--match structure); "
                "check the suggested rename map"]
    if matching.structural or not forward_b or by_names >= LOW_COVERAGE * len(forward_b):
        return []
    more = f"; {by_structure} more paired by structure" if by_structure else ""
    return [f"only {by_names} of {len(forward_b)} module calls of B matched by name or rename map{more}. "
            "Check the pairs (matched_by column) and the suggested rename map (--suggest-map FILE)"]
