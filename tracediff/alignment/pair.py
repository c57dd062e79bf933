"""One tensor pair ``tracediff.align`` compares: A's call and record, B's, and how the pair was made.

Every pair is made by :func:`tracediff.alignment.pairing.make.pair_of` and never changes: a stage that
decides a new layout for a pair (:func:`~tracediff.alignment.pairing.make.relaid`) makes a new pair.
Pairing makes pairs and the stages after it read them (verdicts too: this module is theirs to share, as
``result.py`` is). A row reports a pair's ``matched_by`` (:class:`MatchedBy`: how it was found), its
``pairing`` (:attr:`Pair.rests_on`, an :class:`Evidence`: what it rests on) and its ``transform``, with
the values of the enums as the report's strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..trace.model import Node, TensorRecord
from .pairing.layout import Transform


class MatchedBy(str, Enum):
    """How a pair was found: the row's ``matched_by``.

    Calls pair by ``name`` (their paths), ``map`` (the user's rename map) or ``structure`` (values, sizes and
    call order); a tensor pair related by a layout transform is ``layout``; an output of a paired call that B
    made in a call of its own is ``output`` (:mod:`.pairing.producers`). Ops pair by ``dataflow`` (same inputs),
    ``value`` (their outputs agree) or ``name`` (aligned as sequences), see :mod:`.pairing.dataflow`.
    """

    NAME = "name"
    MAP = "map"
    STRUCTURE = "structure"
    LAYOUT = "layout"
    OUTPUT = "output"
    DATAFLOW = "dataflow"
    VALUE = "value"


class Evidence(str, Enum):
    """What a pair rests on, strongest first: the row's ``pairing`` (see docs/matching.md)."""

    MAP = "map"
    VALUE = "value"
    NAME = "name"
    SHAPE = "shape"


@dataclass(frozen=True, slots=True, eq=False)  # two pairs are the same pair only when they are one object
class Pair:
    """A's ``node_a`` and its ``record_a`` against B's ``node_b`` and ``record_b``; made by
    :func:`tracediff.alignment.pairing.make.pair_of`."""

    node_a: Node
    record_a: TensorRecord
    node_b: Node
    record_b: TensorRecord
    matched_by: MatchedBy
    evidence: Evidence  # what the pairing of its calls (or ops) rests on
    transform: Transform | None  # what is done to one side before comparing; None: compared as recorded

    @property
    def rests_on(self) -> Evidence:
        """The row's ``pairing``: a pair compared through a layout rests on values, whatever paired its calls
        (only the values chose that layout)."""
        return Evidence.VALUE if self.matched_by is MatchedBy.LAYOUT else self.evidence

    @property
    def paths(self) -> tuple[str, str]:
        """Both calls' relative paths: what a per-path tolerance is resolved on."""
        return self.node_a.relative_path, self.node_b.relative_path

    @property
    def transform_text(self) -> str | None:
        """The row's ``transform``: the steps as code, ``A.permute(0,2,1,3) ~ B`` (None: as recorded)."""
        return self.transform.describe(len(self.record_a.shape or ())) if self.transform is not None else None


@dataclass(frozen=True, slots=True, eq=False)
class CallPair:
    """A's call ``node_a`` paired with B's ``node_b`` (:mod:`.pairing.calls`): by ``name``, ``map`` or ``structure``, on
    ``evidence``; ``outputs_only``: their inputs differ by design and are not compared (a call paired by what its
    outputs hold, or by what it hands on)."""

    node_a: Node
    node_b: Node
    matched_by: MatchedBy
    evidence: Evidence
    outputs_only: bool = False
