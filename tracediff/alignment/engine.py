"""``tracediff.align``: where does trace B first depart from reference trace A?

A short tour::

    import tracediff

    result = tracediff.align("traces/orig", "traces/port", atol=1e-5)
    if not result:
        row = result.first_divergence
        print(row.module_path_b, row.tensor, row.max_abs_err, row.origin)
    result.table            # pandas DataFrame, one row per compared tensor
    result.to_dict()        # the JSON report

1. Both traces are loaded (:func:`tracediff.load_trace`); payloads stay on disk.
2. Nodes are matched by path and call index, with rename rules, or by
   structure when names do not line up (:mod:`tracediff.alignment.matching`).
3. Each matched tensor pair is compared, one pair in memory at a time, from
   payloads when both sides have them and from recorded statistics otherwise
   (rows marked ``approximate``), under the tolerance of
   :mod:`tracediff.alignment.tolerance`.
4. Rows are ordered by B's execution order; the first row out of tolerance is
   the first divergence, and ``origin`` tells whether the module introduced
   the error or inherited it from its inputs.
5. Non-tensor arguments that differ between matched nodes are reported too.

A payload that cannot be read marks its row ``unreadable`` and the rest of the
report is still produced; a trace that cannot be read at all raises a
``TracediffError`` naming the file.
"""

from __future__ import annotations

import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..trace.load import Trace, load_trace
from ..trace.model import Node, TensorRecord
from .arguments import diff_arguments
from .compare import compare_records
from .matching import RenameRules, check_rename, match_nodes, pair_tensors, suggest_rename
from .result import Alignment, TensorComparison, Unmatched
from .tolerance import Tolerance, TolerancePolicy

TraceLike = str | Path | Trace

_ELEMENT_BYTES = {"float64": 8, "int64": 8, "complex64": 8, "float32": 4, "int32": 4, "float16": 2,
                  "bfloat16": 2, "int16": 2}


def _as_trace(value: TraceLike) -> Trace:
    return value if isinstance(value, Trace) else load_trace(value)


def align(
    a: TraceLike,
    b: TraceLike,
    *,
    atol: Tolerance = None,
    rtol: Tolerance = None,
    rename: RenameRules | None = None,
    progress: bool = False,
) -> Alignment:
    """Compare trace ``b`` against the reference trace ``a``.

    Args:
        a: the reference: a trace folder, its JSON file, or a loaded ``Trace``.
        b: the trace to check, in the same forms.
        atol: absolute tolerance: a number, or ``{"*": 1e-5, "layers.*.mlp": 1e-4}``
            per module-path pattern. Default: torch.testing's for the pair's dtype.
        rtol: relative tolerance, in the same forms.
        rename: ``[(regex, replacement), ...]`` applied in order to A's paths
            (root component removed) before matching by name.
        progress: show a progress bar on stderr (only when it is a terminal).

    Returns:
        An ``Alignment``: truthy when every compared tensor is within tolerance.
    """
    trace_a, trace_b = _as_trace(a), _as_trace(b)
    rules = check_rename(rename or [])
    policy = TolerancePolicy(atol=atol, rtol=rtol)
    matching = match_nodes(trace_a, trace_b, rules)
    jobs, unmatched_a, unmatched_b = [], [], []
    for node_a, node_b in matching.pairs:
        pairs, only_a, only_b = pair_tensors(node_a, node_b)
        jobs.extend((node_a, ra, node_b, rb) for ra, rb in pairs)
        unmatched_a += [Unmatched(node_a.module_path, node_a.call_index, t.slot) for t in only_a]
        unmatched_b += [Unmatched(node_b.module_path, node_b.call_index, t.slot) for t in only_b]
    jobs.sort(key=lambda job: job[3].order)

    tolerances = [policy.resolve((na.relative_path, nb.relative_path), ra.dtype, rb.dtype)
                  for na, ra, nb, rb in jobs]
    tick = _progress(progress, jobs)

    def compare(index: int) -> dict[str, Any]:
        _, ra, _, rb = jobs[index]
        fields = compare_records(trace_a, ra, trace_b, rb, atol=tolerances[index][0], rtol=tolerances[index][1])
        tick(rb)
        return fields

    with _workers(len(jobs)) as run:
        results = run(compare, range(len(jobs)))
    tick(None)
    rows = [_row(order, na, ra, nb, rb, *tolerances[order], fields)
            for order, ((na, ra, nb, rb), fields) in enumerate(zip(jobs, results))]

    known = [n.relative_path for n in trace_b.nodes()] + [n.relative_path for n in trace_a.nodes()]
    warnings = policy.unused_pattern_warnings(known)
    if matching.structural:
        warnings.insert(0, "module paths did not line up; nodes were matched by structure "
                           "(shapes, dtypes and call order). Check the suggested rename map.")
    return Alignment(
        trace_a=str(trace_a.directory), trace_b=str(trace_b.directory),
        model_a=trace_a.model_name, model_b=trace_b.model_name,
        rows=tuple(_with_origins(rows)),
        unmatched_a=tuple([Unmatched(n.module_path, n.call_index) for n in matching.unmatched_a] + unmatched_a),
        unmatched_b=tuple([Unmatched(n.module_path, n.call_index) for n in matching.unmatched_b] + unmatched_b),
        argument_diffs=tuple(diff_arguments(matching.pairs)),
        structural=matching.structural,
        suggested_rename=tuple(suggest_rename(matching.pairs)) if matching.structural else (),
        warnings=tuple(warnings),
        matched_nodes=len(matching.pairs),
    )


