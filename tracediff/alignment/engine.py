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
from ..files.progress import progress_bar
from ..maps.rules import _UNSET, MapSpec, map_argument, read_map
from ..order import reordered, worker_threads
from ..trace.load import Trace, load_trace
from ..trace.model import TensorRecord
from ..trace.ranks import is_multi_rank
from .decode_steps import restrict_steps, set_steps, step_count, summarize_steps
from .doubts import undecided_first_divergence, weak_first_divergence
from .lm_results import PositionStrip
from .lm_verdicts import TokenSpans, annotate_rows, check_logits_patterns, position_strip, reread_pairs, sequence_axes
from .ops import annotate_op_rows, pair_ops
from .pair import Pair
from .pairing.layout import compare_transformed
from .pairing.make import relaid
from .pairing.permuted import decide_orders
from .pairing.placed_by_values import place_by_values
from .pairing.plan import plan_pairs
from .pairing.producers import likely_source
from .pairing.unrecorded import carry_origin, mark_unrecorded_origin
from .result import Alignment, TensorComparison
from .rows import RowDraft, draft_row, freeze_rows
from .stages import Judged, Loaded, Measured, Paired, Settings
from .token_choices import compare_tokens
from .unplaced import find_unplaced
from .verdicts.apply import check_ignore, judge
from .verdicts.arguments import diff_arguments
from .verdicts.noise import DEFAULT_NOISE_FACTOR
from .verdicts.origins import set_origins

if TYPE_CHECKING:  # sharded and distributed alignments import their modules when they happen
    from concurrent.futures import ThreadPoolExecutor

    from ..sharding import ShardRules
    from ..sharding.findings import ShardFinding
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
    """``align`` as its pipeline: load -> pair -> measure -> judge -> report (:mod:`tracediff.alignment.stages`).
    With ``group``, this rank's part of a distributed alignment (None on ranks other than 0)."""
    if not (isinstance(noise_factor, (int, float)) and noise_factor >= 1):
        raise UsageError(f"noise_factor={noise_factor!r}: expected a number >= 1")
    ignore_rules = check_ignore(ignore)
    logits_patterns = check_logits_patterns(logits)
    loaded = load(a, b, baseline, shards=_shard_rules(shards), step=step)
    settings = Settings(
        map=read_map(map_argument(map, rename)),  # read after the traces: a bad trace is named first
        policy=TolerancePolicy(atol=atol, rtol=rtol, computed_a=loaded.a.compute_dtype,
                               computed_b=loaded.b.compute_dtype),
        match=match, ignore=ignore_rules, logits=logits_patterns, noise_factor=float(noise_factor), step=step)
    paired = pair(loaded, settings)
    measured = measure(loaded, paired, settings, group, progress=progress and (group is None or group.is_root))
    if measured is None:  # a rank other than 0 of a distributed alignment: its shards are measured
        return None
    judged = judge_rows(loaded, measured, settings)
    return report(loaded, paired, measured, judged, settings, allow_incomplete=bool(allow_incomplete))


def load(a: TraceLike, b: TraceLike, baseline: TraceLike | None, *, shards: ShardRules | None,
         step: int | None) -> Loaded:
    """The traces compared, cut to the decode steps compared (``step``: one alone), and the baseline."""
    trace_a, trace_b, trace_n = _load_sides(a, b, baseline, shards)
    sharded = trace_a.sharded or trace_b.sharded
    if sharded:
        from .sharded import place_unrecorded

        place_unrecorded(trace_a, trace_b)
    counts = (step_count(trace_a), step_count(trace_b))
    trace_a, trace_b, note = restrict_steps(trace_a, trace_b, step)
    placed = place_by_values(trace_a, trace_b)  # an exported graph without scopes: under A's modules, by values
    return Loaded(trace_a, trace_b, trace_n, sharded, counts, note, TokenSpans.of(trace_b),
                  placed.warning if placed is not None else None)


