"""Where error is introduced rather than inherited: growth, origin and the list of sources.

Each row gets an **excess**: how far its error is beyond what noise explains,

* ``noise_ratio`` (error over the baseline's noise floor) when a baseline
  gave the row a non-zero floor;
* otherwise the error relative to the tensor's magnitude, in units of
  the row's rtol: ``max_abs_err / (rtol * max|a|)``, with ``max|a|`` from
  A's recorded min and max (``max_abs_err / atol`` when either is zero or
  unknown). Relative, because a norm rescales its input and its absolute
  error with it.

What **flowed into** a row is the largest excess recorded earlier inside the
enclosing call: for an output, the call's own inputs and everything recorded
inside the call (its submodules); for an input, everything recorded earlier
in the caller's call (the caller's inputs, earlier sibling calls and what
ran inside them). ``growth = excess / max(incoming, 1)``: an excess of at most
1 is noise, so the incoming error never counts for less than 1.

A row is a **source** when it is out of tolerance and either nothing beyond
noise flowed into it or its growth exceeds ``noise_factor``. NaN and
infinities are the exception: an op output holding them where the other side
holds none is a source when B's op made them from finite inputs (a ``log`` of
a negative, an ``exp`` that overflows), and never when one of its inputs held
them already (it spread them), whatever flowed in. Sources are
listed in execution order; a row out of tolerance that is no source is
``inherited``.

An error can be made below tolerance and diverge only further on: a bf16 RMSNorm that skips its float32
upcast is off by one bf16 step (within rtol element by element), and the projection after it, whose outputs
are near zero in places, is beyond ``rtol * |a|`` there with no more error than flowed into it. Each row's
error is followed back to the row where it **arose**: itself when its excess is beyond ``noise_factor``
times what flowed in (unfloored: made there), else where the incoming excess arose (carried). A diverged row
that would be a source only because what flowed in is below 1, whose error is carried from a row within
tolerance that made its error with A and B in one dtype (where rounding alike makes no error), is not the
source: that row is, marked diverged with a reason saying so (the first divergence names the norm, not the
projection). Across dtypes, rounding makes error everywhere, and nothing changes.

Two kinds of accepted rows are told apart: an output cut at another point (``explained``) counts no error of
its own, so nothing is ever followed back to it; a row within a runtime's own rounding (``approximated``,
:mod:`tracediff.alignment.verdicts.approximations`) passes its error on, and the diverged rows that only carry
it (no source) are accepted as inherited from it.

A source's ``origin`` is ``introduced`` for an output (the
module's own code), ``between modules`` for an input (the caller's own code
between its submodule calls; the reason names the caller as recorded, never
a ``ModuleList`` or another container that has no code of its own) and
``model inputs`` for the root's inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from ...compare.masks import MASKED_AT
from ...trace.model import Node, TensorRecord
from ..result import KERNEL_ORIGIN, TensorComparison
from ..rows import RowDraft, add_note


def scale_of(record: TensorRecord) -> float | None:
    """``max(|min|, |max|)`` from a record's statistics, or None when they were not recorded.

    A ``min`` that is a mask's value rather than a magnitude (at most ``-1e4`` and a hundred times beyond
    ``|max|``: masked attention scores, ``finfo.min`` or ``score - 1e4``) is left out, so that the error of
    the other positions is not measured against 3.4e38 (which made every row after masked scores look like
    noise, and the softmax reading them a source)."""
    low, high = (record.stats.get(key) for key in ("min", "max"))
    values = [float(v) for v in (low, high) if isinstance(v, (int, float)) and math.isfinite(v)]
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low <= MASKED_AT \
            and abs(low) > 100 * abs(high):
        values = [float(high)] if math.isfinite(high) else []
    return max((abs(v) for v in values), default=None)


def excess(row: TensorComparison, record_a: TensorRecord) -> float | None:
    """How far a row's error is beyond noise (see the module docstring); None when nothing was measured.

    ``record_a`` is A's record of the pair, whose magnitude (:func:`scale_of`) is looked up only for an error
    above zero.
    """
    if row.status == "shape_mismatch":
        return math.inf
    if row.status in ("unreadable", "no_data") or math.isnan(row.max_abs_err):
        return None
    if row.nan_mismatch or row.inf_mismatch or math.isinf(row.required_atol):
        return math.inf  # no tolerance passes it: NaN, infinities, positions masked on one side only
    if row.noise_ratio is not None:
        return row.noise_ratio
    error = row.max_abs_err
    if error == 0:
        return 0.0
    # relative to the tensor's magnitude: a norm rescales its input, and must not look like a source for it
    scale_a = scale_of(record_a) if row.rtol > 0 else None
    allowed = row.rtol * scale_a if scale_a else row.atol
    if allowed > 0:
        return error / allowed
    return math.inf if error > 0 else 0.0


_NONFINITE = ("nan", "posinf", "neginf")
_ROLES = {"inputs": ("forward", "in"), "outputs": ("forward", "out"),
          "grad_outputs": ("backward", "in"), "grad_inputs": ("backward", "out")}


@lru_cache(maxsize=4096)  # called for every row, twice; a trace has few distinct slots
def role(slot: str) -> tuple[str, str]:
    """(pass, side) of a slot: what flows into a call and what comes out, forward or backward."""
    return _ROLES.get(slot.partition(".")[0], ("forward", "out"))


def find_sources(rows: Sequence[RowDraft], nodes_b: Sequence[Node], records_a: Sequence[TensorRecord], *,
                 noise_factor: float, never_source: Sequence[bool] | None = None,
                 explained: Sequence[bool] | None = None, approximated: Sequence[bool] | None = None,
                 unbounded: Sequence[str | None] | None = None) -> list[bool]:
    """Set ``growth`` and ``origin`` of every draft; returns which of them are sources.

    ``rows`` are in B's execution order, ``nodes_b[i]`` is row i's call in B
    and ``records_a[i]`` A's record of the pair (its magnitude scales the error, see :func:`excess`);
    ``never_source`` marks rows (ignored ones) that count as flowing into
    later rows but are never sources; ``explained`` marks rows whose difference a benign rule accounts for
    (an output cut at another point: what flows on is the later input that agrees), which count no error of
    their own: nothing flows from them, and no error is ever said to be made there; ``approximated`` marks rows
    accepted within a runtime's own rounding (:mod:`tracediff.alignment.verdicts.approximations`): their error
    flows on, and a diverged row that is no source and carries only such an error is accepted as inherited
    from it; ``unbounded`` names, for the rows of B nodes a known approximation acts in that no trace can bound
    (:data:`tracediff.trace.vocabulary.UNBOUNDED`), that approximation: a source in the same call after such a
    row, whose incoming error arose there, is no source, and it and the rows carrying that error get the origin
    :data:`KERNEL_ORIGIN` (not shown to be a mistake; docs/verdicts.md).
    """
    running: dict[tuple[str, int], float] = {}  # (phase, id of a call) -> largest excess recorded inside it so far
    holder: dict[tuple[str, int], int] = {}  # the same key -> the row holding that excess
    arose: list[int] = []  # row -> the row where its error arose: itself, or the one whose error flowed into it
    seeds: set[int] = set()  # rows within tolerance that made their error (A and B in one dtype): see _started_here
    flags: list[bool] = []
    with_inputs: set[int] = set()  # calls with an input row compared
    growth: float | None
    passes_on = [bool((approximated and approximated[i]) or (unbounded and unbounded[i])) for i in range(len(rows))] \
        if approximated or unbounded else None
    for index, (row, node, record_a) in enumerate(zip(rows, nodes_b, records_a)):
        phase, side = role(row.tensor)
        if side == "in":
            with_inputs.add(id(node))
        value = 0.0 if explained and explained[index] else excess(row, record_a)
        diverged = row.within_tolerance is False  # row.diverged
        arose.append(index)
        if value == 0.0 and not diverged:  # nothing beyond noise, most rows of a close port: what flowed in is moot
            growth, is_source = 0.0, False
        else:
            enclosing = node if side == "out" else node.parent
            if side == "out" and passes_on and id(node) not in with_inputs and node.parent is not None:
                enclosing = _approximated_caller(node, phase, running, holder, arose, passes_on)
            elif side == "in" and unbounded and enclosing is not None and enclosing.parent is not None:
                # a graph block's first node can be listed before the block's own inputs: what flowed into
                # the block is then read in its caller
                enclosing = _approximated_caller(enclosing, phase, running, holder, arose, unbounded)
            key = (phase, id(enclosing)) if enclosing is not None else None
            incoming = running.get(key, 0.0) if key is not None else 0.0
            growth = None if value is None else (value / max(incoming, 1.0) if not math.isinf(value) or
                                                 not math.isinf(incoming) else 1.0)
            made = made_nonfinite(row, node) if side == "out" else None
            is_source = bool(diverged and not (never_source and never_source[index])
                             and (made if made is not None else
                                  incoming <= 1.0 or (growth is not None and growth > noise_factor)))
            upstream = holder.get(key) if key is not None else None
            # carried: no more than noise_factor times what flowed in (unfloored); else made here
            carried = value is not None and upstream is not None and value <= noise_factor * incoming
            if is_source and unbounded and upstream is not None and unbounded[arose[upstream]] \
                    and nodes_b[arose[upstream]].parent is node.parent:
                # grown in the call the approximation acts in, by what no trace bounds (its weights, its norm)
                is_source, carried = False, True
            elif is_source and unbounded and unbounded[index]:
                is_source = False  # made where the approximation acts
            if carried and upstream is not None:
                arose[index] = arose[upstream]
            elif value and not diverged and row.dtype_a == row.dtype_b and not (passes_on and passes_on[index]):
                seeds.add(index)
            seed = arose[index]
            if is_source and carried and made is None and incoming <= 1.0 and seed in seeds and \
                    not (never_source and never_source[seed]):
                # an error below tolerance where it was made, beyond what flowed in there, carried here: it
                # starts there
                is_source = False
                if not flags[seed]:  # the first row it carried into names it; the others inherit from it
                    flags[seed] = True
                    _started_here(rows[seed], nodes_b[seed], row)
        row.growth = growth
        if diverged and not is_source and approximated and approximated[arose[index]] and arose[index] != index:
            _within_approximation(row, rows[arose[index]])
            diverged = False
        if diverged and not is_source and unbounded and unbounded[arose[index]]:
            _after_unbounded(row, rows[arose[index]], unbounded[arose[index]] or "")
        elif diverged:
            row.origin = _origin(side, phase, node) if is_source else "inherited"
            if is_source and row.origin == "between modules" and node.parent is not None:
                add_note(row, _between_note(node))
        elif row.origin is not None:
            row.origin = None
        flags.append(is_source)
        if value is not None:
            _raise_running(running, holder, phase, node, value, index)
    return flags


def _approximated_caller(node: Node, phase: str, running: dict[tuple[str, int], float],
                         holder: dict[tuple[str, int], int], arose: list[int],
                         approximated: Sequence[bool | str | None]) -> Node:
    """Where what flowed into an output of ``node``, a call none of whose inputs was compared, is read: its
    caller, when what flowed in there arose at a runtime's rounding (a graph runtime's norm whose input is an
    unpaired node: the error the rounding made reaches it unseen); else the call itself."""
    assert node.parent is not None
    key = (phase, id(node.parent))
    upstream = holder.get(key)
    if upstream is not None and approximated[arose[upstream]] and \
            running.get(key, 0.0) > running.get((phase, id(node)), 0.0):
        return node.parent
    return node


def _after_unbounded(row: RowDraft, source: RowDraft, approximation: str) -> None:
    """A diverged row whose error arose where an approximation no trace bounds acts: not shown to be a mistake."""
    row.origin = KERNEL_ORIGIN
    add_note(row, f"its error arose at {source.module_path_b} {source.tensor}, where {approximation} acts, which "
                  "the traces cannot bound: not shown to be a mistake (docs/verdicts.md, runtime approximations)")


def _within_approximation(row: RowDraft, source: RowDraft) -> None:
    """Accept a row whose only error is carried from a row within a runtime's own rounding."""
    row.within_tolerance, row.status, row.origin = True, "close", None
    add_note(row, f"inherited from the runtime's rounding accepted at {source.module_path_b} {source.tensor} "
                  "(no more than the noise factor times that error)")


