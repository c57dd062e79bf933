"""Calls of B with no partner that made an output of a paired call: where such a value was computed.

A reference may compute in a call's own code what the port computes in a submodule: torchtune's tied
output projection is a function of the token embedding, transformers' is ``lm_head``. ``lm_head`` then has
no partner, and a wrong ``lm_head`` would show only at the output of the whole model. When an unpaired call
inside a paired call of B returned the very tensor that the paired call returns (the same payload, or with
no payloads the same shape, dtype and statistics), the pair's output is also compared at that call:
``matched_by="output"``. The row comes first, so a divergence made there is named there.

The search stops at paired calls (their outputs have pairs of their own), and skips calls that return one
of their inputs (a dropout in eval mode computes nothing).

The same question asked of the first divergence (:func:`likely_source`): a call of B with no partner whose
outputs feed it (transformers' ``rotary_emb``, a relative-position bias computed once) is named as the
likely site, with the evidence.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ...trace.model import Node, TensorRecord
from ..pair import Pair
from ..result import LikelySource, TensorComparison


@dataclass(frozen=True)
class Produced:
    """B's ``record`` of ``node`` (unpaired) is the value of ``pair``'s B record."""

    pair: Pair
    node: Node
    record: TensorRecord


def find_producers(pairs: list[Pair], unpaired_b: set[int]) -> Iterator[Produced]:
    """For each pair of an output, the innermost unpaired call of B below it that returned that output."""
    for pair in pairs:
        node_b, record_b = pair.node_b, pair.record_b
        if node_b.op is not None or not any(record is record_b for record in node_b.outputs()):
            continue
        found = _innermost(node_b, record_b, unpaired_b)
        if found is not None:
            yield Produced(pair, *found)


def _innermost(parent: Node, value: TensorRecord, unpaired: set[int]) -> tuple[Node, TensorRecord] | None:
    for child in reversed(parent.children):  # the value is made late: the last calls first
        if id(child) not in unpaired:
            continue
        deeper = _innermost(child, value, unpaired)
        if deeper is not None:
            return deeper
        made = _returned(child, value)
        if made is not None:
            return child, made
    return None


def _returned(node: Node, value: TensorRecord) -> TensorRecord | None:
    """The output of ``node`` that is ``value``, when ``node`` made it (did not take it as an input too)."""
    made = next((r for r in node.outputs() if _same_value(r, value)), None)
    return made if made is not None and not any(_same_value(r, value) for r in node.inputs()) else None


def _same_value(one: TensorRecord, other: TensorRecord) -> bool:
    """The same tensor of one trace: one payload, or (no payloads) the same shape, dtype and statistics."""
    if one.payload is not None or other.payload is not None:
        return one.payload == other.payload
    return (one.shape == other.shape and one.dtype == other.dtype and bool(one.stats)
            and one.stats == other.stats and bool(one.stats.get("std")))


def likely_source(first: TensorComparison, pairs: Sequence[Pair], unpaired_b: list[Node]) -> LikelySource | None:
    """B's call with no partner whose outputs feed the first divergence, when there is one (issue 35).

    What feeds the first divergence: the diverging tensor itself when it is an input (it changed between recorded
    calls), the inputs of its call compared with nothing before it (only B has them: a rotary table, a relative-
    position bias), and for an input, those of the caller whose code made it. A call of B with no partner that ran
    before and returned one of them (the same payload) computed something two traces cannot compare. When that
    call itself reads values compared nowhere that an earlier call with no partner returned (an attention with no
    partner reading ``rotary_embeddings``' tables), the search goes on there: the likely source is where the
    uncompared values start, and the evidence names every link. None when no such call feeds the first divergence.
    """
    if first.order >= len(pairs):
        return None
    node_b, record_b = pairs[first.order].node_b, pairs[first.order].record_b
    # compared before the first divergence, so within tolerance; a value compared only later vouches for nothing
    before = [pair.record_b for pair in pairs[:first.order]]
    compared = {id(record) for record in before}
    compared_payloads = {record.payload for record in before if record.payload is not None}

    def uncompared(node: Node) -> list[TensorRecord]:
        return [r for r in node.inputs() if id(r) not in compared
                and (r.payload is None or r.payload not in compared_payloads)]

    feeding: list[tuple[Node, TensorRecord, str]] = []
    if first.tensor.startswith("inputs"):
        feeding.append((node_b, record_b, f"diverged, max_abs_err {first.max_abs_err:.3g}"))
        if node_b.parent is not None:  # the caller's own code made it, from what it was given
            feeding += [(node_b.parent, r, "compared with nothing before") for r in uncompared(node_b.parent)]
    feeding += [(node_b, r, "compared with nothing before") for r in uncompared(node_b) if r is not record_b]
    evidence: list[str] = []
    found: Node | None = None
    seen: set[int] = set()
    while feeding:
        producer = _producer(feeding, unpaired_b, seen)
        if producer is None:
            break
        node, made, consumer, record, how = producer
        seen.add(id(node))
        evidence.append(f"{node.module_path} {made.slot} is {consumer.module_path} {record.slot} ({how})")
        found = node
        feeding = [(node, r, "compared with nothing before") for r in uncompared(node)]
    if found is None:
        return None
    # the diverging tensor itself came from it (through calls with no partner), or only what the code that made
    # the divergence also read: then it may hold the mistake, or that code may, and two traces cannot say which
    direct = "(diverged" in evidence[0]
    how = "its outputs are the diverging tensor" if direct and len(evidence) == 1 else \
        "it feeds the diverging tensor through calls with no partner either" if direct else \
        "the code that made the first divergence read its outputs (or that code holds the mistake: two traces " \
        "cannot say which)"
    return LikelySource(module_path_b=found.module_path, call_index=found.call_index, evidence=tuple(evidence),
                        reason=f"{found.module_path} has no partner in A, so what it computes was compared "
                               f"nowhere; {how}")


def _producer(feeding: list[tuple[Node, TensorRecord, str]], unpaired_b: list[Node], seen: set[int]
              ) -> tuple[Node, TensorRecord, Node, TensorRecord, str] | None:
    """The latest unpaired call that ran before a consumer of ``feeding`` and returned one of its values."""
    for consumer, record, how in feeding:
        enclosing = set()
        parent: Node | None = consumer
        while parent is not None:
            enclosing.add(id(parent))
            parent = parent.parent
        before = [n for n in unpaired_b if n.enter_order < consumer.enter_order and id(n) not in enclosing
                  and id(n) not in seen]
        for node in sorted(before, key=lambda n: -n.enter_order):
            made = _returned(node, record)
            if made is not None:
                return node, made, consumer, record, how
    return None