def pair(loaded: Loaded, settings: Settings) -> Paired:
    """Every tensor pair to compare, in B's order: calls, their tensors and layouts (:mod:`.pairing.plan`),
    then the op nodes inside matched calls, linked through what flows into them from the pairs above."""
    plan = plan_pairs(loaded.a, loaded.b, list(settings.map.rename), match=settings.match,
                      slots=list(settings.map.slots))
    ops = pair_ops(loaded.a, loaded.b, plan.matching.pairs, settings.policy, values=plan.values,
                   tensor_pairs=plan.pairs)
    # a graph's nested calls share their last node's output record: the innermost first, as a module exits first
    pairs = sorted(plan.pairs + tuple(ops.pairs), key=lambda pair: (pair.record_b.order, -pair.node_b.depth))
    return Paired(plan, ops, tuple(pairs), plan.unmatched_a + tuple(ops.unmatched_a),
                  plan.unmatched_b + tuple(ops.unmatched_b))


def measure(loaded: Loaded, paired: Paired, settings: Settings, group: Group | None, *, progress: bool
            ) -> Measured | None:
    """Compare every pair, one pair in memory at a time; then the rotary families whose order the rows
    reveal (side by side or in halves) are compared again under that order. With ``group``, each rank first
    measures its own shards and rank 0 goes on with the merged rows (None on the other ranks)."""
    pairs = paired.pairs
    merged = None
    if group is not None:
        from .distributed import measure_where_stored

        whole = {i for i, pair in enumerate(pairs) if pair.transform is not None}  # read through a transform
        merged = measure_where_stored(group, pairs, loaded.a, loaded.b,
                                      lambda i: settings.tolerance(pairs[i]), whole, loaded.spans)
        if merged is None:
            return None
    apart = merged.measurements if merged is not None else {}
    axis_of = sequence_axes(loaded.spans)

    def compare(order: int, pair: Pair, tick: Callable[[Any], None]) -> tuple[RowDraft, Measurement]:
        atol, rtol = settings.tolerance(pair)
        ra, rb = pair.record_a, pair.record_b
        started(_record_bytes(ra) + _record_bytes(rb))
        measurement = apart.get(order) or (
            compare_transformed(loaded.a, ra, loaded.b, rb, pair.transform, atol=atol, rtol=rtol)
            if pair.transform is not None
            else compare_records(loaded.a, ra, loaded.b, rb, atol=atol, rtol=rtol, along=axis_of(pair.node_b, rb)))
        tick(rb)
        return draft_row(order, pair, atol, rtol, measurement), measurement

    tick = _progress(progress, pairs)
    total = _pair_bytes(pairs)
    started: Callable[[int], None] = _no_count
    if total >= _EXPECTED_BYTES:  # a large alignment: the compiled kernel may load early (compare/kernel.py)
        from ..compare import kernel  # numpy with it: a small alignment of statistics never imports it

        kernel.expect(total)
        started = kernel.counted
    # threads help only where numpy works on payloads; statistics are compared in Python, under the GIL
    with _workers(total) as run:
        first: list[tuple[RowDraft, Measurement]] = run(lambda i: compare(i, pairs[i], tick), range(len(pairs)))
    tick(None)
    orders = decide_orders([row for row, _ in first], pairs, loaded.a, loaded.b, paired.plan.values,
                           pcc=[m.pcc for _, m in first])
    relaid_pairs = tuple(relaid(pair, orders[i]) if i in orders else pair for i, pair in enumerate(pairs))
    done = [compare(i, pair, _no_tick) if i in orders else first[i] for i, pair in enumerate(relaid_pairs)]
    return Measured(relaid_pairs, tuple(row for row, _ in done), tuple(m for _, m in done), merged)


