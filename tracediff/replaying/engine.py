"""``tracediff.replay``: run B's own modules on A's recorded inputs; which of B's modules is wrong?

A short tour::

    import tracediff

    result = tracediff.replay(port_model, "traces/orig")
    for call in result.culprits:            # innermost calls whose own math differs from A's
        print(call.module_path_b, call.local_max_abs_err, call.reason)
    result.table                            # one row per replayed call and output tensor
    result.skipped                          # calls that could not be replayed, with the reason

1. A's trace is loaded; A's top-level inputs are rebuilt and B's whole
   forward runs once on them (:mod:`.shadow`), giving B's call tree.
2. B's calls are matched to A's nodes as ``align`` matches two traces
   (paths relative to the root, call index, rename rules).
3. Each matched call of B runs alone, in eval mode, without grad, with the
   RNG seeded, on A's recorded inputs (:mod:`.inputs`), and its outputs are
   compared with A's: the module's *local* error, free of everything upstream
   (:mod:`.runner`). Parents are replayed too: they rerun their children.
   A call that cannot run alone is judged inside its parent's run (:mod:`.inside`).
4. The float64 oracle (:mod:`.oracle`) says whether a difference is B's
   math or B's precision.
5. Culprits are the innermost calls whose math differs (:mod:`.culprits`);
   with ``patch=True`` each culprit's output is replaced by A's in B's whole
   forward to measure how much of the final error it causes (:mod:`.patching`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..alignment.pairing.calls import MATCH_MODES, match_nodes
from ..alignment.pairing.slots import Parameters, inputs_set_aside, pair_tensors
from ..errors import TraceFormatError, UsageError
from ..globs import matches_any
from ..maps.rules import _UNSET, MapSpec, SlotRules, apply_rename, map_argument, read_map
from ..trace.load import Trace, load_trace
from ..trace.model import Node
from .compiled import NO_ORACLE_WHEN_COMPILED, CompiledRuns, compiling, eager, is_compiled, own_module_table, uncompiled
from .culprits import Candidate, decide, open_calls
from .inputs import NotRebuildable, Target, fresh_caches, output_slots, rebuild_inputs
from .inside import blocker, host, judged_in_run
from .layout import bound_to
from .oracle import NOISE_MULTIPLIER, float64_copy, oracle_device
from .patching import Replacements, patched
from .placement import check_device, module_device, param_dtype, prepared
from .result import NOT_COMPARABLE, Replay, ReplayedCall, SkippedCall
from .runner import CallOutcome, CallSetup, inputs_not_equivalent, replay_call
from .shadow import ShadowRun, seed_rng, shadow_run


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
    rules = list(rename_map.rename)
    patterns = _patterns(modules)
    seed = _seed(trace.metadata)
    compiled = is_compiled(model_b)
    compiled_b, model_b = model_b, uncompiled(model_b)  # B's own modules and paths, never ``_orig_mod``
    asked_oracle, oracle = oracle, oracle and not compiled  # see .compiled: no float64 oracle for compiled code
    with prepared(model_b, device) as run_device, compiling(compiled, len(list(model_b.modules()))):
        job = _Job(trace, model_b, rules, match, seed, run_device, atol, rtol, oracle, list(rename_map.slots),
                   compiled_b if compiled else None)
        if asked_oracle and compiled:
            job.warnings.append(NO_ORACLE_WHEN_COMPILED)
        job.run(patterns, progress)
        if patch:
            job.measure_patches()
        calls = job.results()
    return Replay(trace_a=str(trace.directory), model_b=type(model_b).__name__, oracle=oracle,
                  device=str(run_device), seed=seed, modules=calls, skipped=tuple(job.skipped),
                  noise_multiplier=NOISE_MULTIPLIER, end_to_end=job.end_to_end, warnings=tuple(job.warnings),
                  patched=patch, undecided=tuple(job.undecided), seconds=time.perf_counter() - started,
                  compiled=compiled)


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


@dataclass
class _Done:
    node_a: Node
    node_b: Node
    setup: CallSetup
    outcome: CallOutcome
    order: int
    host: _Done | None = None  # the call whose run judged it, for a call that cannot run alone (.inside)


_OUTPUTS_ONLY = ("paired with A's call on its outputs only: its inputs are not the inputs A's call recorded "
                 "(they differ by design, or the map sets them aside)")


class _Job:
    """One replay: matching, the per-call runs, culprits and patches."""

    def __init__(self, trace: Trace, model: nn.Module, rules: list[tuple[str, str]], match: str, seed: int,
                 device: torch.device, atol: float | None, rtol: float | None, oracle: bool,
                 slots: SlotRules | None = None, compiled_model: nn.Module | None = None) -> None:
        self.trace, self.model, self.rules, self.match = trace, model, rules, match
        self.slots = slots or []  # the map's slot rules: a call whose inputs they set aside is not replayed
        self.seed, self.device = seed, device
        self.atol, self.rtol, self.oracle = atol, rtol, oracle
        self.root_name = type(model).__name__
        # B as its SPEC runs it, when compiled: each replayed module then runs through torch.compile too
        self.compiled_model = compiled_model
        self.compiled_runs = CompiledRuns()
        self.modules = own_module_table(model) if compiled_model is not None else \
            dict(model.named_modules(remove_duplicate=False))
        self.model_dtype = param_dtype(model)
        self.warnings: list[str] = []
        self.skipped: list[SkippedCall] = []
        self.done: list[_Done] = []
        self.end_to_end: dict[str, Any] | None = None
        self.twin: nn.Module | None = None
        self.twin_modules: dict[str, nn.Module] = {}
        self.shadow = ShadowRun(trace=None)
        self.root_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self.patch_effects: dict[int, float] = {}
        self.undecided: list[str] = []
        self.unrun: list[tuple[Node, Node, str]] = []  # skipped calls that may hold a mistake (see _skip)
        self.partnered: set[int] = set()  # B's calls (by id) that pair with one of A's
        self.orders: dict[int, int] = {}  # B's call (by id) -> its place among the paired calls, in B's order

    # --- matching -----------------------------------------------------------------------------------------

    def _shadow(self) -> None:
        root_a = self.trace.roots[0]
        try:
            self.root_inputs = rebuild_inputs(self.trace, root_a, Target(self.device, self.model_dtype),
                                              own=fresh_caches(self.trace, root_a))
        except NotRebuildable as e:
            self.warnings.append(f"A's top-level inputs cannot be rebuilt ({e}): calls are matched by name only, "
                                 "and there is no end-to-end error")
            return
        with eager(self.compiled_model is not None):  # the call tree's hooks read statistics: eager
            self.shadow = shadow_run(self.model, *self.root_inputs, seed=self.seed)
            rebound = bound_to(self.model.forward, *self.root_inputs) if self.shadow.error else None
            retried = shadow_run(self.model, *rebound, seed=self.seed) if rebound is not None else None
        if rebound is not None and retried is not None and retried.error is None:
            # B's forward names its inputs otherwise: A's keywords passed by position
            self.shadow, self.root_inputs = retried, rebound
            self.warnings.append("B's forward does not take A's top-level keywords: they were passed by position")
        if self.shadow.error is not None:
            self.warnings.append(f"B's forward on A's top-level inputs raised {self.shadow.error}: calls are matched "
                                 "by name only")
            return
        self.end_to_end = self._final_error(self._compiled_output() if self.compiled_model is not None
                                            else self.shadow.output)

    def _compiled_output(self) -> Any:
        """B's final output as its SPEC's compiled model computes it (the shadow run's when that raises)."""
        assert self.compiled_model is not None and self.root_inputs is not None
        args, kwargs = self.root_inputs
        with torch.no_grad():
            seed_rng(self.seed)
            try:
                return self.compiled_model(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the port's compiled code; the eager output stands in
                self.warnings.append(f"B's compiled model raised {type(e).__name__} on A's top-level inputs: the "
                                     "end-to-end error is the eager run's")
                return self.shadow.output

    def _pairs(self) -> list[tuple[Node, Node]]:
        forward_a = [n for n in self.trace.nodes() if n.phase == "forward"]
        if self.shadow.trace is not None:
            matching = match_nodes(self.trace, self.shadow.trace, self.rules, self.match)
            if matching.structural:
                self.warnings.append("module paths did not line up by name: calls were matched by structure; "
                                     "pass rename rules (--map) to match them by name")
            self._warn_unmatched_a(matching.unmatched_a)
            unmatched = {id(node) for node in matching.unmatched_b}
            paired = {id(b) for _, b in matching.pairs}
            for node in self.shadow.trace.nodes():
                if id(node) in unmatched:
                    reason = "no call in A's trace matches it"
                elif id(node) not in paired:
                    reason = ("A's trace did not record it (a layer block the standard trace pruned; capture A "
                              "with tracediff.capture, which keeps every layer)")
                else:
                    continue
                self.skipped.append(SkippedCall(module_path_b=node.module_path, call_index=node.call_index,
                                                reason=reason))
            pairs = []
            for a, b in matching.pairs:
                if a.phase != "forward":
                    continue
                self.partnered.add(id(b))
                if (id(a), id(b)) in matching.outputs_only or inputs_set_aside(a, b, self.slots):
                    self._skip(a, b, _OUTPUTS_ONLY, unjudged=True)
                    continue
                pairs.append((a, b))
            return pairs
        pairs = []
        for node in forward_a:
            relative = apply_rename(node.relative_path, self.rules)
            path_b = f"{self.root_name}.{relative}" if relative else self.root_name
            if relative not in self.modules:
                self.skipped.append(SkippedCall(module_path_b=path_b, call_index=node.call_index,
                                                module_path_a=node.module_path, reason="B has no such module"))
                continue
            node_b = Node(module_path=path_b, relative_path=relative, call_index=node.call_index,
                          module_type=type(self.modules[relative]).__name__, depth=node.depth,
                          enter_order=node.enter_order)
            if inputs_set_aside(node, node_b, self.slots):
                self._skip(node, node_b, _OUTPUTS_ONLY, unjudged=True)
                continue
            pairs.append((node, node_b))
        return pairs

    def _warn_unmatched_a(self, nodes: tuple[Node, ...]) -> None:
        later = len(self.trace.roots) - 1
        if later:
            self.warnings.append(f"A's trace holds {later} later top-level call(s) of the model; only the first "
                                 "is replayed")
        in_later = {id(n) for root in self.trace.roots[1:] for n in root.walk()}
        own = [n for n in nodes if n.phase == "forward" and id(n) not in in_later]
        named = [n.module_path for n in own][:3]
        if named:
            self.warnings.append(f"{len(own)} call(s) of A match no call of B (e.g. {', '.join(named)}); pass "
                                 "rename rules (--map) if B names them differently")

    def _twin(self, path: str) -> nn.Module | None:
        """The float64 copy of B's module at ``path``; the copy of the whole model is made on first use."""
        if self.twin is None:
            self.twin = float64_copy(self.model, oracle_device(self.device))
            self.twin_modules = dict(self.twin.named_modules(remove_duplicate=False))
        return self.twin_modules.get(path)

    # --- replaying ----------------------------------------------------------------------------------------

    def run(self, patterns: list[str], progress: bool) -> None:
        self._shadow()
        pairs = sorted(self._pairs(), key=lambda pair: pair[1].enter_order)
        everything = pairs + [(a, b) for a, b, _ in self.unrun]  # a call judged inside its parent has its place
        self.orders = {id(b): i for i, (_, b) in enumerate(sorted(everything, key=lambda pair: pair[1].enter_order))}
        if patterns:
            pairs = [p for p in pairs if _selected(p, patterns)]
            if not pairs:
                raise UsageError(f"--modules {' '.join(patterns)}: matches no replayable module call")
        bar = _progress_bar(progress, len(pairs))
        try:
            for node_a, node_b in pairs:
                self._replay_one(self.orders[id(node_b)], node_a, node_b)
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        self._judge_inside()
        self._decide()

    def _skip(self, node_a: Node, node_b: Node, reason: str, *, unjudged: bool = False) -> None:
        """List a paired call that is not replayed; ``unjudged``: one that may hold a mistake no row saw (paired
        on its outputs only, or inputs that cannot be rebuilt), which a difference around it cannot be
        blamed past (see ``culprits``)."""
        self.skipped.append(SkippedCall(module_path_b=node_b.module_path, call_index=node_b.call_index,
                                        module_path_a=node_a.module_path, reason=reason))
        if unjudged:
            self.unrun.append((node_a, node_b, reason))

    def _setup(self, node_a: Node, node_b: Node) -> CallSetup | None:
        module = self.modules.get(node_b.relative_path)
        if module is None:
            self._skip(node_a, node_b, "not a submodule of B")
            return None
        if not node_a.outputs():
            self._skip(node_a, node_b, "A's trace holds no outputs for this call (the standard trace keeps only "
                                       "the leaves' outputs; capture A with tracediff.capture)")
            return None
        slot_dtypes = self.shadow.slot_dtypes.get((node_b.relative_path, node_b.call_index), {})
        dtype = param_dtype(module) or next(iter(slot_dtypes.values()), None) or self.model_dtype
        device = module_device(module, self.device)

        def twin() -> tuple[nn.Module, Target] | None:
            copy = self._twin(node_b.relative_path)
            if copy is None:
                return None
            return copy, Target(module_device(copy, oracle_device(self.device)), torch.float64)
        return CallSetup(trace=self.trace, node_a=node_a, node_b=node_b if self.shadow.trace else None,
                         module=self.compiled_runs(module) if self.compiled_model is not None else module,
                         twin=twin,
                         target=Target(device, dtype, dict(slot_dtypes)), seed=self.seed,
                         b_inputs=self.shadow.inputs.get((node_b.relative_path, node_b.call_index)),
                         atol=self.atol, rtol=self.rtol, parameters=self._parameters(node_a, node_b))

    def _parameters(self, node_a: Node, node_b: Node) -> Parameters:
        shadow = self.shadow.trace
        return (self.trace.forward_parameters(node_a), shadow.forward_parameters(node_b) if shadow else None)

    def _replay_one(self, order: int, node_a: Node, node_b: Node) -> None:
        setup = self._setup(node_a, node_b)
        if setup is None:
            return
        try:
            outcome = replay_call(setup, oracle=self.oracle)
        except NotRebuildable as e:
            self._skip(node_a, node_b, str(e), unjudged=True)
            return
        finally:
            setup.tensors.clear()  # payloads are read again only for culprits
        self.done.append(_Done(node_a, node_b, setup, outcome, order))

    # --- calls that cannot run alone, judged inside their parent's run --------------------------------------

    def _judge_inside(self) -> None:
        """Judge each call that could not run alone inside the run of the innermost replayed call around it,
        when every paired call before it there was judged the same math (:mod:`.inside`)."""
        if self.shadow.trace is None or not self.unrun:
            return
        replayed = {id(d.node_b): d for d in self.done if d.outcome.rows}  # the ones whose module ran
        verdicts = {id(d.node_b): d.outcome.verdict for d in self.done}
        settled: dict[int, str] = {}  # B's call (by id) -> "" once judged, else why it stays skipped
        hosted: dict[int, dict[tuple[str, int], CallSetup]] = {}
        todo: list[tuple[Node, Node, str, Node]] = []  # the hosted calls, with their host
        known = self.partnered - {id(b) for _, b, _ in self.unrun}  # no verdict yet for the others
        for node_a, node_b, reason in self.unrun:
            around = host(node_b, replayed)
            if around is None or not node_a.outputs() or node_b.relative_path not in self.modules:
                continue
            why = inputs_not_equivalent(replayed[id(around)].setup) or blocker(node_b, around, known, verdicts)
            if why:  # settled before any rerun
                settled[id(node_b)] = f"{reason}; not judged inside {around.module_path}'s run either: {why}"
                continue
            setup = self._setup(node_a, node_b)
            assert setup is not None  # its module exists and A recorded its outputs (checked above)
            hosted.setdefault(id(around), {})[(node_b.relative_path, node_b.call_index)] = setup
            todo.append((node_a, node_b, reason, around))
        outcomes: dict[tuple[str, int], CallOutcome] = {}
        for key, calls in hosted.items():
            outcomes.update(judged_in_run(replayed[key].setup, calls, model=self.model, twin=lambda: self.twin,
                                          index=_indexer(replayed[key].node_b), oracle=self.oracle))
        for node_a, node_b, reason, around in sorted(todo, key=lambda item: item[1].enter_order):
            at = (node_b.relative_path, node_b.call_index)
            why = blocker(node_b, around, self.partnered, verdicts) or \
                ("" if at in outcomes else "it did not run in that rerun (the run raised, or took another path)")
            if why:
                settled[id(node_b)] = f"{reason}; not judged inside {around.module_path}'s run either: {why}"
                continue
            setup = hosted[id(around)][at]
            outcome = outcomes[at]
            verdicts[id(node_b)] = outcome.verdict
            where = f"judged inside {around.module_path}'s run on A's inputs (it cannot run alone: {reason})"
            outcome.reason = f"{where}; {outcome.reason}" if outcome.reason else where
            self.done.append(_Done(node_a, node_b, setup, outcome, self.orders[id(node_b)], replayed[id(around)]))
            settled[id(node_b)] = ""
        self._settle_unrun(settled)

    def _settle_unrun(self, judged: dict[int, str]) -> None:
        """Calls judged inside their parent's run leave the skipped ones; the others say why they were not."""
        by_path = {(b.module_path, b.call_index): judged[id(b)] for _, b, _ in self.unrun if id(b) in judged}
        self.unrun = [(a, b, judged.get(id(b)) or reason) for a, b, reason in self.unrun if judged.get(id(b)) != ""]
        skipped = []
        for call in self.skipped:
            why = by_path.get((call.module_path_b, call.call_index))
            if why is None:
                skipped.append(call)
            elif why:
                skipped.append(replace(call, reason=why))
        self.skipped = skipped

    # --- culprits and patches -----------------------------------------------------------------------------

    def _decide(self) -> None:
        candidates = [Candidate(key=i, node_a=d.node_a, module_path_b=d.node_b.module_path, verdict=d.outcome.verdict,
                                reason=d.outcome.reason) for i, d in enumerate(self.done)]
        unrun = [Candidate(key=-1 - i, node_a=node_a, module_path_b=node_b.module_path, verdict=NOT_COMPARABLE,
                           reason=f"not replayed: {reason}") for i, (node_a, node_b, reason) in enumerate(self.unrun)]
        decide(candidates + unrun, self._rerun_patched if self.shadow.trace is not None else None)
        self.decisions = {c.key: c.decision for c in candidates}
        # a verdict needs evidence: a call that differs with an unjudged call inside it, or an unjudged call that
        # nothing around it vouches for, leaves the replay undecided
        self.undecided = [f"{c.module_path_b} (call {self.done[c.key].node_b.call_index}) differs, but "
                          f"{c.decision.undecided}" for c in candidates if c.decision.undecided]
        named = {c.decision.unjudged for c in candidates if c.decision.unjudged}
        self.undecided += [f"{c.module_path_b} (call {self.done[c.key].node_b.call_index}) could not be judged "
                           f"({c.reason or 'not comparable'}) and no call around it was judged the same math"
                           for c in open_calls(candidates) if c.module_path_b not in named]

    def _recorded_outputs(self, done: _Done) -> dict[str, torch.Tensor]:
        """A's recorded outputs of a call, under B's output slots (``outputs`` in A may be ``outputs.0`` in B)."""
        recorded = done.setup.recorded_outputs()
        if done.setup.node_b is None:
            return recorded
        pairs, _, _ = pair_tensors(done.node_a, done.setup.node_b)
        partner = {a.slot: b for a, b in pairs if a.slot.startswith("outputs")}
        out = {}
        for slot, tensor in recorded.items():
            b = partner.get(slot)
            if b is not None and b.shape is not None and tuple(tensor.shape) != b.shape and \
                    [d for d in tensor.shape if d != 1] == [d for d in b.shape if d != 1]:
                tensor = tensor.reshape(b.shape)  # ``[T, 1, C]`` as ``[1, T, C]``: the same values in order
            out[b.slot if b is not None else slot] = tensor
        return out

    def _rerun_patched(self, parent: Candidate, children: list[Candidate]) -> str:
        done = self.done[parent.key]
        replacements: Replacements = {}
        for child in children:
            child_done = self.done[child.key]
            replacements[(child_done.node_b.relative_path, child_done.node_b.call_index)] = \
                self._recorded_outputs(child_done)
        if done.host is not None:
            return self._rerun_inside(done, done.host, replacements)
        index = _indexer(done.node_b)
        setup = done.setup

        def twin_patch() -> Any:  # called only once the float64 copy exists
            assert self.twin is not None
            return patched(self.twin, replacements, index)

        try:
            outcome = replay_call(setup, oracle=self.oracle, patch=lambda: patched(self.model, replacements, index),
                                  twin_patch=twin_patch)
        except NotRebuildable:
            return done.outcome.verdict
        finally:
            setup.tensors.clear()
        return outcome.verdict

    def _rerun_inside(self, done: _Done, host_done: _Done, replacements: Replacements) -> str:
        """The patched verdict of a call judged inside its host's run: the host rerun with ``replacements``."""
        key = (done.node_b.relative_path, done.node_b.call_index)
        outcomes = judged_in_run(host_done.setup, {key: done.setup}, model=self.model, twin=lambda: self.twin,
                                 index=_indexer(host_done.node_b), oracle=self.oracle, replacements=replacements)
        return outcomes[key].verdict if key in outcomes else done.outcome.verdict

    def _final_error(self, output: Any) -> dict[str, Any] | None:
        """The error of B's whole forward (on A's inputs) against A's recorded final outputs."""
        recorded = {}
        for record in self.trace.roots[0].outputs():
            if record.has_payload:
                try:
                    recorded[record.slot] = self.trace.load(record)
                except Exception:  # noqa: BLE001 - no end-to-end error then
                    continue
        squares, count, worst, scale = 0.0, 0, 0.0, 0.0
        slots = []
        for slot, tensor in output_slots(output):
            a = recorded.get(slot)
            if a is None or not a.is_floating_point() or tuple(a.shape) != tuple(tensor.shape):
                continue
            a64 = a.to(torch.float64).reshape(-1)
            diff = a64 - tensor.detach().to("cpu", torch.float64).reshape(-1)
            if not bool(torch.isfinite(diff).all()):
                keep = torch.isfinite(diff)
                diff, a64 = diff[keep], a64[keep]
            squares += float(torch.dot(diff, diff))
            scale += float(torch.dot(a64, a64))
            count += diff.numel()
            worst = max(worst, float(diff.abs().max()) if diff.numel() else 0.0)
            slots.append(slot)
        if not slots:
            return None
        rms = math.sqrt(squares / count) if count else 0.0
        rel = math.sqrt(squares / scale) if scale > 0 else (0.0 if squares == 0 else math.inf)
        return {"tensors": slots, "max_abs_err": worst, "rms_err": rms, "rel_rms_err": rel}

    def measure_patches(self) -> None:
        """For each culprit: the share of the final-output error that disappears with A's output in its place."""
        base = self.end_to_end
        if base is None or self.root_inputs is None:
            self.warnings.append("--patch: B's final output cannot be compared with A's (see the other warnings); "
                                 "no patch effects")
            return
        args, kwargs = self.root_inputs
        for key, decision in self.decisions.items():
            if not decision.culprit:
                continue
            done = self.done[key]
            replacements = {(done.node_b.relative_path, done.node_b.call_index): self._recorded_outputs(done)}
            with torch.no_grad(), patched(self.model, replacements):
                seed_rng(self.seed)
                try:
                    output = (self.compiled_model or self.model)(*args, **kwargs)
                except Exception as e:  # noqa: BLE001
                    self.warnings.append(f"--patch {done.node_b.module_path}: B's forward raised {type(e).__name__}")
                    continue
            after = self._final_error(output)
            if after is None:
                continue
            before = base["rms_err"]
            effect = 100.0 * (before - after["rms_err"]) / before if before > 0 else 0.0
            self.patch_effects[key] = min(100.0, max(0.0, effect))

    def results(self) -> tuple[ReplayedCall, ...]:
        calls = []
        for key, done in enumerate(self.done):
            decision = self.decisions[key]
            reason = done.outcome.reason
            if decision.note:
                reason = f"{reason}; {decision.note}" if reason else decision.note
            if decision.undecided:
                reason = f"{reason}; undecided: {decision.undecided}" if reason else f"undecided: {decision.undecided}"
            if decision.explained_by:
                reason = f"{reason}; explained by {', '.join(decision.explained_by)}" if reason else \
                    f"explained by {', '.join(decision.explained_by)}"
            calls.append(ReplayedCall(
                module_path_a=done.node_a.module_path, module_path_b=done.node_b.module_path,
                call_index=done.node_b.call_index, module_type=done.node_b.module_type, order=done.order,
                tensors=tuple(done.outcome.rows), verdict=done.outcome.verdict, reason=reason,
                culprit=decision.culprit, explained_by=decision.explained_by,
                patch_effect=self.patch_effects.get(key), seconds=done.outcome.seconds))
        return _ranked(sorted(calls, key=lambda call: call.order))  # self.done ends with calls judged inside


def _ranked(calls: list[ReplayedCall]) -> tuple[ReplayedCall, ...]:
    """Rank culprits: by patch effect when measured, then by relative local error (1 = most important)."""
    culprits = [c for c in calls if c.culprit]

    def importance(call: ReplayedCall) -> tuple[float, float]:
        rel = call.local_rel_rms_err
        return (call.patch_effect if call.patch_effect is not None else -1.0, -1.0 if math.isnan(rel) else rel)

    ranks = {id(c): i + 1 for i, c in enumerate(sorted(culprits, key=importance, reverse=True))}
    return tuple(replace(c, rank=ranks[id(c)]) if c.culprit else c for c in calls)


def _indexer(node: Node) -> Callable[[str, int], int | None]:
    """For a rerun of ``node``'s call: the k-th call of a path in that run -> its call index in B's forward."""
    order: dict[str, list[int]] = {}
    for item in node.walk():
        order.setdefault(item.relative_path, []).append(item.call_index)

    def index(path: str, k: int) -> int | None:
        calls = order.get(path, [])
        return calls[k] if k < len(calls) else None
    return index


def _selected(pair: tuple[Node, Node], patterns: list[str]) -> bool:
    names = [pair[0].relative_path, pair[0].module_path, pair[1].relative_path, pair[1].module_path]
    return any(matches_any(name, patterns) for name in names)


def _progress_bar(enabled: bool, total: int) -> Any:
    if not enabled or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="replay", unit=" calls", file=sys.stderr, leave=False)

