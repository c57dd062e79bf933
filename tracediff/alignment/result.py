"""The result of an alignment: one row per compared tensor pair, plus what did not pair.

``Alignment.table`` columns, one row per compared tensor in B's execution order:

=====================  ========================================================
order                  0, 1, 2... (execution order of B)
module_path_a/_b       full paths as recorded (root class name included)
call_index             call index of the module in A (``call_index_b`` in B)
call_index_a           the same as ``call_index``, named symmetrically
tensor                 slot in B: ``inputs.args.0``, ``inputs.kwargs.x``,
                       ``outputs``, ``outputs.0``, ``outputs.logits``
                       (``tensor_a``: the slot in A when it differs)
tensor_b               the same as ``tensor``, named symmetrically
shape_a/_b, dtype_a/_b as recorded
max_abs_err ...        see :mod:`tracediff.compare.metrics`
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
origin                 for rows out of tolerance, decided by growth (see
                       :mod:`tracediff.alignment.verdicts.sources`): ``introduced``
                       (a source among a call's outputs: the module's own
                       code), ``between modules`` (a source among a call's
                       inputs: the caller's code between its submodule
                       calls, named in ``reason``), ``model inputs`` (the
                       root's inputs), ``inherited`` (not a source: the
                       error flowed in). In backward rows what flows in is
                       ``grad_outputs`` and what flows out ``grad_inputs``
noise_floor            with a baseline: max_abs_err between A and the
                       baseline (see :mod:`tracediff.alignment.verdicts.noise`)
noise_ratio            max_abs_err / noise_floor (None: zero or no floor)
growth                 this row's error beyond noise over what flowed into
                       it (``Alignment.sources``: the rows where error is
                       introduced)
matched_by, transform  how the pair was found (name, map, structure, layout,
                       output: B's unpaired call that made the matched
                       call's output) and the layout transform relating
                       the two tensors
pairing                the evidence the pair rests on: ``map`` (the user's
                       rename map), ``value`` (the values agree, or a layout
                       was verified on them), ``name`` or ``shape`` (sizes
                       alone; see docs/matching.md)
step                   the decode step of B's call (generation traces, see
                       :mod:`tracediff.alignment.decode_steps`), else None
position               for a row out of tolerance with a sequence dimension:
                       the first token position holding an element beyond
                       tolerance (absolute in the generated sequence)
positions_beyond       how many positions do (0 for a row within tolerance;
                       None: not known)
pcc                    Pearson correlation of the pair's elements (payloads)
kl_max ... flip_margin logits rows: the largest KL per position, top-1/5/10
                       agreement, argmax flips and the reference's top-2
                       margin at the first flip (see
                       :mod:`tracediff.alignment.lm_verdicts`)
rank                   a sharded trace (:mod:`tracediff.sharding`): the rank
                       whose shard first holds an element out of tolerance
                       (None: not sharded, replicated, a partial sum)
=====================  ========================================================
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import pandas as pd

    from ..sharding.findings import ShardFinding
    from .lm_results import LogitsVerdict, PositionStrip, StepAlignment, TokenAlignment

from ..display import renderer_for, short_repr, summary_html
from ..trace.frozen import frozen_builder, replaced

#: The origin of a diverged row whose error arose where a runtime approximation no trace can bound acts
#: (alignment/verdicts/sources.py): not shown to be a mistake, so it makes the verdict undecided, not diverged.
KERNEL_ORIGIN = "runtime approximation"

FORMAT_VERSION = 1
R = TypeVar("R", bound="TensorComparison")

@dataclass(frozen=True, slots=True)  # no per-row __dict__: an alignment holds one row per compared tensor
class TensorComparison:
    """One compared tensor pair.

    Use ``row.passed`` or ``row.diverged``: a row has no truth value of its
    own, so ``if result.first_divergence:`` means "there is a divergence".
    ``call_index``/``call_index_b`` and ``tensor_a``/``tensor`` name each side;
    ``call_index_a`` and ``tensor_b`` are the same values under symmetric names.
    """

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
    # how the pair was found (name, map, structure, layout, output) and the layout transform relating them
    matched_by: str = "name"
    transform: str | None = None
    unrecorded: tuple[str, ...] = ()
    # op rows (op-level capture): the qualified op name and its index inside the enclosing module call
    op: str | None = None
    op_index: int | None = None
    # the evidence the pair was made on, strongest first: map, value, name, shape (docs/matching.md)
    pairing: str = "name"
    # generation and language-model verdicts (alignment/decode_steps.py, alignment/lm_verdicts.py)
    step: int | None = None
    position: int | None = None
    positions_beyond: int | None = None
    pcc: float | None = None
    kl_max: float | None = None
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    top10_agreement: float | None = None
    argmax_flips: int | None = None
    flip_margin: float | None = None
    # a sharded trace (tracediff.sharding): the rank whose shard first goes out of tolerance
    rank: int | None = None

    @property
    def call_index_a(self) -> int:
        """The module's call index in A (the same as ``call_index``)."""
        return self.call_index

    @property
    def tensor_b(self) -> str:
        """The tensor's slot in B (the same as ``tensor``)."""
        return self.tensor

    @property
    def diverged(self) -> bool:
        """True when the pair is out of tolerance."""
        return self.within_tolerance is False

    @property
    def passed(self) -> bool:
        """True unless the pair is out of tolerance or unreadable (a row without data passes)."""
        return self.within_tolerance is not False and self.status != "unreadable"

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready values, keys in ``TABLE_COLUMNS`` order (the symmetric names included)."""
        out = asdict(self)
        out["shape_a"] = list(self.shape_a) if self.shape_a is not None else None
        out["shape_b"] = list(self.shape_b) if self.shape_b is not None else None
        out["unrecorded"] = list(self.unrecorded)
        out["call_index_a"] = self.call_index
        out["tensor_b"] = self.tensor
        return {column: out[column] for column in TABLE_COLUMNS}

    def __repr__(self) -> str:
        return short_repr(self, order=self.order, module_path_b=self.module_path_b, call_index_b=self.call_index_b,
                          tensor_b=self.tensor, status=self.status, max_abs_err=self.max_abs_err,
                          atol=self.atol, rtol=self.rtol)

    def describe(self) -> str:
        """One line naming the pair and its error, e.g. for assertion messages."""
        where = self.module_path_b if self.module_path_a == self.module_path_b else \
            f"{self.module_path_a} ~ {self.module_path_b}"
        call = f" (call {self.call_index})" if self.call_index else ""
        if self.step is not None:
            at = f", position {self.position}" if self.position is not None else ""
            call = f" (step {self.step}{at})"
        if self.op is not None:  # an op row: "torch.Tensor.mul #7 inside model.layers.1.self_attn"
            where = f"{self.op} #{self.op_index} inside {where}"
        if self.status in ("shape_mismatch", "unreadable", "no_data"):
            return f"{where}{call} {self.tensor}: {self.reason}"
        approx = " (approximate, from statistics)" if self.approximate else ""
        return (f"{where}{call} {self.tensor}: max_abs_err={self.max_abs_err:.3g} "
                f"max_rel_err={self.max_rel_err:.3g} over atol={self.atol:.3g} rtol={self.rtol:.3g}; "
                f"would pass with atol>={self.required_atol:.3g} or rtol>={self.required_rtol:.3g}{approx}")


def _table_columns() -> list[str]:
    """The dataclass fields, with the symmetric aliases next to the names they mirror."""
    columns = []
    for name in (f.name for f in fields(TensorComparison)):
        columns.append(name)
        if name == "call_index":
            columns.append("call_index_a")
        elif name == "tensor":
            columns.append("tensor_b")
    return columns


TABLE_COLUMNS = _table_columns()


@dataclass(frozen=True)
class Unmatched:
    """A node, or one tensor of a matched node, present in one trace only."""

    module_path: str
    call_index: int
    tensor: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Unplaced:
    """What of A trace B lost or left without a counterpart (``tracediff.alignment.unplaced``).

    ``what``: ``"call"``, a call of A that no node of a graph trace B answers, though B has nodes left
    unpaired at its place, between the pairs made just before and just after it (``place_b``: up to three
    of them, ``path#call``; a node whose values changed agrees with nothing and is left there);
    ``"block"``, a numbered block of A (``layers.1``) B does not hold; ``"outputs"``, a paired call whose
    call in B recorded no outputs. The alignment is then undecided, never passed.
    """

    module_path_a: str
    call_index_a: int
    place_b: tuple[str, ...] = ()
    what: str = "call"  # "call", "block" (B holds fewer such blocks) or "outputs" (B's call recorded none)

    def to_dict(self) -> dict[str, Any]:
        return {"module_path_a": self.module_path_a, "call_index_a": self.call_index_a, "what": self.what,
                "place_b": list(self.place_b)}


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
class _Tally:
    statuses: dict[str, int]  # status -> rows
    diverged: tuple[TensorComparison, ...]  # in execution order
    blamed: tuple[TensorComparison, ...]  # those of them a mistake may have made (not KERNEL_ORIGIN)
    unreadable: tuple[TensorComparison, ...]
    approximate: int


@dataclass(frozen=True)
class LikelySource:
    """A call of B with no partner in A whose outputs feed the first divergence: the likely site of the
    mistake, which two traces could not compare (``evidence``: which of its outputs is which diverging or
    uncompared input)."""

    module_path_b: str
    call_index: int
    evidence: tuple[str, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"module_path_b": self.module_path_b, "call_index": self.call_index,
                "evidence": list(self.evidence), "reason": self.reason}


@dataclass(frozen=True)
class Alignment:
    """Everything ``tracediff.align`` found; truthy when every compared tensor passed.

    ``repr(result)`` is one short line; in Jupyter the result shows as a small
    table with the verdict and the first divergence.
    """

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
    # slot rules (regex, slot, "") a suggested map needs: the inputs of pairs compared on their outputs only
    suggested_slots: tuple[tuple[str, str, str], ...] = ()
    warnings: tuple[str, ...] = ()
    matched_nodes: int = 0
    baseline: str | None = None
    sources: tuple[TensorComparison, ...] = ()
    ignored: tuple[TensorComparison, ...] = ()
    unrecorded_a: tuple[str, ...] = ()
    unrecorded_b: tuple[str, ...] = ()
    incomplete_a: str | None = None  # why trace A does not cover the whole forward (None: complete)
    incomplete_b: str | None = None
    allow_incomplete: bool = False  # an incomplete trace fails the verdict unless this is set
    noise_factor: float | None = None  # the factor applied to the baseline's noise floor (None: no baseline)
    # the dtype B computed in where its tensors do not show it (a trace's compute_dtype: OpenVINO's bf16)
    computed_b: str | None = None
    importer_a: str | None = None  # the kind of dump trace A was imported from (tracediff import), None: a capture
    importer_b: str | None = None
    steps: StepAlignment | None = None  # generation traces: the decode steps compared and the first diverging one
    logits: tuple[LogitsVerdict, ...] = ()  # next-token verdicts of the logits rows
    tokens: TokenAlignment | None = None  # generated tokens: where B would have chosen another token than A
    position_strip: PositionStrip | None = None  # the first divergence's error at each token position
    payloads_expected: bool = False  # both traces hold payloads: rows from statistics alone are not evidence
    # multi-rank traces: replicas the ranks disagree on (these fail the verdict) and tensors left unplaced
    shard_findings: tuple[ShardFinding, ...] = ()
    # what of A trace B lost or left without a counterpart at its place (alignment/unplaced.py): undecided
    unplaced: tuple[Unplaced, ...] = ()

    @property
    def verdict(self) -> str:
        """``"passed"``, ``"diverged"`` (a tensor out of tolerance or unreadable, or ranks that disagree on a
        replica) or ``"undecided"``.

        A verdict needs evidence: an alignment that compared no tensor, or only
        statistics where both traces hold payloads, or that ends where an
        incomplete trace ends (unless ``align(..., allow_incomplete=True)``), or
        that leaves calls of A without a counterpart B lost (:attr:`unplaced`), is
        undecided, never passed; :attr:`reason` says why.
        """
        if self._tally.blamed or self._tally.unreadable or any(f.failing for f in self.shard_findings):
            return "diverged"
        return "undecided" if self.reason is not None else "passed"

    @property
    def reason(self) -> str | None:
        """Why the alignment is undecided, in one line (None when the evidence decides)."""
        if not self.allow_incomplete and (self.incomplete_a is not None or self.incomplete_b is not None):
            return ("the comparison ends where an incomplete trace ends (--allow-incomplete judges only what both "
                    "traces hold)")
        if not self.rows and self.ignored:
            return f"nothing was compared: every one of the {len(self.ignored)} paired tensors was set aside by ignore"
        if not self.rows:
            return (f"nothing was compared: no tensor of A ({self.model_a}) pairs with a tensor of B "
                    f"({self.model_b}), {self.matched_nodes} module calls paired; check that both are traces of one "
                    "model that hold tensors, or give --map")
        if self.unplaced:
            return _unplaced_reason(self.unplaced)
        unplaced = sum(not finding.failing for finding in self.shard_findings)
        if unplaced:
            return (f"{unplaced} tensor(s) of a multi-rank trace were not placed, so not compared (see the shard "
                    "findings; declare their layouts with --shards)")
        if self._tally.diverged and not self._tally.blamed:
            first = self._tally.diverged[0]
            return (f"{len(self._tally.diverged)} tensor(s) out of tolerance, the first {first.describe()}, all with "
                    "an error that arose where a runtime approximation the traces cannot bound acts (the first "
                    "warning names it): not shown to be a mistake; to decide, align with a reference that "
                    "computes what the runtime's kernel does (docs/verdicts.md, runtime approximations)")
        if self.payloads_expected and self._tally.approximate == len(self.rows):
            return ("only recorded statistics were compared, though both traces hold payloads: no payload pair "
                    "was compared")
        return None
    likely_source: LikelySource | None = None  # B's unpaired call feeding the first divergence, if any

    @property
    def passed(self) -> bool:
        """True when tensors were compared, none is out of tolerance or unreadable, and both traces are complete.

        A comparison that ends where an incomplete trace ends is never a pass
        of the whole model, unless ``align(..., allow_incomplete=True)``; nor is
        one that compared nothing (see :attr:`verdict`).
        """
        return self.verdict == "passed"

    def __bool__(self) -> bool:
        return self.passed

    @property
    def first_divergence(self) -> TensorComparison | None:
        """The earliest row, in execution order, that is out of tolerance: the earliest a mistake may have made,
        else the earliest whose error arose where a runtime approximation no trace bounds acts."""
        diverged = self._tally.blamed or self._tally.diverged
        return diverged[0] if diverged else None

    @property
    def first_backward_divergence(self) -> TensorComparison | None:
        """The earliest gradient row (``grad_outputs``/``grad_inputs``) out of tolerance."""
        return next((row for row in self._tally.diverged if row.tensor.startswith("grad_")), None)

    @property
    def diverged(self) -> list[TensorComparison]:
        return list(self._tally.diverged)

    @property
    def unreadable(self) -> list[TensorComparison]:
        return list(self._tally.unreadable)

    @cached_property
    def _tally(self) -> _Tally:
        """One pass over the rows for the verdict, the summary and the first divergences: a report asks for
        each several times, and a large alignment has a row per tensor (rows never change)."""
        statuses: dict[str, int] = {}
        diverged, blamed, unreadable, approximate = [], [], [], 0
        for row in self.rows:
            status = row.status
            statuses[status] = statuses.get(status, 0) + 1
            if row.within_tolerance is False:  # row.diverged
                diverged.append(row)
                if row.origin != KERNEL_ORIGIN:
                    blamed.append(row)
            if status == "unreadable":
                unreadable.append(row)
            if row.approximate:
                approximate += 1
        return _Tally(statuses, tuple(diverged), tuple(blamed), tuple(unreadable), approximate)

    @cached_property
    def _frame(self) -> pd.DataFrame:
        import pandas as pd  # imported on first use: it costs start-up time to every align

        return pd.DataFrame([row.to_dict() for row in self.rows], columns=TABLE_COLUMNS)

    @property
    def table(self) -> pd.DataFrame:
        """One row per compared tensor, columns as in the module docstring (a fresh copy)."""
        return self._frame.copy()

    def summary(self) -> dict[str, Any]:
        tally = self._tally
        return {
            "compared": len(self.rows),
            "diverged": len(tally.diverged),
            "approximate": tally.approximate,
            "statuses": dict(tally.statuses),
            "matched_nodes": self.matched_nodes,
        }

    def to_html(self) -> str:
        """The self-contained HTML report; write it with UTF-8.

        The same as ``tracediff.render.html.render_html(result)``: the renderer is
        looked up in the registry that :mod:`tracediff.render` fills (see
        :func:`tracediff.display.renderer_for`), so this module imports no renderer.
        """
        return renderer_for(self, "html")(self)

    def __repr__(self) -> str:
        first = self.first_divergence
        return short_repr(self, passed=self.passed, compared=len(self.rows), diverged=len(self.diverged),
                          verdict=self.verdict,
                          first_divergence=first.describe() if first is not None else None,
                          trace_a=self.trace_a, trace_b=self.trace_b)

    def _repr_html_(self) -> str:
        first, back = self.first_divergence, self.first_backward_divergence
        facts: list[tuple[str, Any]] = [
            ("trace A", f"{self.trace_a} ({self.model_a})"), ("trace B", f"{self.trace_b} ({self.model_b})"),
            ("compared", len(self.rows)), ("diverged", len(self.diverged)), ("unreadable", len(self.unreadable)),
            ("unmatched", f"{len(self.unmatched_a)} in A, {len(self.unmatched_b)} in B"),
            ("first divergence", first.describe() if first is not None else None),
        ]
        if back is not None:
            facts.append(("first backward divergence", back.describe()))
        if first is not None and first.origin:
            facts.append(("origin", first.origin))
        return summary_html("Alignment", facts, verdict=self.verdict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (``format_version`` 1)."""
        first = self.first_divergence
        return {
            "format_version": FORMAT_VERSION,
            "passed": self.passed,
            "verdict": self.verdict,
            "reason": self.reason,
            "trace_a": self.trace_a,
            "trace_b": self.trace_b,
            "model_a": self.model_a,
            "model_b": self.model_b,
            "matching": "structural" if self.structural else "by name",
            "summary": self.summary(),
            "first_divergence": first.to_dict() if first is not None else None,
            "first_backward_divergence": (
                self.first_backward_divergence.to_dict() if self.first_backward_divergence is not None else None
            ),
            "rows": [row.to_dict() for row in self.rows],
            "unmatched_a": [u.to_dict() for u in self.unmatched_a],
            "unmatched_b": [u.to_dict() for u in self.unmatched_b],
            "argument_diffs": [d.to_dict() for d in self.argument_diffs],
            "suggested_rename": [list(rule) for rule in self.suggested_rename],
            "suggested_slots": [[pattern, slot, None] for pattern, slot, _ in self.suggested_slots],
            "warnings": list(self.warnings),
            "baseline": self.baseline,
            "sources": [row.to_dict() for row in self.sources],
            "ignored": [row.to_dict() for row in self.ignored],
            "unrecorded_a": list(self.unrecorded_a),
            "unrecorded_b": list(self.unrecorded_b),
            "incomplete_a": self.incomplete_a,
            "incomplete_b": self.incomplete_b,
            "allow_incomplete": self.allow_incomplete,
            "noise_factor": self.noise_factor,
            "importer_a": self.importer_a,
            "importer_b": self.importer_b,
            "steps": self.steps.to_dict() if self.steps is not None else None,
            "logits": [verdict.to_dict() for verdict in self.logits],
            "tokens": self.tokens.to_dict() if self.tokens is not None else None,
            "position_strip": self.position_strip.to_dict() if self.position_strip is not None else None,
            "shard_findings": [finding.to_dict() for finding in self.shard_findings],
            "unplaced": [u.to_dict() for u in self.unplaced],
            "likely_source": self.likely_source.to_dict() if self.likely_source is not None else None,
        }


def _unplaced_reason(unplaced: tuple[Unplaced, ...]) -> str:
    first = unplaced[0]
    what = {"block": "B holds fewer blocks of its kind", "outputs": "its call in B recorded no outputs"}.get(
        first.what, f"B's unpaired {', '.join(first.place_b)} run at its place, agreeing with nothing")
    return (f"{len(unplaced)} call(s) of A have no counterpart in B, so are not compared; first "
            f"{first.module_path_a}: {what} (see the JSON report's unplaced)")


#: Builds a ``TensorComparison`` from the same arguments as the class, without the frozen ``__init__``'s cost.
build_row = frozen_builder(TensorComparison)


def fill(row: R, **changes: Any) -> R:
    """A copy of ``row`` with ``changes`` (``dataclasses.replace``, at ``build_row``'s speed); ``row`` never changes.

    The copy has the row's own class: a finished row stays frozen, and a draft that ``align`` is still deciding
    (:class:`tracediff.alignment.rows.RowDraft`) stays a draft. A name that is not a field raises ``TypeError``.
    """
    return replaced(row, **changes)