def judge_rows(loaded: Loaded, measured: Measured, settings: Settings) -> Judged:
    """Decide the drafts: op names, origins, noise floors, ignored rows and sources, decode steps, positions
    and logits verdicts (:mod:`.verdicts.apply`, :mod:`.lm_verdicts`); then freeze them."""
    drafts, pairs, sliced = measured.drafts, measured.pairs, measured.sliced
    annotate_op_rows(drafts, pairs)
    set_origins(drafts, pairs)
    baseline_bytes = 2 * sum(_record_bytes(p.record_a) for p in pairs if p.record_a.has_payload)
    with _workers(baseline_bytes if loaded.baseline is not None else 0) as run:
        verdicts = judge(drafts, pairs, loaded.a, baseline=loaded.baseline, noise_factor=settings.noise_factor,
                         ignore=settings.ignore, run=run, sharded=loaded.sharded, trace_b=loaded.b)
    set_steps(drafts, loaded.b)
    again = reread_pairs(drafts, pairs, measured.measurements, settings.logits, sliced)
    with _workers(_pair_bytes(again)) as run:  # only what the comparison could not annotate is read again
        logits_verdicts = annotate_rows(drafts, pairs, loaded.a, loaded.b, logits=settings.logits, run=run,
                                        measurements=measured.measurements, measured_apart=sliced,
                                        spans=loaded.spans)
    rows = freeze_rows(drafts)  # decided: from here on every row is a frozen TensorComparison
    if loaded.sharded:  # whose shard first goes out of tolerance
        from .sharded import name_ranks

        name_ranks(rows, pairs, loaded.a, loaded.b, measured.merged.ranks if measured.merged is not None else None)
    return Judged(tuple(rows), verdicts, logits_verdicts)


def report(loaded: Loaded, paired: Paired, measured: Measured, judged: Judged, settings: Settings, *,
           allow_incomplete: bool) -> Alignment:
    """The ``Alignment``: the kept rows with the first divergence, where it likely comes from, and what
    the rows cannot say (warnings, unmatched calls, argument differences)."""
    trace_a, trace_b, plan, matching = loaded.a, loaded.b, paired.plan, paired.plan.matching
    rows, verdicts = judged.rows, judged.verdicts
    kept = [rows[i] for i in verdicts.kept]
    marked = mark_unrecorded_origin(kept, matching.gaps_a, matching.gaps_b)  # after the origins
    first = next((row for row in marked if row.within_tolerance is False), None)
    unpaired_b = [n for n in matching.unmatched_b if id(n) not in matching.idle]
    return Alignment(
        trace_a=str(trace_a.directory), trace_b=str(trace_b.directory),
        model_a=trace_a.model_name, model_b=trace_b.model_name,
        rows=tuple(marked),
        sources=carry_origin([rows[i] for i in verdicts.sources], marked),
        ignored=tuple(rows[i] for i in verdicts.ignored),
        baseline=str(loaded.baseline.directory) if loaded.baseline is not None else None,
        noise_factor=settings.noise_factor if loaded.baseline is not None else None,
        computed_b=loaded.b.compute_dtype,
        unmatched_a=paired.unmatched_a, unmatched_b=paired.unmatched_b,
        unrecorded_a=plan.unrecorded_a, unrecorded_b=plan.unrecorded_b,
        argument_diffs=tuple(diff_arguments(matching.pairs) + paired.ops.argument_diffs),
        structural=matching.structural,
        suggested_rename=tuple(plan.suggested),
        suggested_slots=plan.suggested_slots,
        warnings=verdicts.first_warnings + _warnings(loaded, paired, measured.pairs, settings, kept)
        + verdicts.warnings,
        matched_nodes=plan.matched_nodes,
        incomplete_a=trace_a.incomplete_reason, incomplete_b=trace_b.incomplete_reason,
        allow_incomplete=allow_incomplete,
        importer_a=trace_a.importer, importer_b=trace_b.importer,
        steps=summarize_steps(marked, trace_a, trace_b, selected=settings.step, note=loaded.step_note,
                              counts=loaded.step_counts),
        logits=judged.logits, tokens=compare_tokens(trace_a, trace_b),
        position_strip=_position_strip(loaded, measured, first),
        payloads_expected=_holds_payloads(trace_a) and _holds_payloads(trace_b),
        shard_findings=_shard_findings(loaded),
        unplaced=find_unplaced(matching, b_prunes_outputs=trace_b.producer == "transformers",
                               not_shown=_modules_not_shown(trace_b)),
        likely_source=likely_source(first, measured.pairs, unpaired_b) if first is not None else None,
    )


