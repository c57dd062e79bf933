"""What ``tracediff.attribute`` returns: a ranking of B's calls by the share of the final error they cause.

Columns of ``Attribution.table`` (and the keys of each ``ranking`` entry of
``to_dict()``):

=========================  ==================================================
``rank``                   1 for the call that costs the most
``module_path``            B's full module path (root class included)
``call_index``             the call of that module (0 for the first)
``module_type``            B's module class (``Linear``, ``QLinear``, ...)
``share``                  the share of B's final-output error the call
                           causes on its own, 0 to 1 (see ``engine``)
``final_error_alone``     the final-output error with every other ranked
                           call restored: this call's error alone
``local_error``            its local error on A's inputs, in units of the
                           precision noise (``x noise``)
``local_rel_rms_err``      ``rms(b - a) / rms(a)`` on A's inputs
``local_max_abs_err``      ``max |b - a|`` on A's inputs
=========================  ==================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .final import FinalError

ATTRIBUTION_FORMAT_VERSION = 1

COLUMNS = ["rank", "module_path", "call_index", "module_type", "share", "final_error_alone", "local_error",
           "local_rel_rms_err", "local_max_abs_err"]


@dataclass(frozen=True)
class AttributedCall:
    """One call of B: its local error and the share of the final error it causes."""

    module_path: str
    call_index: int
    module_type: str
    local_error: float
    local_rel_rms_err: float
    local_max_abs_err: float
    share: float
    final_error_alone: float
    rank: int

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in COLUMNS}


@dataclass(frozen=True)
class BudgetStep:
    """One greedy step of ``budget``: restoring this call together with the ones before it."""

    module_path: str
    call_index: int
    final_error_restored: float  # the final error with this call and every earlier step restored at once
    share: float                 # the share of the final error they remove together, measured jointly
    summed_share: float          # the sum of their shares measured one at a time, for comparison

    def to_dict(self) -> dict[str, Any]:
        return {"module_path": self.module_path, "call_index": self.call_index,
                "final_error_restored": self.final_error_restored, "share": self.share,
                "summed_share": self.summed_share}


@dataclass(frozen=True)
class SkippedUnit:
    """A call that could not be ranked, and why."""

    module_path: str
    call_index: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"module_path": self.module_path, "call_index": self.call_index, "reason": self.reason}


@dataclass(frozen=True)
class Attribution:
    """The result of ``tracediff.attribute``: B's calls ranked, most costly first.

    Truthy when at least one call was ranked (a ranking that ranked nothing is
    never a result to act on). ``ranking[0]`` is the call that costs the most.
    """

    trace_a: str
    model_b: str
    granularity: str              # ``layers``, ``leaves`` or ``glob``
    final_error: FinalError
    residual_error: float         # the final error with every ranked call restored: what they do not explain
    ranking: tuple[AttributedCall, ...]
    budget: tuple[BudgetStep, ...]
    skipped: tuple[SkippedUnit, ...]
    warnings: tuple[str, ...]
    forward_passes: int           # B's whole forwards run: one on A's inputs, one per ranked call, the budget's
    module_runs: int              # single-module runs on A's inputs (the local errors)
    seconds: float

    def __bool__(self) -> bool:
        return bool(self.ranking)

    @property
    def top(self) -> AttributedCall | None:
        """The call that costs the most, or None when nothing was ranked."""
        return self.ranking[0] if self.ranking else None

    @property
    def table(self) -> Any:
        """A pandas DataFrame, one row per ranked call (``COLUMNS``), most costly first."""
        import pandas as pd

        return pd.DataFrame([c.to_dict() for c in self.ranking], columns=COLUMNS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": ATTRIBUTION_FORMAT_VERSION, "trace_a": self.trace_a, "model_b": self.model_b,
            "granularity": self.granularity, "final_error": self.final_error.to_dict(),
            "residual_error": self.residual_error,
            "ranking": [c.to_dict() for c in self.ranking], "budget": [s.to_dict() for s in self.budget],
            "skipped": [s.to_dict() for s in self.skipped], "warnings": list(self.warnings),
            "forward_passes": self.forward_passes, "module_runs": self.module_runs, "seconds": self.seconds,
        }

    def __repr__(self) -> str:
        top = f", top={self.top.module_path!r} ({self.top.share:.0%})" if self.top else ""
        return (f"Attribution({self.final_error.describe()}, {len(self.ranking)} ranked, "
                f"{len(self.skipped)} skipped{top})")

    def _repr_html_(self) -> str:
        from ..display import summary_html

        facts = [("trace A", self.trace_a), ("model B", self.model_b), ("final error", self.final_error.describe()),
                 ("ranked", f"{len(self.ranking)} ({self.granularity})"), ("skipped", len(self.skipped))]
        facts += [(f"#{c.rank}", f"{c.module_path} (call {c.call_index}): {c.share:.1%} of the final error")
                  for c in self.ranking[:5]]
        return summary_html("tracediff attribute", facts)