def _started_here(row: RowDraft, node: Node, carried_to: RowDraft) -> None:
    """Mark a row within tolerance as the source of a divergence it carried into ``carried_to``."""
    side, phase = role(row.tensor)[1], role(row.tensor)[0]
    row.within_tolerance, row.status = False, "diverged"
    row.origin = _origin(side, phase, node)
    add_note(row, f"within the elementwise tolerance, but made here (A and B in one dtype, more than the noise "
                  f"factor times the error that flowed in) and carried into {carried_to.module_path_b} "
                  f"{carried_to.tensor}, which diverges with no more: the divergence starts here")
    if row.origin == "between modules" and node.parent is not None:
        add_note(row, _between_note(node))


def made_nonfinite(row: RowDraft, node: Node) -> bool | None:
    """For an op output holding NaN or infinities where the other side holds none: True when B's op made them
    from finite inputs, False when one of its inputs held them already (it spread them); None otherwise
    (not an op, no such mismatch, or counts not recorded)."""
    if node.op is None or not (row.nan_mismatch or row.inf_mismatch):
        return None
    counts = [[r.stats.get(key) for key in _NONFINITE] for r in node.inputs()]
    if any(not isinstance(n, (int, float)) for c in counts for n in c):
        return None
    return not any(n for c in counts for n in c)


def _origin(side: str, phase: str, node: Node) -> str:
    if side == "out":
        return "introduced"
    if node.parent is None and phase == "forward":
        return "model inputs"
    return "between modules"


def _between_note(node: Node) -> str:
    """Names the code that ran between module calls: the caller as recorded (containers are never called)."""
    caller = node.parent
    assert caller is not None
    earlier = [c for c in caller.children if c.enter_order < node.enter_order]
    after = f" after {earlier[-1].module_path} returned" if earlier else ""
    return (f"changed by the code of {caller.module_path} (call {caller.call_index}) between its submodule "
            f"calls{after}, before {node.module_path} ran")


def _raise_running(running: dict[tuple[str, int], float], holder: dict[tuple[str, int], int], phase: str,
                   node: Node, value: float, index: int) -> None:
    current: Node | None = node
    while current is not None:
        key = (phase, id(current))
        if not value > running.get(key, -1.0):
            return  # every ancestor already holds at least this call's largest excess
        running[key] = value
        holder[key] = index
        current = current.parent
