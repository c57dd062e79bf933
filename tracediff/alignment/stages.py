"""What each stage of ``tracediff.align`` hands the next: load -> pair -> measure -> judge -> report.

Each stage (:mod:`tracediff.alignment.engine`) is a function of the results before it, returning one of
these frozen objects; no stage changes another's result. The one thing handed on open is the row drafts
(:mod:`tracediff.alignment.rows`): ``measure`` makes them and hands them to ``judge``, which decides and
freezes them, so that a row is built once however many stages decide it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..compare.measurement import Measurement
from ..compare.tolerance import TolerancePolicy
from ..maps.rules import RenameMap
from ..trace.load import Trace
from .lm_results import LogitsVerdict
from .lm_verdicts import TokenSpans
from .ops import OpPairing
from .pair import Pair
from .pairing.plan import Plan
from .result import TensorComparison, Unmatched
from .rows import RowDraft
from .verdicts.apply import Verdicts

if TYPE_CHECKING:  # a distributed alignment imports its module when it happens
    from .distributed import Merged


@dataclass(frozen=True)
class Settings:
    """``align``'s options, checked: how pairs are found, measured and judged."""

    policy: TolerancePolicy
    map: RenameMap
    match: str
    ignore: tuple[tuple[str, str], ...]
    logits: tuple[str, ...]
    noise_factor: float
    step: int | None

    def tolerance(self, pair: Pair) -> tuple[float, float]:
        """The pair's (atol, rtol): per path pattern, else the default for its dtypes."""
        return self.policy.resolve(pair.paths, pair.record_a.dtype, pair.record_b.dtype)


@dataclass(frozen=True)
class Loaded:
    """load: the traces compared (cut to the decode steps compared) and the baseline."""

    a: Trace
    b: Trace
    baseline: Trace | None
    sharded: bool  # a side is a multi-rank trace
    step_counts: tuple[int, int]  # the decode steps each trace held before the cut
    step_note: str | None  # which steps were left out, when some were
    spans: TokenSpans  # where B's decode steps sit along the sequence
    placed: str | None = None  # B's unscoped graph nodes were placed under A's modules by values: the warning


@dataclass(frozen=True)
class Paired:
    """pair: every tensor pair to compare, in B's order, and what found no partner."""

    plan: Plan
    ops: OpPairing
    pairs: tuple[Pair, ...]
    unmatched_a: tuple[Unmatched, ...]
    unmatched_b: tuple[Unmatched, ...]


@dataclass(frozen=True)
class Measured:
    """measure: a row draft and a measurement per pair, the pairs as compared (``Paired.pairs`` with the
    rotary orders decided on their rows) and, distributed, what rank 0 merged."""

    pairs: tuple[Pair, ...]
    drafts: tuple[RowDraft, ...]  # handed on to judge, which decides and freezes them
    measurements: tuple[Measurement, ...]
    merged: Merged | None

    @property
    def sliced(self) -> Mapping[int, Any]:
        """Rows (by order) whose pair is never read whole on rank 0: measured in parts where B's shards live."""
        return self.merged.apart if self.merged is not None else {}


@dataclass(frozen=True)
class Judged:
    """judge: the decided rows (frozen, by order), which of them are kept, sources or set aside, and the
    logits verdicts."""

    rows: tuple[TensorComparison, ...]
    verdicts: Verdicts
    logits: tuple[LogitsVerdict, ...]
