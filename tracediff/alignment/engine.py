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
   structure when names do not line up (:mod:`tracediff.alignment.pairing.calls`).
3. Each matched tensor pair is compared, one pair in memory at a time, from
   payloads when both sides have them and from recorded statistics otherwise
   (rows marked ``approximate``), under the tolerance of
   :mod:`tracediff.compare.tolerance`.
4. Rows are ordered by B's execution order; the first row out of tolerance is
   the first divergence. With ``baseline=`` each row is also judged against
   its noise floor; ``sources`` lists every row where error is introduced
   rather than inherited, and ``origin`` says which (see
   :mod:`tracediff.alignment.verdicts.apply`).
5. Non-tensor arguments that differ between matched nodes are reported too.

A payload that cannot be read marks its row ``unreadable`` and the rest of the
report is still produced; a trace that cannot be read at all raises a
``TracediffError`` naming the file.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..compare.measurement import Measurement
from ..compare.records import compare_records
from ..compare.tolerance import Tolerance, TolerancePolicy
from ..errors import UsageError
from ..maps.rules import _UNSET, MapSpec, map_argument, read_map
from ..order import reordered, worker_threads
from ..trace.load import Trace, load_trace
from ..trace.model import Node, TensorRecord
from ..trace.ranks import is_multi_rank
from .decode_steps import restrict_steps, set_steps, step_count, summarize_steps
from .lm_verdicts import TokenSpans, annotate_rows, check_logits_patterns, position_strip, reread_jobs, sequence_axes
from .ops import annotate_op_rows, pair_ops
from .pairing.permuted import decide_orders
from .pairing.plan import Plan, plan_pairs
from .pairing.producers import likely_source
from .pairing.unrecorded import carry_origin, mark_unrecorded_origin
from .result import Alignment, Job, TensorComparison, Unmatched
from .rows import RowDraft, draft_row, freeze_rows
from .token_choices import compare_tokens
from .unplaced import find_unplaced
from .verdicts.apply import check_ignore, judge
from .verdicts.arguments import diff_arguments
from .verdicts.noise import DEFAULT_NOISE_FACTOR
from .verdicts.sources import role

if TYPE_CHECKING:  # sharded and distributed alignments import their modules when they happen
    from concurrent.futures import ThreadPoolExecutor

    from ..sharding import ShardRules
    from .distributed import Group

TraceLike = str | Path | Trace

_ELEMENT_BYTES = {"float64": 8, "int64": 8, "complex64": 8, "float32": 4, "int32": 4, "float16": 2,
                  "bfloat16": 2, "int16": 2}


def _shard_rules(shards: str | Path | ShardRules | None) -> ShardRules | None:
    """``--shards``: the declared layouts, read from their file when given as one."""
    if shards is None or not isinstance(shards, (str, Path)):
        return shards
    from ..sharding import read_rules

    return read_rules(shards)


def _strip_of(merged: Any, first: TensorComparison, job: Job, spans: TokenSpans) -> Any:
    from .distributed import strip_of

    return strip_of(merged, first, job, spans)


def _load_sides(a: TraceLike, b: TraceLike, baseline: TraceLike | None, shards: ShardRules | None = None
                ) -> tuple[Trace, Trace, Trace | None]:
    """The traces of an alignment. A folder or file named twice (``align T T``, a baseline that is A) is read
    once: the alignment only reads a trace, never changes it. A multi-rank folder is read as its global trace
    (:mod:`tracediff.sharding`), with the declared layouts ``shards``."""
    loaded: dict[Path, Trace] = {}

    def get(value: TraceLike) -> Trace:
        if isinstance(value, Trace):
            return value
        try:
            key = Path(value).resolve()
        except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop: load_trace says what is wrong
            return load_trace(value)
        if key not in loaded:
            if is_multi_rank(value):
                from ..sharding import load_sharded

                loaded[key] = load_sharded(value, shards=shards)
            else:
                loaded[key] = load_trace(value)
        return loaded[key]

    sides = get(a), get(b), (get(baseline) if baseline is not None else None)
    if shards is not None:
        if not any(side is not None and side.sharded for side in sides):
            raise UsageError(f"{shards.source}: declared layouts need a multi-rank trace; neither trace is one")
        shards.check_used()
    return sides


