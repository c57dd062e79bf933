"""``tracediff.replay``: run B's own modules on A's recorded inputs; which of B's modules is wrong?

A short tour::

    import tracediff

    result = tracediff.replay(port_model, "traces/orig")
    for call in result.culprits:            # innermost calls whose own math differs from A's
        print(call.module_path_b, call.local_max_abs_err, call.reason)
    result.table                            # one row per replayed call and output tensor
    result.skipped                          # calls that could not be replayed, with the reason

1. A's trace is loaded; A's top-level inputs are rebuilt and B's whole
   forward runs once on them (:mod:`.shadow`), giving B's call tree and its
   end-to-end error (:mod:`.end_to_end`).
2. B's calls are matched to A's nodes as ``align`` matches two traces
   (paths relative to the root, call index, rename rules: :mod:`.matching`).
3. Each matched call of B runs alone, in eval mode, without grad, with the
   RNG seeded, on A's recorded inputs (:mod:`.inputs`), and its outputs are
   compared with A's: the module's *local* error, free of everything upstream
   (:mod:`.calls`, :mod:`.runner`). Parents are replayed too: they rerun their
   children. A call that cannot run alone is judged inside its parent's run
   (:mod:`.hosted`, under the rule of :mod:`.inside`).
4. The float64 oracle (:mod:`.oracle`) says whether a difference is B's
   math or B's precision.
5. Culprits are the innermost calls whose math differs (:mod:`.culprits`);
   with ``patch=True`` each culprit's output is replaced by A's in B's whole
   forward to measure how much of the final error it causes (:mod:`.patching`,
   :mod:`.findings`).

A compiled B (``torch.compile``) is replayed compiled, module by module; what
differs for it lives in :mod:`.compiled` (``CompiledB``). What every step
reads and reports is :mod:`.job`'s ``Setting`` and ``Ledger``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..alignment.pairing.calls import MATCH_MODES
from ..errors import TraceFormatError, UsageError
from ..files.progress import progress_bar
from ..globs import matches_any
from ..maps.rules import _UNSET, MapSpec, map_argument, read_map
from ..trace.load import Trace, load_trace
from ..trace.model import Node
from .calls import CallRuns, Done
from .compiled import NO_ORACLE_WHEN_COMPILED, how_b_runs
from .findings import Findings
from .hosted import judge_unrun
from .job import Ledger, Setting
from .matching import BOnA, paired_calls, run_b_on_a
from .oracle import NOISE_MULTIPLIER
from .placement import check_device, prepared
from .result import Replay


def replay(
    model_b: nn.Module,
    trace_a: str | Path | Trace,
    *,
    map: MapSpec = None,
    match: str = "auto",
    atol: float | None = None,
    rtol: float | None = None,
    oracle: bool = True,
    modules: str | Sequence[str] | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
    patch: bool = False,
    rename: MapSpec = _UNSET,
) -> Replay:
    """Replay every module call of ``model_b`` that matches a node of ``trace_a`` on A's recorded inputs.

    Args:
        model_b: the port. It is put in eval mode for the replay and its
            modes (and device, with ``device``) are restored afterwards.
        trace_a: the reference trace (folder, JSON file, or loaded ``Trace``),
            recorded with payloads (``tensors="full"``).
        map: the rename map for A's paths, in any form ``align`` takes.
        match: how B's calls pair with A's, as in ``align``: ``"auto"``
            (default: top down, on the map, values, names and sizes),
            ``"name"`` (names and ``map`` only) or ``"structure"`` (auto
            without names and ``map``).
        atol, rtol: the local error a row may have and still pass without
            the oracle's help. Default: torch.testing's for the pair's dtypes.
        oracle: also run each call in float64 and judge B against its own
            precision noise (default True); without it a row out of
            tolerance blames B.
        modules: a glob (or several) over module paths, relative
            (``model.layers.0.mlp``) or full, of A or B: only those calls
            are replayed (default: every call). ``*`` is one path segment,
            ``**`` any number: ``"model.layers.0.**"`` is layer 0 and every
            call inside it.
        device: move ``model_b`` there for the replay (default: where it is).
        progress: a progress bar on stderr (only when it is a terminal).
        patch: for each culprit, rerun B's whole forward with that call's
            output replaced by A's and report the share of the final-output
            error that disappears (``patch_effect``, 0-100).
        rename: the name of ``map`` until 0.2; deprecated (``DeprecationWarning``), removed in 0.4.

    Returns:
        A ``Replay``: truthy when no call is a culprit.

    Raises:
        TraceFormatError: the trace cannot be read or holds no payloads.
        UsageError: bad rename rules, ``match`` mode or ``modules`` patterns.
    """
    started = time.perf_counter()
    for name, value in (("atol", atol), ("rtol", rtol)):
        if value is not None and not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
            raise UsageError(f"{name}={value!r}: expected a finite number >= 0")
    if match not in MATCH_MODES:
        raise UsageError(f"match: {match!r} is not one of {', '.join(MATCH_MODES)}")
    device = check_device(device)
    trace = trace_a if isinstance(trace_a, Trace) else load_trace(trace_a)
    _check_replayable(trace)
    rename_map = read_map(map_argument(map, rename))
    patterns = _patterns(modules)
    seed = _seed(trace.metadata)
    b = how_b_runs(model_b)  # B's own modules and paths, never ``_orig_mod``
    model_b = b.model
    asked_oracle, oracle = oracle, oracle and b.oracle_allowed  # see .compiled: no float64 oracle for compiled code
    ledger = Ledger()
    with prepared(model_b, device) as run_device, b.settings():
        setting = Setting(trace, model_b, b, list(rename_map.rename), match, list(rename_map.slots), seed,
                          run_device, atol, rtol, oracle)
        if asked_oracle and not oracle:
            ledger.warnings.append(NO_ORACLE_WHEN_COMPILED)
        b_on_a, findings = _replay_calls(setting, ledger, patterns, progress)
        if patch:
            findings.measure_patches(b_on_a)
        calls = findings.results()
    return Replay(trace_a=str(trace.directory), model_b=type(model_b).__name__, oracle=oracle,
                  device=str(run_device), seed=seed, modules=calls, skipped=tuple(ledger.skipped),
                  noise_multiplier=NOISE_MULTIPLIER, end_to_end=b_on_a.end_to_end, warnings=tuple(ledger.warnings),
                  patched=patch, undecided=tuple(findings.undecided), seconds=time.perf_counter() - started,
                  compiled=b.compiled)


def _replay_calls(setting: Setting, ledger: Ledger, patterns: list[str], progress: bool) -> tuple[BOnA, Findings]:
    """Match B's calls to A's, run each alone, judge the ones that cannot run alone inside their parents' runs,
    and decide the culprits."""
    b_on_a = run_b_on_a(setting, ledger)
    pairs = sorted(paired_calls(setting, b_on_a.shadow, ledger), key=lambda pair: pair[1].enter_order)
    everything = pairs + [(a, b) for a, b, _ in ledger.unrun]  # a call judged inside its parent has its place
    orders = {id(b): i for i, (_, b) in enumerate(sorted(everything, key=lambda pair: pair[1].enter_order))}
    if patterns:
        pairs = [p for p in pairs if _selected(p, patterns)]
        if not pairs:
            raise UsageError(f"--modules {' '.join(patterns)}: matches no replayable module call")
    runs = CallRuns(setting, b_on_a.shadow, ledger)
    done: list[Done] = []
    with progress_bar(progress, desc="replay", unit=" calls", total=len(pairs)) as bar:
        for node_a, node_b in pairs:
            judged = runs.run(orders[id(node_b)], node_a, node_b)
            if judged is not None:
                done.append(judged)
            bar.update(1)
    judge_unrun(runs, done, orders)
    findings = Findings(runs, done)
    findings.decide()
    return b_on_a, findings


def _check_replayable(trace: Trace) -> None:
    if trace.summary_only:
        raise TraceFormatError(f"{trace.json_path}: holds statistics only (SUMMARY); replay needs the tensors: "
                               "capture A with tensors=\"full\"")
    if not any(record.has_payload for _, record in trace.records()):
        raise TraceFormatError(f"{trace.json_path}: holds no tensor payloads (repr or summary capture); replay "
                               "needs the tensors: capture A with tensors=\"full\"")


def _patterns(modules: str | Sequence[str] | None) -> list[str]:
    if modules is None:
        return []
    patterns = [modules] if isinstance(modules, str) else list(modules)
    if not all(isinstance(p, str) and p for p in patterns):
        raise UsageError(f"modules={modules!r}: expected a glob or a list of globs over module paths")
    return patterns


def _seed(metadata: dict[str, Any]) -> int:
    """The trace's recorded seed (``seed`` in its metadata) when there is one, else 0."""
    seed = metadata.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else 0


def _selected(pair: tuple[Node, Node], patterns: list[str]) -> bool:
    names = [pair[0].relative_path, pair[0].module_path, pair[1].relative_path, pair[1].module_path]
    return any(matches_any(name, patterns) for name in names)
