"""The result of comparing two training records: typed, frozen, renderable elsewhere."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..display import short_repr, summary_html

if TYPE_CHECKING:
    import pandas as pd

Status = Literal["identical", "within_tolerance", "diverged"]
Clause = Literal["missing", "not_recorded", "identical", "values", "layout", "special_values", "exact",
                 "no_statistics", "tolerance"]
FORMAT_VERSION = 1
STEP_COLUMNS = (
    "step", "rank", "status", "compared", "differ", "diverged", "max_drift", "max_rel_drift",
    "first_group", "first_name", "complete_a", "complete_b",
)


@dataclass(frozen=True)
class Verdict:
    """How one entry of run B compares with the same entry of run A (see :mod:`tracediff.steps.rule`)."""

    status: Status
    clause: Clause
    """The clause of the rule that decided."""
    reason: str
    drift: float | None = None
    """Largest absolute difference of a tolerance statistic, when both entries have statistics."""
    rel_drift: float | None = None
    """The same, relative to run A's value."""

    @property
    def passed(self) -> bool:
        """True when the entries are identical or within tolerance (a verdict has no truth value of its own)."""
        return self.status != "diverged"

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"


@dataclass(frozen=True)
class StatRow:
    """One line of the side-by-side view: a field or statistic, its value in each run, and B - A."""

    name: str
    a: Any
    b: Any
    diff: float | None = None


@dataclass(frozen=True)
class StepDivergence:
    """The first entry that diverges: where (step, rank, group, name), why, and both sides.

    ``group`` is one of ``rngs``, ``batch``, ``params``, ``buffers``, ``grads``,
    ``optimizer``; ``name`` is a parameter or buffer name (``layers.0.attn.q.weight``),
    a batch path (``batch.input_ids``), an RNG (``torch.cpu``) or an optimizer
    path (``param_groups.0.lr``, ``state.fc.weight.exp_avg``).
    """

    step: int
    rank: int
    group: str
    name: str
    reason: str
    a: dict[str, Any] | None
    b: dict[str, Any] | None
    stats: tuple[StatRow, ...] = ()
    drift: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step, "rank": self.rank, "group": self.group, "name": self.name, "reason": self.reason,
            "drift": self.drift, "a": self.a, "b": self.b, "stats": [asdict(row) for row in self.stats],
        }


@dataclass(frozen=True)
class StepSummary:
    """One row of the per-step table: how many entries were compared, differ, diverge; the largest drift."""

    step: int
    rank: int
    status: Status
    compared: int
    differ: int
    """Entries whose hash or value differs (within tolerance or not)."""
    diverged: int
    """Entries beyond tolerance (all of ``differ`` when ``atol == rtol == 0``)."""
    max_drift: float | None
    max_rel_drift: float | None
    first_group: str | None
    first_name: str | None
    complete_a: bool
    complete_b: bool

    def to_dict(self) -> dict[str, Any]:
        return {column: getattr(self, column) for column in STEP_COLUMNS}


@dataclass(frozen=True, eq=False)
class StepComparison:
    """Two training records compared step by step; truthy when they agree within tolerance.

    ``steps`` is a DataFrame with one row per ``(step, rank)`` recorded in both
    runs (columns ``STEP_COLUMNS``); ``only_in_a``/``only_in_b`` list the steps
    that only one run recorded. ``needed_atol`` is the smallest ``atol`` (with
    ``rtol=0``) under which every differing tensor would pass, or None when
    some difference cannot pass any tolerance (a value, a shape, a missing
    entry, NaN counts, or no statistics recorded).
    """

    run_a: str
    run_b: str
    atol: float
    rtol: float
    passed: bool
    first_divergence: StepDivergence | None
    step_summaries: tuple[StepSummary, ...]
    only_in_a: tuple[int, ...]
    only_in_b: tuple[int, ...]
    groups: tuple[str, ...]
    """Groups compared: those both runs recorded, in causal order."""
    groups_skipped: tuple[str, ...]
    """Groups only one run recorded."""
    needed_atol: float | None
    reason: str | None = None
    """Why nothing could be compared (then ``verdict`` is ``"undecided"``); None when something was."""

    @property
    def verdict(self) -> str:
        """``"passed"``, ``"diverged"``, or ``"undecided"`` when nothing was compared (see ``reason``)."""
        return "undecided" if self.reason is not None else "passed" if self.passed else "diverged"

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        first = self.first_divergence
        return short_repr(self, passed=self.passed, steps=len(self.step_summaries), verdict=self.verdict,
                          first_divergence=_describe(first), run_a=self.run_a, run_b=self.run_b)

    def _repr_html_(self) -> str:
        facts = [("run A", self.run_a), ("run B", self.run_b), ("steps compared", len(self.step_summaries)),
                 ("groups", ", ".join(self.groups)), ("tolerance", f"atol={self.atol:g} rtol={self.rtol:g}"),
                 ("first divergence", _describe(self.first_divergence)),
                 ("first divergence reason", self.first_divergence.reason if self.first_divergence else None),
                 ("needed atol", self.needed_atol)]
        return summary_html("StepComparison", facts, verdict=self.verdict)

    @property
    def steps(self) -> pd.DataFrame:
        """The per-step summary as a DataFrame (one row per shared ``(step, rank)``)."""
        import pandas as pd

        return pd.DataFrame([s.to_dict() for s in self.step_summaries], columns=list(STEP_COLUMNS))

    def to_dict(self) -> dict[str, Any]:
        """Plain data with ``format_version``; NaN and infinities stay Python floats."""
        return {
            "format_version": FORMAT_VERSION,
            "passed": self.passed,
            "verdict": self.verdict,
            "reason": self.reason,
            "run_a": self.run_a,
            "run_b": self.run_b,
            "atol": self.atol,
            "rtol": self.rtol,
            "first_divergence": self.first_divergence.to_dict() if self.first_divergence else None,
            "steps": [s.to_dict() for s in self.step_summaries],
            "only_in_a": list(self.only_in_a),
            "only_in_b": list(self.only_in_b),
            "groups": list(self.groups),
            "groups_skipped": list(self.groups_skipped),
            "needed_atol": self.needed_atol,
        }


def _describe(first: StepDivergence | None) -> str | None:
    """``"step 3 rank 0 optimizer param_groups.0.lr"``, or None."""
    return None if first is None else f"step {first.step} rank {first.rank} {first.group} {first.name}"
