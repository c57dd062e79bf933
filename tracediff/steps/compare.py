"""``tracediff.compare_steps``: the first step, group and tensor at which two training runs differ.

::

    import tracediff

    result = tracediff.compare_steps("runs/a", "runs/b")
    if not result:
        d = result.first_divergence
        print(d.step, d.group, d.name, d.reason)   # 3 optimizer param_groups.0.lr value 0.001 vs 0.002
    print(result.steps)                             # one row per shared step: counts, largest drift

Records are compared per ``(step, rank)`` that both runs hold, steps in
increasing order, groups in causal order (``rngs``, ``batch``, ``params``,
``buffers``, ``grads``, ``optimizer``: what a step starts from, then what it
computes), entries within a group in model order (run A's, then names only
run B has). Each entry is judged by :func:`tracediff.steps.rule.judge`:
equal hashes are identical; with ``atol == rtol == 0`` (the default) any hash
difference is a divergence; with a tolerance, differing tensors pass when
their statistics (min, max, mean, abs_mean, std, median, as recorded) satisfy
``|b - a| <= atol + rtol * |a|``. Steps only one run recorded are listed in
``only_in_a``/``only_in_b`` and not compared; groups only one run recorded
are listed in ``groups_skipped``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError, UsageError
from ..format import LEGACY_PY_VALUE, PY_TYPE, PY_VALUE, REPR
from .layout import RunFolder, open_run, read_record
from .options import GROUPS
from .records import aggregate_key, group_items
from .result import StatRow, Status, StepComparison, StepDivergence, StepSummary, Verdict
from .rule import judge
from .stat_names import NUMERIC_STATS

_FIELDS = ("hash", "shape", "dtype", "device", PY_TYPE, PY_VALUE, LEGACY_PY_VALUE, REPR, "seed", "error")


def compare_steps(
    run_a: str | Path, run_b: str | Path, *, atol: float = 0.0, rtol: float = 0.0
) -> StepComparison:
    """Compare two folders written by ``StepRecorder`` (see the module docstring).

    Args:
        run_a: the reference run; ``rtol`` is relative to its values.
        run_b: the run compared with it.
        atol: absolute tolerance on tensor statistics (default 0: exact).
        rtol: relative tolerance on tensor statistics (default 0: exact).

    Raises:
        TraceFormatError: a folder is not a training record, or a record is not valid JSON.
        UsageError: a negative or NaN tolerance.

    Two runs with no step in common, or no group recorded by both, compare
    nothing: the result is undecided (``verdict``), never passed.
    """
    atol, rtol = _tolerance("atol", atol), _tolerance("rtol", rtol)
    a, b = open_run(run_a), open_run(run_b)
    shared = sorted(set(a.records) & set(b.records))
    steps_a, steps_b = {s for s, _ in a.records}, {s for s, _ in b.records}
    groups = tuple(g for g in GROUPS if g in a.groups and g in b.groups)
    skipped = tuple(g for g in GROUPS if (g in a.groups) != (g in b.groups))
    summaries: list[StepSummary] = []
    first: StepDivergence | None = None
    needed: float | None = 0.0
    for step, rank in shared:
        summary, divergence, step_needed = _compare_step(a, b, step, rank, groups, atol, rtol)
        summaries.append(summary)
        first = first or divergence
        needed = None if needed is None or step_needed is None else max(needed, step_needed)
    reason = None  # comparing nothing is never a pass: undecided
    if not shared:
        reason = (f"no step recorded in both runs (A: {_span(steps_a)}; B: {_span(steps_b)}); record the same "
                  "steps in both")
    elif not sum(s.compared for s in summaries):
        reason = (f"nothing to compare (groups recorded by both runs: {', '.join(groups) or 'none'}; steps in "
                  f"both: {len(shared)}); record the same groups (checksums=...) in both runs")
    return StepComparison(
        run_a=str(a.root), run_b=str(b.root), atol=atol, rtol=rtol, passed=first is None and reason is None,
        reason=reason,
        first_divergence=first, step_summaries=tuple(summaries),
        only_in_a=tuple(sorted(steps_a - steps_b)), only_in_b=tuple(sorted(steps_b - steps_a)),
        groups=groups, groups_skipped=skipped, needed_atol=needed,
    )


def _compare_step(
    a: RunFolder, b: RunFolder, step: int, rank: int, groups: tuple[str, ...], atol: float, rtol: float
) -> tuple[StepSummary, StepDivergence | None, float | None]:
    ra, rb = read_record(a, step, rank), read_record(b, step, rank)
    compared = differ = diverged = 0
    max_drift: float | None = None
    max_rel: float | None = None
    needed: float | None = 0.0
    first: StepDivergence | None = None
    for group in groups:
        try:
            items_a = dict(group_items(group, ra["groups"].get(group)))
            items_b = dict(group_items(group, rb["groups"].get(group)))
        except (AttributeError, TypeError, KeyError) as e:
            raise TraceFormatError(f"{a.records[(step, rank)]} or {b.records[(step, rank)]}: "
                                   f"malformed {group!r} group ({e})") from e
        agg_a, agg_b = ra.get(aggregate_key(group)), rb.get(aggregate_key(group))
        if agg_a is not None and agg_a == agg_b:
            compared += len(items_a)
            continue
        for name in [*items_a, *(n for n in items_b if n not in items_a)]:
            try:
                verdict = judge(items_a.get(name), items_b.get(name), atol=atol, rtol=rtol)
            except (AttributeError, TypeError, KeyError, ValueError, OverflowError) as e:  # a hand-edited entry
                raise TraceFormatError(f"{a.records[(step, rank)]} or {b.records[(step, rank)]}: malformed entry "
                                       f"{name!r} in the {group!r} group ({type(e).__name__}: {e})") from None
            compared += 1
            if verdict.status == "identical":
                continue
            differ += 1
            max_drift = _max(max_drift, verdict.drift)
            max_rel = _max(max_rel, verdict.rel_drift)
            needed = _needed(needed, verdict)
            if verdict.status == "diverged":
                diverged += 1
                if first is None:
                    first = _divergence(step, rank, group, name, verdict, items_a.get(name), items_b.get(name))
    status: Status = "diverged" if diverged else ("within_tolerance" if differ else "identical")
    summary = StepSummary(
        step=step, rank=rank, status=status, compared=compared, differ=differ, diverged=diverged,
        max_drift=max_drift, max_rel_drift=max_rel,
        first_group=first.group if first else None, first_name=first.name if first else None,
        complete_a=bool(ra.get("complete")), complete_b=bool(rb.get("complete")),
    )
    return summary, first, needed


def _needed(needed: float | None, verdict: Verdict) -> float | None:
    quantified = verdict.clause in ("exact", "tolerance") and verdict.drift is not None
    if needed is None or not quantified or not math.isfinite(verdict.drift or 0.0):
        return None
    return max(needed, verdict.drift or 0.0)


def _divergence(step: int, rank: int, group: str, name: str, verdict: Verdict,
                a: dict[str, Any] | None, b: dict[str, Any] | None) -> StepDivergence:
    return StepDivergence(step=step, rank=rank, group=group, name=name, reason=verdict.reason, a=a, b=b,
                          stats=side_by_side(a or {}, b or {}), drift=verdict.drift)


def side_by_side(a: dict[str, Any], b: dict[str, Any]) -> tuple[StatRow, ...]:
    """The fields and statistics of two entries, row by row, with ``b - a`` for numbers."""
    rows = [StatRow(key, a.get(key), b.get(key)) for key in _FIELDS if key in a or key in b]
    sa, sb = a.get("stats") or {}, b.get("stats") or {}
    for stat in NUMERIC_STATS:
        if stat in sa or stat in sb:
            x, y = sa.get(stat), sb.get(stat)
            diff = None
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and _is_number(x) and _is_number(y):
                diff = float(y) - float(x) if x != y else 0.0
            rows.append(StatRow(stat, x, y, diff))
    return tuple(rows)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _max(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None else max(current, value)


def _tolerance(name: str, value: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name}={value!r}: expected a number >= 0") from None
    if not number >= 0 or math.isinf(number):
        raise UsageError(f"{name}={value!r}: expected a finite number >= 0")
    return number


def _span(steps: set[int]) -> str:
    if not steps:
        return "no steps"
    ordered = sorted(steps)
    return ", ".join(map(str, ordered)) if len(ordered) <= 6 else f"{ordered[0]}..{ordered[-1]} ({len(ordered)} steps)"