def align(
    a: TraceLike,
    b: TraceLike,
    *,
    atol: Tolerance = None,
    rtol: Tolerance = None,
    map: MapSpec = None,
    progress: bool = False,
    baseline: TraceLike | None = None,
    noise_factor: float = DEFAULT_NOISE_FACTOR,
    ignore: Iterable[str] | str | None = None,
    match: str = "auto",
    allow_incomplete: bool = False,
    rename: MapSpec = _UNSET,
    step: int | None = None,
    logits: str | Sequence[str] | None = None,
    shards: str | Path | ShardRules | None = None,
    distributed: bool = False,
) -> Alignment:
    """Compare trace ``b`` against the reference trace ``a``.

    Args:
        a: the reference: a trace folder, its JSON file, or a loaded ``Trace``.
        b: the trace to check, in the same forms. A folder or file named twice among ``a``, ``b`` and
            ``baseline`` is read once.
        atol: absolute tolerance: a number, or ``{"*": 1e-5, "layers.*.mlp": 1e-4}``
            per module-path pattern. Default: torch.testing's for the pair's dtype.
        rtol: relative tolerance, in the same forms.
        map: the rename map (the command line's ``--map``): rename rules
            ``[(regex, replacement), ...]`` applied in order to A's paths (root
            component removed) before matching by name; or the object a map
            file holds, ``{"rename": [...], "slots": [...]}``; or the path of
            such a JSON file (see :mod:`tracediff.maps.rules`). Default: no rules.
        progress: show a progress bar on stderr (only when it is a terminal).
        baseline: the reference run under B's conditions (B's dtype, device,
            kernels), in the same forms as ``a``. Each row's error is then
            also judged against the noise floor, A vs the baseline (see
            :mod:`tracediff.alignment.verdicts.noise`). Default: none.
        noise_factor: a row is within tolerance when its error is at most
            this many times its noise floor; also the growth that makes a row
            a source. Default 3.
        ignore: ``PATH``, ``PATH:SLOT`` or ``:SLOT`` globs (one or a list):
            matching rows are compared but set aside in ``Alignment.ignored``
            and never fail the verdict (see :mod:`tracediff.alignment.verdicts.apply`).
        match: ``"auto"`` (default: names and the rename map first, then
            structure for the calls still unpaired, then layouts), ``"name"``
            (names and the map only) or ``"structure"`` (ignore names); see
            :mod:`tracediff.alignment.pairing.calls`. A map's ``slots`` rules rename
            tensor slots (:mod:`tracediff.alignment.pairing.slots`).
        allow_incomplete: when a trace is incomplete (its forward raised, its
            capture was interrupted or its process died), the comparison ends
            where that trace ends, so by default the alignment does not pass
            (``incomplete_a``/``incomplete_b`` say why). ``True`` judges only
            the tensors both traces hold. Default False.
        rename: the name of ``map`` until 0.2; deprecated (``DeprecationWarning``), removed in 0.4.
        step: generation traces only: compare decode step ``step`` alone
            (UsageError when a trace lacks it). Default: every step both
            traces hold, step k against step k (a warning says when their
            counts differ); ``Alignment.steps`` names the first diverging
            step. See :mod:`tracediff.alignment.decode_steps`.
        logits: module-path globs whose outputs are logits (``"lm_head"``),
            judged by KL, top-k agreement and argmax flips besides the root's
            ``outputs.logits``; see :mod:`tracediff.alignment.lm_verdicts`.
        shards: declared layouts for multi-rank traces whose tensors were recorded without one: the path of a
            ``--shards`` rules file, or its parsed ``ShardRules`` (see :mod:`tracediff.sharding.rules`). A
            multi-rank folder (``rank{r}/`` and ``tracediff_ranks.json``) is read as one global trace either
            way (:mod:`tracediff.sharding`). Default: none.
        distributed: under ``torchrun --nproc-per-node N`` (B a multi-rank folder of N ranks): each rank
            measures the shards of its own rank folder against the slice of ``a`` they cover, and rank 0
            merges the measurements into the rows the one-process alignment builds; every rank returns the
            same ``Alignment`` (see :mod:`tracediff.alignment.distributed`). Without torchrun's environment a
            ``UsageError``. Default False.

    Returns:
        An ``Alignment``: truthy when every compared tensor is within tolerance.
    """
    options: dict[str, Any] = dict(atol=atol, rtol=rtol, map=map, progress=progress, baseline=baseline,
                                   noise_factor=noise_factor, ignore=ignore, match=match,
                                   allow_incomplete=allow_incomplete, rename=rename, step=step, logits=logits,
                                   shards=shards)
    if not distributed:
        result = _align(a, b, None, **options)
        assert result is not None
        return result
    from .distributed import distributed_run, shared

    with distributed_run() as group:
        shared_result: Alignment = shared(group, lambda: _align(a, b, group, **options))
        return shared_result


