"""The result of an alignment: one row per compared tensor pair, plus what did not pair.

``Alignment.table`` columns, one row per compared tensor in B's execution order:

=====================  ========================================================
order                  0, 1, 2... (execution order of B)
module_path_a/_b       full paths as recorded (root class name included)
call_index             call index of the module in A (``call_index_b`` in B)
tensor                 slot in B: ``inputs.args.0``, ``inputs.kwargs.x``,
                       ``outputs``, ``outputs.0``, ``outputs.logits``
                       (``tensor_a``: the slot in A when it differs)
shape_a/_b, dtype_a/_b as recorded
max_abs_err ...        see :mod:`tracediff.alignment.metrics`
atol, rtol             the tolerance applied to this pair
required_atol/_rtol    the smallest atol (rtol=0) / rtol (atol=0) that passes
within_tolerance       True, False, or None when it could not be decided
approximate            compared on recorded statistics, not on payloads
status                 identical, close, diverged, shape_mismatch,
                       unreadable, no_data
reason                 why, for anything but identical/close
input_err              largest max_abs_err among the module's input rows
amplification          max_abs_err / input_err for output rows (inf when the
                       inputs were identical and the output is not)
origin                 for rows out of tolerance: ``introduced`` (what
                       flowed into the call was within tolerance),
                       ``inherited`` (it was not), ``model inputs`` (the
                       root's inputs), ``between modules`` (an input
                       diverged while every earlier tensor matched: the
                       parent's own code between its children's calls
                       changed it). In backward rows what flows in is
                       ``grad_outputs`` and what flows out ``grad_inputs``
=====================  ========================================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Any

import pandas as pd

FORMAT_VERSION = 1


@dataclass(frozen=True)
class TensorComparison:
    """One compared tensor pair; truthy when within tolerance."""

    order: int
    module_path_a: str
    module_path_b: str
    call_index: int
    call_index_b: int
    tensor: str
    tensor_a: str
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype_a: str | None
    dtype_b: str | None
    max_abs_err: float
    max_rel_err: float
    mean_abs_err: float
    rms_err: float
    cosine: float
    mismatch_fraction: float
    nan_mismatch: int
    inf_mismatch: int
    atol: float
    rtol: float
    required_atol: float
    required_rtol: float
    within_tolerance: bool | None
    approximate: bool
    status: str
    reason: str = ""
    module_type: str | None = None
    input_err: float | None = None
    amplification: float | None = None
    origin: str | None = None
    # noise floor from a baseline trace (see the verdicts in engine.py)
    noise_floor: float | None = None
    noise_ratio: float | None = None
    growth: float | None = None
    # how the pair was found (name, map, structure, layout) and the layout transform relating them
    matched_by: str = "name"
    transform: str | None = None
    unrecorded: tuple[str, ...] = ()
    # op rows (op-level capture): the qualified op name and its index inside the enclosing module call
    op: str | None = None
    op_index: int | None = None

    def __bool__(self) -> bool:
        return bool(self.within_tolerance)

    @property
    def diverged(self) -> bool:
        return self.within_tolerance is False

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape_a"] = list(self.shape_a) if self.shape_a is not None else None
        out["shape_b"] = list(self.shape_b) if self.shape_b is not None else None
        out["unrecorded"] = list(self.unrecorded)
        return out

    def describe(self) -> str:
        """One line naming the pair and its error, e.g. for assertion messages."""
        where = self.module_path_b if self.module_path_a == self.module_path_b else \
            f"{self.module_path_a} ~ {self.module_path_b}"
        call = f" (call {self.call_index})" if self.call_index else ""
        if self.status in ("shape_mismatch", "unreadable", "no_data"):
            return f"{where}{call} {self.tensor}: {self.reason}"
        approx = " (approximate, from statistics)" if self.approximate else ""
        return (f"{where}{call} {self.tensor}: max_abs_err={self.max_abs_err:.3g} "
                f"max_rel_err={self.max_rel_err:.3g} over atol={self.atol:.3g} rtol={self.rtol:.3g}; "
                f"would pass with atol>={self.required_atol:.3g} or rtol>={self.required_rtol:.3g}{approx}")


TABLE_COLUMNS = [f.name for f in fields(TensorComparison)]


@dataclass(frozen=True)
class Unmatched:
    """A node, or one tensor of a matched node, present in one trace only."""

    module_path: str
    call_index: int
    tensor: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ArgumentDiff:
    """A non-tensor argument or output that differs between two matched nodes."""

    module_path_a: str
    module_path_b: str
    call_index: int
    slot: str
    value_a: Any
    value_b: Any
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Alignment:
    """Everything ``tracediff.align`` found; truthy when every compared tensor passed."""

    trace_a: str
    trace_b: str
    model_a: str
    model_b: str
    rows: tuple[TensorComparison, ...]
    unmatched_a: tuple[Unmatched, ...] = ()
    unmatched_b: tuple[Unmatched, ...] = ()
    argument_diffs: tuple[ArgumentDiff, ...] = ()
    structural: bool = False
    suggested_rename: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    matched_nodes: int = 0
    baseline: str | None = None
    sources: tuple[TensorComparison, ...] = ()
    ignored: tuple[TensorComparison, ...] = ()
    unrecorded_a: tuple[str, ...] = ()
    unrecorded_b: tuple[str, ...] = ()
    incomplete_a: str | None = None
    incomplete_b: str | None = None

    @property
    def passed(self) -> bool:
        """True when no compared tensor is out of tolerance or unreadable."""
        return all(row.within_tolerance is not False and row.status != "unreadable" for row in self.rows)

    def __bool__(self) -> bool:
        return self.passed

    @property
    def first_divergence(self) -> TensorComparison | None:
        """The earliest row, in execution order, that is out of tolerance."""
        return next((row for row in self.rows if row.diverged), None)

    @property
    def first_backward_divergence(self) -> TensorComparison | None:
        """The earliest gradient row (``grad_outputs``/``grad_inputs``) out of tolerance."""
        return next((row for row in self.rows if row.diverged and row.tensor.startswith("grad_")), None)

    @property
    def diverged(self) -> list[TensorComparison]:
        return [row for row in self.rows if row.diverged]

    @property
    def unreadable(self) -> list[TensorComparison]:
        return [row for row in self.rows if row.status == "unreadable"]

    @cached_property
    def _frame(self) -> pd.DataFrame:
        return pd.DataFrame([row.to_dict() for row in self.rows], columns=TABLE_COLUMNS)

    @property
    def table(self) -> pd.DataFrame:
        """One row per compared tensor, columns as in the module docstring (a fresh copy)."""
        return self._frame.copy()

    def summary(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        return {
            "compared": len(self.rows),
            "diverged": len(self.diverged),
            "approximate": sum(row.approximate for row in self.rows),
            "statuses": counts,
            "matched_nodes": self.matched_nodes,
        }

    def to_html(self) -> str:
        """The self-contained HTML report (see :mod:`tracediff.render.html`); write it with UTF-8."""
        from ..render.html import render_html  # renderers are imported only when asked for

        return render_html(self)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (``format_version`` 1)."""
        first = self.first_divergence
        return {
            "format_version": FORMAT_VERSION,
            "passed": self.passed,
            "trace_a": self.trace_a,
            "trace_b": self.trace_b,
            "model_a": self.model_a,
            "model_b": self.model_b,
            "matching": "structural" if self.structural else "by name",
            "summary": self.summary(),
            "first_divergence": first.to_dict() if first is not None else None,  # a diverged row is falsy
            "first_backward_divergence": (
                self.first_backward_divergence.to_dict() if self.first_backward_divergence is not None else None
            ),
            "rows": [row.to_dict() for row in self.rows],
            "unmatched_a": [u.to_dict() for u in self.unmatched_a],
            "unmatched_b": [u.to_dict() for u in self.unmatched_b],
            "argument_diffs": [d.to_dict() for d in self.argument_diffs],
            "suggested_rename": [list(rule) for rule in self.suggested_rename],
            "warnings": list(self.warnings),
            "baseline": self.baseline,
            "sources": [row.to_dict() for row in self.sources],
            "ignored": [row.to_dict() for row in self.ignored],
            "unrecorded_a": list(self.unrecorded_a),
            "unrecorded_b": list(self.unrecorded_b),
            "incomplete_a": self.incomplete_a,
            "incomplete_b": self.incomplete_b,
        }