@contextmanager
def _workers(jobs: int) -> Iterator[Callable[..., list[Any]]]:
    """Compare tensor pairs on every core, each pair single-threaded.

    One pair per core beats torch's intra-op threads here: most tensors are
    small enough that splitting each operation costs more than it saves,
    and the threads never wait on each other's barriers. Torch's thread
    count is restored afterwards.
    """
    cores = min(os.cpu_count() or 1, 8)
    if cores < 2 or jobs < 2:
        yield lambda fn, items: [fn(i) for i in items]
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=cores, thread_name_prefix="tracediff-align") as pool:
            yield lambda fn, items: list(pool.map(fn, items))
    finally:
        torch.set_num_threads(previous)


def _row(order: int, node_a: Node, ra: TensorRecord, node_b: Node, rb: TensorRecord,
         atol: float, rtol: float, fields: dict[str, Any]) -> TensorComparison:
    return TensorComparison(
        order=order, module_path_a=node_a.module_path, module_path_b=node_b.module_path,
        call_index=node_a.call_index, call_index_b=node_b.call_index, tensor=rb.slot, tensor_a=ra.slot,
        shape_a=ra.shape, shape_b=rb.shape, dtype_a=ra.dtype, dtype_b=rb.dtype, atol=atol, rtol=rtol,
        module_type=node_b.module_type or node_a.module_type, **fields,
    )


def _role(slot: str) -> tuple[str, str]:
    """(pass, side) of a slot: what flows into a call and what comes out, forward or backward."""
    head = slot.split(".", 1)[0]
    return {"inputs": ("forward", "in"), "outputs": ("forward", "out"),
            "grad_outputs": ("backward", "in"), "grad_inputs": ("backward", "out")}.get(head, ("forward", "out"))


def _with_origins(rows: list[TensorComparison]) -> list[TensorComparison]:
    """Fill input_err, amplification and origin from the rows of what flowed into each call."""
    incoming: defaultdict[tuple[str, int, str], list[TensorComparison]] = defaultdict(list)
    for row in rows:
        phase, side = _role(row.tensor)
        if side == "in":
            incoming[(row.module_path_b, row.call_index_b, phase)].append(row)
    out = []
    earlier_divergence = False
    for row in rows:
        phase, side = _role(row.tensor)
        ins = incoming.get((row.module_path_b, row.call_index_b, phase), [])
        errs = [r.max_abs_err for r in ins if not math.isnan(r.max_abs_err)]
        input_err = max(errs) if errs else None
        amplification = None
        if side == "out" and input_err is not None and not math.isnan(row.max_abs_err):
            if input_err > 0:
                amplification = row.max_abs_err / input_err
            elif row.max_abs_err > 0:
                amplification = math.inf
        origin = None
        if row.diverged:
            if side == "out":
                origin = "inherited" if any(r.diverged for r in ins) else "introduced"
            elif "." not in row.module_path_b and phase == "forward":
                origin = "model inputs"
            else:  # nothing recorded before it diverged: the caller's own code between module calls did it
                origin = "inherited" if earlier_divergence else "between modules"
            earlier_divergence = True
        out.append(replace(row, input_err=input_err, amplification=amplification, origin=origin))
    return out


def _progress(enabled: bool, jobs: list[tuple[Node, TensorRecord, Node, TensorRecord]]) -> Callable[[Any], None]:
    if not enabled or not sys.stderr.isatty() or len(jobs) < 50:
        return lambda _record: None
    from tqdm import tqdm

    total = sum(_record_bytes(job[1]) + _record_bytes(job[3]) for job in jobs)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="align", file=sys.stderr, leave=False)

    def tick(record: TensorRecord | None) -> None:
        if record is None:
            bar.close()
        else:
            bar.update(_record_bytes(record) * 2)

    return tick


def _record_bytes(record: TensorRecord) -> int:
    numel = math.prod(record.shape) if record.shape else 1
    return numel * _ELEMENT_BYTES.get((record.dtype or "").removeprefix("torch."), 1)


def assert_traces_close(
    a: TraceLike,
    b: TraceLike,
    *,
    atol: Tolerance = None,
    rtol: Tolerance = None,
    rename: RenameRules | None = None,
) -> Alignment:
    """Raise ``AssertionError`` naming the first divergence unless every tensor pair is within tolerance.

    Returns the ``Alignment`` when it passes, for further checks.
    """
    result = align(a, b, atol=atol, rtol=rtol, rename=rename)
    if result.passed:
        return result
    first = result.first_divergence
    lines = [f"traces differ: {len(result.diverged)} of {len(result.rows)} compared tensors out of tolerance"]
    if first is not None:
        lines.append(f"first divergence ({first.origin}): {first.describe()}")
    for row in result.unreadable[:3]:
        lines.append(f"unreadable: {row.describe()}")
    raise AssertionError("\n".join(lines))