def _align(a: TraceLike, b: TraceLike, group: Group | None, *, atol: Tolerance, rtol: Tolerance, map: MapSpec,
           progress: bool, baseline: TraceLike | None, noise_factor: float, ignore: Iterable[str] | str | None,
           match: str, allow_incomplete: bool, rename: MapSpec, step: int | None,
           logits: str | Sequence[str] | None, shards: str | Path | ShardRules | None) -> Alignment | None:
    """``align``; with ``group``, this rank's part of a distributed alignment (None on ranks other than 0)."""
    if not (isinstance(noise_factor, (int, float)) and noise_factor >= 1):
        raise UsageError(f"noise_factor={noise_factor!r}: expected a number >= 1")
    ignore_rules = check_ignore(ignore)
    logits_patterns = check_logits_patterns(logits)
    shard_rules = _shard_rules(shards)
    trace_a, trace_b, trace_n = _load_sides(a, b, baseline, shard_rules)
    sharded = trace_a.sharded or trace_b.sharded
    if sharded:
        from .sharded import findings, name_ranks, place_unrecorded

        place_unrecorded(trace_a, trace_b)
    step_counts = (step_count(trace_a), step_count(trace_b))
    trace_a, trace_b, step_note = restrict_steps(trace_a, trace_b, step)
    rename_map = read_map(map_argument(map, rename))
    rules = list(rename_map.rename)
    policy = TolerancePolicy(atol=atol, rtol=rtol)
    plan = plan_pairs(trace_a, trace_b, rules, match=match, slots=list(rename_map.slots))  # calls, tensors, layouts
    matching = plan.matching
    jobs, unmatched_a, unmatched_b = list(plan.jobs), list(plan.unmatched_a), list(plan.unmatched_b)
    # op nodes, inside matched calls: what flows from the module tensors paired above into ops is linked
    op_pairing = pair_ops(trace_a, trace_b, matching.pairs, policy, values=plan.values, tensor_pairs=plan.jobs)
    jobs += op_pairing.jobs
    unmatched_a += op_pairing.unmatched_a
    unmatched_b += op_pairing.unmatched_b
    jobs.sort(key=lambda job: job[3].order)
    merged = None
    spans = TokenSpans.of(trace_b)
    if group is not None:  # each rank measures its own shards; rank 0 goes on with the merged rows
        from .distributed import measure_where_stored

        merged = measure_where_stored(group, jobs, trace_a, trace_b, lambda i: policy.resolve(
            (jobs[i][0].relative_path, jobs[i][2].relative_path), jobs[i][1].dtype, jobs[i][3].dtype), plan.how,
            spans)
        if merged is None:
            return None
    apart = merged.measurements if merged is not None else {}
    sliced = merged.apart if merged is not None else {}  # rows whose pair is never read whole on rank 0

    tick = _progress(progress and (group is None or group.is_root), jobs)
    axis_of = sequence_axes(spans)
    # what the comparison of row i found for its annotations (pcc, positions): read once, in the same pass
    measurements: list[Measurement | None] = [None] * len(jobs)

    def compare(order: int, tick: Callable[[Any], None] = tick) -> RowDraft:
        na, ra, nb, rb = jobs[order]
        atol, rtol = policy.resolve((na.relative_path, nb.relative_path), ra.dtype, rb.dtype)
        # a pair related by a layout transform is compared through it (plan.how is empty for most traces)
        measurement = apart.get(order) or plan.how and plan.compare(trace_a, ra, trace_b, rb, atol=atol, rtol=rtol) \
            or compare_records(trace_a, ra, trace_b, rb, atol=atol, rtol=rtol, along=axis_of(nb, rb))
        measurements[order] = measurement
        tick(rb)
        return draft_row(order, na.module_path, nb.module_path, na.call_index, nb.call_index, rb.slot,
                         ra.slot, ra.shape, rb.shape, ra.dtype, rb.dtype, atol, rtol,
                         nb.module_type or na.module_type, measurement)

    # each row is a draft (alignment.rows) until every stage below has decided it, then frozen once
    # threads help only where numpy works on payloads; statistics are compared in Python, under the GIL
    with _workers(_pair_bytes(jobs)) as run:
        drafts: list[RowDraft] = run(compare, range(len(jobs)))
    tick(None)
    # rotary pairs side by side or in halves
    reordered = decide_orders(drafts, jobs, trace_a, trace_b, plan.values, transformed=plan.how.keys(),
                              pcc=[m.pcc if m is not None else None for m in measurements])
    for i, order in reordered.items():
        plan.how[(id(jobs[i][1]), id(jobs[i][3]))] = ("layout", order)
    drafts = [compare(i, _no_tick) if i in reordered else row for i, row in enumerate(drafts)]
    annotate_op_rows(drafts, jobs, op_pairing)
    for i, matched_by, transform, pairing in plan.annotations(jobs):  # how each pair was found
        row = drafts[i]
        row.matched_by = matched_by or row.matched_by
        row.transform = transform
        row.pairing = pairing
    _with_origins(drafts, jobs)
    with _workers(2 * sum(_record_bytes(ra) for _, ra, _, _ in jobs if ra.has_payload) if trace_n is not None
                  else 0) as run:
        verdicts = judge(drafts, jobs, trace_a, baseline=trace_n, noise_factor=float(noise_factor),
                         ignore=ignore_rules, run=run, sharded=sharded, trace_b=trace_b)
    set_steps(drafts, trace_b)
    again = reread_jobs(drafts, jobs, measurements, logits_patterns, sliced)
    with _workers(_pair_bytes(again)) as run:  # only what the comparison could not annotate is read again
        logits_verdicts = annotate_rows(drafts, jobs, trace_a, trace_b, logits=logits_patterns, run=run,
                                        measurements=measurements, measured_apart=sliced, spans=spans)
    rows = freeze_rows(drafts)  # decided: from here on every row is a frozen TensorComparison
    del drafts
    # sharded traces: whose shard first goes out of tolerance
    if sharded:
        name_ranks(rows, jobs, trace_a, trace_b, merged.ranks if merged is not None else None)

    warnings = policy.unused_pattern_warnings(n.relative_path for nodes in (matching.nodes_b, matching.nodes_a)
                                              for n in nodes)
    if matching.structural and match != "structure":
        warnings.insert(0, "module paths did not line up; nodes were matched by structure "
                           "(values, sizes and call order). Check the suggested rename map.")
    warnings[:0] = plan.warnings
    if step_note:
        warnings.insert(0, step_note)
    kept = [rows[i] for i in verdicts.kept]
    for note in (_weak_first_divergence(kept, unmatched_b), _undecided_first_divergence(kept, jobs, plan)):
        if note:
            warnings.append(note)
    marked = mark_unrecorded_origin(kept, matching.gaps_a, matching.gaps_b)  # after the origins above
    steps = summarize_steps(marked, trace_a, trace_b, selected=step, note=step_note, counts=step_counts)
    first = next((row for row in marked if row.within_tolerance is False), None)
    strip = None if first is None else position_strip(first, jobs[first.order], trace_a, trace_b, spans) \
        if first.order not in sliced or merged is None else _strip_of(merged, first, jobs[first.order], spans)
    unpaired_b = [n for n in matching.unmatched_b if id(n) not in matching.idle]
    source = likely_source(first, jobs, unpaired_b) if first is not None else None
    return Alignment(
        trace_a=str(trace_a.directory), trace_b=str(trace_b.directory),
        model_a=trace_a.model_name, model_b=trace_b.model_name,
        rows=tuple(marked),
        sources=carry_origin([rows[i] for i in verdicts.sources], marked),
        ignored=tuple(rows[i] for i in verdicts.ignored),
        baseline=str(trace_n.directory) if trace_n is not None else None,
        noise_factor=float(noise_factor) if trace_n is not None else None,
        unmatched_a=tuple(unmatched_a), unmatched_b=tuple(unmatched_b),
        unrecorded_a=plan.unrecorded_a, unrecorded_b=plan.unrecorded_b,
        argument_diffs=tuple(diff_arguments(matching.pairs) + op_pairing.argument_diffs),
        structural=matching.structural,
        suggested_rename=tuple(plan.suggested),
        suggested_slots=tuple(plan.suggested_slots),
        warnings=tuple(warnings) + verdicts.warnings,
        matched_nodes=plan.matched_nodes,
        incomplete_a=trace_a.incomplete_reason, incomplete_b=trace_b.incomplete_reason,
        allow_incomplete=bool(allow_incomplete),
        importer_a=trace_a.importer, importer_b=trace_b.importer,
        steps=steps, logits=logits_verdicts, tokens=compare_tokens(trace_a, trace_b), position_strip=strip,
        payloads_expected=_holds_payloads(trace_a) and _holds_payloads(trace_b),
        shard_findings=findings(trace_a, trace_b) if sharded else (),
        unplaced=find_unplaced(matching, b_prunes_outputs=trace_b.producer == "transformers"),
        likely_source=source,
    )


