"""From measured rows to verdicts: noise floors, ignored rows, growth and sources.

Called by :func:`tracediff.alignment.align` once every pair is measured:

1. with a baseline, each row's noise floor and the noise-factor rule
   (:mod:`tracediff.alignment.verdicts.noise`); without one, the cross-dtype
   relative-norm rule and a warning naming both dtypes;
2. rows matching an ``ignore`` pattern are set aside (listed, never failing);
3. growth, origin and the list of sources (:mod:`tracediff.alignment.verdicts.sources`).

Ignore patterns: ``PATH`` or ``PATH:SLOT``. ``PATH`` is a module-path glob
(:mod:`tracediff.globs`: ``*`` one path segment, ``**`` any number) matched
against the module path relative to the root (``layers.0.mlp``) or the full
recorded path, on either side, and covers the module and everything inside
it; ``SLOT``, a shell-style glob, against the tensor slot (``outputs.0``,
``inputs.kwargs.position_ids``); an empty part matches everything
(``:inputs.kwargs.position_ids``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...compare.measurement import Measurement
from ...compare.records import compare_records
from ...errors import UsageError
from ...globs import covers
from ...trace.load import Trace
from ..pair import Pair
from ..result import KERNEL_ORIGIN
from ..rows import RowDraft, add_note
from .approximations import accept_approximations, unbounded_approximations
from .cut import accept_cut_elsewhere
from .noise import (
    accept_by_relative_norm,
    apply_floor,
    baseline_records,
    counterpart,
    dtype_warning,
    floor_of,
)
from .sources import find_sources

Runner = Callable[[Callable[[Any], Any], Iterable[Any]], list[Any]]  # maps a function over items (threads or not)


@dataclass(frozen=True)
class Verdicts:
    """Which rows (indices into the drafts judged) the alignment keeps, lists as sources and sets aside."""

    kept: tuple[int, ...]
    sources: tuple[int, ...]
    ignored: tuple[int, ...]
    warnings: tuple[str, ...]
    #: what the report says before anything else: a side that computed in a lower precision than its tensors show
    first_warnings: tuple[str, ...] = ()


def check_ignore(patterns: Iterable[str] | str | None) -> tuple[tuple[str, str], ...]:
    """``["layers.0.*", ":outputs.1"]`` -> ``(("layers.0.*", "*"), ("*", "outputs.1"))``; rejects empty ones."""
    if patterns is None:
        return ()
    if isinstance(patterns, str):
        patterns = [patterns]
    out = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern.strip(":"):
            raise UsageError(f"ignore pattern {pattern!r}: expected PATH, PATH:SLOT or :SLOT (shell-style globs)")
        path, _, slot = pattern.partition(":")
        out.append((path or "*", slot or "*"))
    return tuple(out)


def _ignored_by(rules: tuple[tuple[str, str], ...], pair: Pair) -> str | None:
    node_a, ra, node_b, rb = pair.node_a, pair.record_a, pair.node_b, pair.record_b
    paths = (node_a.relative_path, node_b.relative_path, node_a.module_path, node_b.module_path)
    for path, slot in rules:
        on_path = any(covers(path, p) for p in paths)
        if on_path and (fnmatch.fnmatchcase(rb.slot, slot) or fnmatch.fnmatchcase(ra.slot, slot)):
            return f"{path}:{slot}" if slot != "*" else path
    return None


def judge(rows: Sequence[RowDraft], pairs: Sequence[Pair], trace_a: Trace, *, baseline: Trace | None,
          noise_factor: float, ignore: tuple[tuple[str, str], ...], run: Runner, sharded: bool = False,
          trace_b: Trace | None = None) -> Verdicts:
    """Apply the noise rules, set ignored rows aside and find the sources, deciding the drafts in place
    (``rows[i]`` is ``pairs[i]``'s row; ``sharded``: a side is a multi-rank trace; ``trace_b``: B's trace,
    read for the runtime approximations it records)."""
    warnings: list[str] = []
    first: list[str] = []
    if baseline is not None:
        records = baseline_records(baseline)

        def floor_fields(index: int) -> Measurement | None:
            ra = pairs[index].record_a
            rn = counterpart(records, pairs[index].node_a, ra)
            if rn is None:
                return None
            return compare_records(trace_a, ra, baseline, rn, atol=rows[index].atol, rtol=rows[index].rtol)

        floors = [floor_of(fields) for fields in run(floor_fields, range(len(rows)))]
        for row, floor in zip(rows, floors):
            apply_floor(row, floor, noise_factor)
        missing = sum(floor is None for floor in floors)
        if missing:
            warnings.append(f"{missing} of {len(rows)} compared tensors have no counterpart in the baseline "
                            "(or it could not be measured): they were judged by the ordinary tolerance")
    else:
        computed = (trace_a.compute_dtype, trace_b.compute_dtype if trace_b is not None else None)
        for row, pair in zip(rows, pairs):
            if row.within_tolerance is False:  # row.diverged
                accept_by_relative_norm(row, pair.record_a, computed)
        warning = dtype_warning(rows, computed)
        if warning and any(computed):
            first.append(warning)
        elif warning:
            warnings.append(warning)

    cuts = accept_cut_elsewhere(rows, pairs, sharded=sharded)
    approximated = accept_approximations(rows, pairs, trace_a, None if sharded else trace_b)
    if approximated.warning:
        warnings.append(approximated.warning)
    matched = [_ignored_by(ignore, pair) for pair in pairs] if ignore else [None] * len(pairs)
    used = {m for m in matched if m}
    for path, slot in ignore:
        label = f"{path}:{slot}" if slot != "*" else path
        if label not in used:
            warnings.append(f"--ignore pattern {label!r} matches no compared tensor")

    unbounded = None if sharded else unbounded_approximations(pairs)
    flags = find_sources(rows, [pair.node_b for pair in pairs], [pair.record_a for pair in pairs],
                         noise_factor=noise_factor,
                         never_source=[m is not None for m in matched],
                         explained=[index in cuts for index in range(len(rows))],
                         approximated=[index in approximated.rows for index in range(len(rows))],
                         unbounded=unbounded if unbounded and any(unbounded) else None)
    if unbounded and any(row.origin == KERNEL_ORIGIN for row in rows):
        named = ", ".join(dict.fromkeys(text for text in unbounded if text))
        first.append(f"B's runtime computes {named}: the traces cannot bound what that does downstream (the "
                     "delegated region's weights are not recorded), so a divergence whose error arose there is not "
                     "shown to be a mistake (docs/verdicts.md, runtime approximations)")
    kept, sources, ignored = [], [], []
    for index, (row, flag, pattern) in enumerate(zip(rows, flags, matched)):
        if pattern is not None:
            add_note(row, f"ignored (--ignore {pattern})")
            ignored.append(index)
        else:
            kept.append(index)
            if flag:
                sources.append(index)
    return Verdicts(kept=tuple(kept), sources=tuple(sources), ignored=tuple(ignored), warnings=tuple(warnings),
                    first_warnings=tuple(first))