def _warnings(loaded: Loaded, paired: Paired, pairs: Sequence[Pair], settings: Settings,
              kept: Sequence[TensorComparison]) -> tuple[str, ...]:
    """What the report warns of, besides the verdicts' warnings: steps left out, weak or structural pairing,
    tolerance patterns matching nothing, a first divergence the traces cannot decide."""
    matching = paired.plan.matching
    structural = ["module paths did not line up; nodes were matched by structure (values, sizes and call "
                  "order). Check the suggested rename map."] if matching.structural and settings.match != "structure" \
        else []
    unused = settings.policy.unused_pattern_warnings(n.relative_path for nodes in (matching.nodes_b, matching.nodes_a)
                                                     for n in nodes)
    first = (weak_first_divergence(kept, paired.unmatched_b), undecided_first_divergence(kept, pairs, paired.plan))
    return ((loaded.placed,) if loaded.placed else ()) + ((loaded.step_note,) if loaded.step_note else ()) \
        + paired.plan.warnings + tuple(structural) \
        + tuple(unused) + tuple(note for note in first if note)


def _position_strip(loaded: Loaded, measured: Measured, first: TensorComparison | None) -> PositionStrip | None:
    """The per-position errors of the first divergence: read from both payloads, or from the ratios the ranks
    sent for a row sliced over them."""
    if first is None:
        return None
    pair = measured.pairs[first.order]
    if first.order not in measured.sliced or measured.merged is None:
        return position_strip(first, pair, loaded.a, loaded.b, loaded.spans)
    from .distributed import strip_of

    return strip_of(measured.merged, first, pair, loaded.spans)


def _shard_findings(loaded: Loaded) -> tuple[ShardFinding, ...]:
    if not loaded.sharded:
        return ()
    from .sharded import findings

    return findings(loaded.a, loaded.b)


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


def _modules_not_shown(trace: Trace) -> tuple[str, ...]:
    """The module paths a graph trace's runtime ran inside fused regions (``runtime.modules_not_shown``)."""
    runtime = trace.metadata.get("runtime")
    listed = runtime.get("modules_not_shown") if isinstance(runtime, dict) else None
    return tuple(path for path in listed if isinstance(path, str)) if isinstance(listed, list) else ()


def _no_count(_bytes: int) -> None:
    pass


def _no_tick(_record: Any) -> None:
    pass


def _progress(enabled: bool, pairs: Sequence[Pair]) -> Callable[[Any], None]:
    if not enabled or not sys.stderr.isatty() or len(pairs) < 50:
        return _no_tick
    total = sum(_record_bytes(pair.record_a) + _record_bytes(pair.record_b) for pair in pairs)
    bar = progress_bar(True, desc="align", unit="B", unit_scale=True, total=total)

    def tick(record: TensorRecord | None) -> None:
        if record is None:
            bar.close()
        else:
            bar.update(_record_bytes(record) * 2)

    return tick


_EXPECTED_BYTES = 1 << 30  # compare.kernel.REMAINING_BYTES, without importing numpy for a small alignment


def _pair_bytes(pairs: Iterable[Pair]) -> int:
    """The payload bytes of the ``pairs`` that have payloads on both sides."""
    return sum(_record_bytes(p.record_a) + _record_bytes(p.record_b) for p in pairs
               if p.record_a.has_payload and p.record_b.has_payload)


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