def _holds_payloads(trace: Trace) -> bool:
    """Whether ``trace`` holds a payload file for any tensor (a trace written with ``use_repr=False``)."""
    return any(record.has_payload for node in trace.nodes() for record in node.tensors)


_THREADED_BYTES = 32 << 20


@contextmanager
def _workers(payload_bytes: int) -> Iterator[Callable[..., list[Any]]]:
    """Compare tensor pairs on every core, one pair per thread, when there are ``_THREADED_BYTES`` to read.

    One pair per core beats splitting each operation: most tensors are small,
    and numpy's kernels release the GIL, so the threads run side by side. Below
    that size the work is mostly Python (paths, headers, rows), which threads
    only slow down: the demo's 0.8 MB pair aligned in 0.05 s on one thread and
    0.1 s on two.
    """
    cores = worker_threads(min(os.cpu_count() or 1, 8))
    if cores < 2 or (payload_bytes < _THREADED_BYTES and not reordered()):  # TRACEDIFF_REORDER: always a pool
        yield lambda fn, items: [fn(i) for i in items]
        return
    from concurrent.futures import ThreadPoolExecutor  # imported for traces this large only: a small one waits for it

    with ThreadPoolExecutor(max_workers=cores, thread_name_prefix="tracediff-align") as pool:
        yield lambda fn, items: _in_chunks(pool, fn, list(items), cores)


