"""The one place a tensor pair is made (:class:`tracediff.alignment.pair.Pair`): found by pairing, re-laid
by a layout decided later, or found as the output B made in a call of its own."""

from __future__ import annotations

from ...trace.model import Node, TensorRecord
from ..pair import Evidence, MatchedBy, Pair
from .layout import Transform


def pair_of(node_a: Node, record_a: TensorRecord, node_b: Node, record_b: TensorRecord, *,
            by: MatchedBy = MatchedBy.NAME, evidence: Evidence = Evidence.NAME,
            transform: Transform | None = None) -> Pair:
    """The one way a pair is made. A pair compared through a layout ``transform`` is found by ``layout``,
    whatever found its calls."""
    if transform is not None:
        by = MatchedBy.LAYOUT
    return Pair(node_a, record_a, node_b, record_b, by, evidence, transform)


def relaid(pair: Pair, transform: Transform) -> Pair:
    """``pair`` compared through ``transform`` (a layout decided after the first comparison)."""
    return pair_of(pair.node_a, pair.record_a, pair.node_b, pair.record_b, evidence=pair.evidence, transform=transform)


def made_by(pair: Pair, node_b: Node, record_b: TensorRecord) -> Pair:
    """A's side of ``pair`` against ``record_b``, which B's ``node_b`` returned (:mod:`.producers`): found as an
    ``output``, on the evidence of ``pair``'s calls."""
    return pair_of(pair.node_a, pair.record_a, node_b, record_b, by=MatchedBy.OUTPUT, evidence=pair.evidence)
