"""Aligning two generation traces step by step: step k of A pairs with step k of B.

A trace captured around ``model.generate(...)`` holds one top-level call per
decode step (``Trace.root_steps``: 0 the prefill, k the pass reading the k-th
new token). ``align`` pairs top-level calls in order, so step k meets step k;
this module

* restricts both traces to one step (``align(..., step=K)``), or to the steps
  both hold when their counts differ (and says so in a warning);
* names each row's step (``TensorComparison.step``) and the absolute token
  position where each step's sequence starts;
* sums up per step: ``Alignment.steps`` (a ``StepAlignment``) names the first
  diverging step; the first divergence is the first diverging layer inside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..errors import UsageError
from ..trace.load import Trace
from ..trace.model import Node
from .lm_results import StepAlignment
from .result import TensorComparison
from .rows import RowDraft

_SEQUENCE_SLOTS = ("inputs.kwargs.input_ids", "inputs.args.0", "inputs.kwargs.inputs_embeds")
_POSITION_SLOTS = ("inputs.kwargs.cache_position", "inputs.kwargs.position_ids")




def step_count(trace: Trace) -> int:
    """The decode steps a trace holds (0 when it was not captured around ``generate``)."""
    return sum(1 for step in trace.root_steps if step is not None)


def restrict_steps(a: Trace, b: Trace, step: int | None) -> tuple[Trace, Trace, str | None]:
    """The two traces cut to ``step`` (or to the steps both hold), and a note when steps were left out.

    UsageError naming the trace when ``step`` is given and a trace lacks it.
    """
    count_a, count_b = step_count(a), step_count(b)
    if step is not None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise UsageError(f"step={step!r}: expected a decode step number, 0 or more")
        for trace, count in ((a, count_a), (b, count_b)):
            if step not in trace.root_steps:
                held = f"decode steps 0-{count - 1}" if count else "no decode steps (not captured around generate)"
                raise UsageError(f"{trace.directory}: has no decode step {step}; it holds {held}")
        return _only(a, {step}), _only(b, {step}), None
    if not count_a or not count_b or count_a == count_b:
        return a, b, None
    common = min(count_a, count_b)
    note = (f"A holds {count_a} decode steps and B {count_b}: compared the {common} steps both hold "
            f"(0-{common - 1})")
    return _only(a, set(range(common))), _only(b, set(range(common))), note


def _only(trace: Trace, steps: set[int]) -> Trace:
    keep = [i for i, step in enumerate(trace.root_steps) if step in steps]
    tokens = [trace.root_tokens[i] if i < len(trace.root_tokens) else None for i in keep]
    return replace(trace, roots=[trace.roots[i] for i in keep], root_steps=[trace.root_steps[i] for i in keep],
                   root_tokens=tokens, backward=[])


def sequence_starts(trace: Trace) -> dict[int, tuple[int, int]]:
    """``{root index: (first absolute position, tokens read)}`` for each top-level call whose input ids are known.

    The start is the smallest recorded ``cache_position`` or ``position_ids``
    of the call; without them, with a KV cache step k reads one token at
    position ``prompt + k - 1`` and without one the whole sequence from 0:
    ``prompt + k - tokens read`` either way (the prompt: step 0's length).
    """
    lengths = [_tokens_read(root) for root in trace.roots]
    prompt = next((length for length, step in zip(lengths, trace.root_steps) if step == 0), None)
    out = {}
    for i, length in enumerate(lengths):
        if length is None:
            continue
        step = trace.root_steps[i] if i < len(trace.root_steps) else None
        start = _first_position(trace.roots[i])
        if start is None:
            start = prompt + step - length if step is not None and prompt is not None else 0
        out[i] = (max(start, 0), length)
    return out


def _first_position(root: Node) -> int | None:
    records = {record.slot: record for record in root.tensors}
    for slot in _POSITION_SLOTS:
        record = records.get(slot)
        low = record.stats.get("min") if record is not None else None
        if isinstance(low, (int, float)) and low == low:
            return int(low)
    return None


def _tokens_read(root: Node) -> int | None:
    records = {record.slot: record for record in root.tensors}
    for slot in _SEQUENCE_SLOTS:
        record = records.get(slot)
        if record is not None and record.shape is not None and len(record.shape) >= 2:
            return record.shape[1]
    return None


def root_of_calls(trace: Trace) -> dict[tuple[str, int], int]:
    """``{(module path, call index): index of the top-level call it ran under}``."""
    return {(node.module_path, node.call_index): i for i, root in enumerate(trace.roots) for node in root.walk()}


def set_steps(rows: Sequence[RowDraft], b: Trace) -> None:
    """Give each row (still a draft) the decode step of B's call, when B's trace holds decode steps."""
    if not any(step is not None for step in b.root_steps):
        return
    roots = root_of_calls(b)
    for row in rows:
        index = roots.get((row.module_path_b, row.call_index_b))
        step = b.root_steps[index] if index is not None and index < len(b.root_steps) else None
        if step is not None:
            row.step = step


def summarize_steps(rows: Sequence[TensorComparison], a: Trace, b: Trace, *, selected: int | None,
                    note: str | None, counts: tuple[int, int]) -> StepAlignment | None:
    """The steps compared and those diverging (rows carry their step: :func:`set_steps`); None when neither
    trace holds decode steps, or when one holds none and the other one (a forward against one evaluation of a
    graph runtime: nothing step by step to say)."""
    if min(counts) == 0 and max(counts) <= 1:
        return None
    diverged: list[int] = []
    for row in rows:
        if row.step is not None and row.within_tolerance is False and row.step not in diverged:
            diverged.append(row.step)
    compared = tuple(sorted({s for s in b.root_steps if s is not None} & {s for s in a.root_steps if s is not None}))
    return StepAlignment(counts[0], counts[1], compared, selected, tuple(sorted(diverged)), note)