def _in_chunks(pool: ThreadPoolExecutor, fn: Callable[[Any], Any], items: list[Any], cores: int) -> list[Any]:
    """``list(pool.map(fn, items))`` in runs of up to 64 items: one future per run, not per tensor pair
    (a future and its lock per pair cost more time and memory than a pair compared from statistics)."""
    size = max(1, min(64, len(items) // (cores * 8)))
    runs = pool.map(lambda run: [fn(item) for item in run], [items[i:i + size] for i in range(0, len(items), size)])
    return [result for run in runs for result in run]


def _with_origins(rows: list[RowDraft], jobs: list[Job]) -> None:
    """Set input_err, amplification and origin of the drafts from the rows of what flowed into each call.

    ``jobs[i]`` is the pair row ``i`` compared: its call in B is the call the row belongs to.
    """
    roles = [role(row.tensor) for row in rows]
    # (call in B, pass) -> [largest error among its input rows (None: none measured), did one diverge]
    inputs: dict[tuple[int, str], list[Any]] = {}
    for row, (phase, side), job in zip(rows, roles, jobs):
        if side == "in":
            seen = inputs.setdefault((id(job[2]), phase), [None, False])
            err = row.max_abs_err
            if err == err and (seen[0] is None or err > seen[0]):  # NaN (not measured) is left out
                seen[0] = err
            if row.within_tolerance is False:
                seen[1] = True
    earlier_divergence = False
    for row, (phase, side), job in zip(rows, roles, jobs):
        found = inputs.get((id(job[2]), phase))
        input_err = found[0] if found is not None else None
        amplification = None
        error = row.max_abs_err
        if side == "out" and input_err is not None and error == error:
            if input_err > 0:
                amplification = error / input_err
            elif error > 0:
                amplification = math.inf
        origin = None
        if row.within_tolerance is False:  # row.diverged
            if side == "out" and (found is not None or row.op is None):
                origin = "inherited" if found is not None and found[1] else "introduced"
            elif side == "out":  # an op paired by value: its inputs were not compared, earlier rows tell
                origin = "inherited" if earlier_divergence else "introduced"
            elif "." not in row.module_path_b and phase == "forward" and row.op is None:
                origin = "model inputs"
            else:  # nothing recorded before it diverged: the caller's own code between module calls did it
                origin = "inherited" if earlier_divergence else "between modules"
            earlier_divergence = True
        if input_err is not None:
            row.input_err = input_err
            row.amplification = amplification
        if origin is not None:
            row.origin = origin


def _weak_first_divergence(rows: Iterable[TensorComparison], unmatched_b: list[Unmatched]) -> str | None:
    """A warning when the first divergence rests on sizes alone, naming B's unpaired calls it could be instead."""
    first = next((row for row in rows if row.within_tolerance is False), None)
    if first is None or first.pairing != "shape":
        return None
    calls = [u.module_path for u in unmatched_b if u.tensor is None][:3]
    others = f"; unpaired calls of B: {', '.join(calls)}" if calls else ""
    return (f"the first divergence pairs {first.module_path_a} with {first.module_path_b} on sizes alone (no value, "
            f"name or map says they are the same computation): check that pair{others}")


def _undecided_first_divergence(rows: Iterable[TensorComparison], jobs: list[Job], plan: Plan) -> str | None:
    """When the first divergence arose between recorded calls, the unpaired calls that ran before it: one of
    them may hold the mistake, and two traces cannot tell (a rotary table one side computes in a call of
    its own, the other inside its attention)."""
    first = next((row for row in rows if row.within_tolerance is False), None)
    if first is None or first.origin != "between modules" or first.order >= len(jobs):
        return None
    node_a, _, node_b, _ = jobs[first.order]
    relaid = {id(n) for pair in plan.layout_nodes for n in pair}  # fused calls: paired by layout
    matching = plan.matching
    candidates = [n for n in matching.unmatched_b if n.enter_order < node_b.enter_order and not n.children
                  and id(n) not in relaid and id(n) not in matching.idle]
    candidates += [n for n in matching.unmatched_a if n.enter_order < node_a.enter_order and not n.children
                   and id(n) not in relaid and id(n) not in matching.idle]
    if not candidates:
        return None
    named = ", ".join(n.module_path for n in candidates[:6]) + (", ..." if len(candidates) > 6 else "")
    return (f"the first divergence arose between recorded calls ({first.module_path_b} {first.tensor}); calls "
            f"that ran before it have no partner and may hold the mistake, which two traces cannot decide: "
            f"{named}")


def _no_tick(_record: Any) -> None:
    pass


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


def _pair_bytes(jobs: Iterable[Job]) -> int:
    """The payload bytes of the pairs of ``jobs`` that have payloads on both sides."""
    return sum(_record_bytes(ra) + _record_bytes(rb) for _, ra, _, rb in jobs if ra.has_payload and rb.has_payload)


def _record_bytes(record: TensorRecord) -> int:
    numel = math.prod(record.shape) if record.shape else 1
    return numel * _ELEMENT_BYTES.get((record.dtype or "").removeprefix("torch."), 1)


def assert_traces_close(
    a: TraceLike,
    b: TraceLike,
    *,
    atol: Tolerance = None,
    rtol: Tolerance = None,
    map: MapSpec = None,
    baseline: TraceLike | None = None,
    noise_factor: float = DEFAULT_NOISE_FACTOR,
    ignore: Iterable[str] | str | None = None,
    match: str = "auto",
    rename: MapSpec = _UNSET,
) -> Alignment:
    """Raise ``AssertionError`` naming the first divergence unless every tensor pair is within tolerance.

    The message also names the largest source (the row with the largest
    growth among ``Alignment.sources``). Options are those of :func:`align` (``rename=`` is deprecated there too).
    Returns the ``Alignment`` when it passes, for further checks.
    """
    result = align(a, b, atol=atol, rtol=rtol, map=map_argument(map, rename), baseline=baseline,
                   noise_factor=noise_factor, ignore=ignore, match=match)
    if result.passed:
        return result
    first = result.first_divergence
    lines = [f"traces differ: {len(result.diverged)} of {len(result.rows)} compared tensors out of tolerance"]
    if first is not None:
        lines.append(f"first divergence ({first.origin}): {first.describe()}")
    largest = max(result.sources, key=lambda row: row.growth or 0.0, default=None)
    if largest is not None:
        lines.append(f"largest source ({len(result.sources)} in all; growth {largest.growth:.3g}): "
                     f"{largest.describe()}")
    for row in result.unreadable[:3]:
        lines.append(f"unreadable: {row.describe()}")
    raise AssertionError("\n".join(lines))
