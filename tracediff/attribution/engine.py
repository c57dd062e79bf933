"""``tracediff.attribute``: which calls of a quantized or low-precision model cost the most of its final error?

A short tour::

    import tracediff

    result = tracediff.attribute(quantized_model, "traces/float")
    result.top.module_path            # the call that costs the most
    result.table                      # every ranked call: share of the final error, local error, rank

1. A's top-level inputs are rebuilt from its trace and B's whole forward
   runs once on them (replay's shadow run): B's call tree and B's final
   output, whose error against A's recorded output is the *final error*
   (:mod:`.final`: logits KL for a language model).
2. The calls to rank are chosen (:mod:`.units`: decoder layers, leaves or
   globs) and paired with A's by module path and call index (a quantized
   model keeps its float model's paths).
3. Each runs alone on A's recorded inputs (:mod:`.local`): its local error,
   free of what flows in.
4. For each, B's forward runs again from that call on: the calls done before
   it answer A's recorded outputs without running, the call itself answers
   its output on A's inputs (step 3), and every call after it is restored
   (its output minus its local error, :mod:`.restore`) and runs with plain
   kernels in place of quantized ones (:mod:`.surrogates`). The final error
   left is what the call causes on its own, what a one-at-a-time scan
   measures. Calls are ranked by it.
5. With ``budget=N``, a greedy selection restores calls together
   (:mod:`.budget`, :meth:`_Job.final_restored`: the restored calls on plain
   kernels, the others on B's): the N whose joint restoration removes the most.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import TraceFormatError, UsageError
from ..replaying.inputs import NotRebuildable, Target, fresh_caches, rebuild_inputs, substitute
from ..replaying.placement import check_device, module_device, param_dtype, prepared
from ..replaying.shadow import seed_rng, shadow_run
from ..trace.load import Trace, load_trace
from ..trace.model import Node
from .budget import Candidate, greedy
from .final import FinalError, final_error
from .local import LocalError, local_error
from .restore import Deltas, Key, minus, restored
from .result import AttributedCall, Attribution, SkippedUnit
from .surrogates import KernelSurrogates, opaque_weights
from .units import LAYERS, selected_calls


def attribute(
    model_b: nn.Module,
    trace_a: str | Path | Trace,
    *,
    modules: str | Sequence[str] = LAYERS,
    budget: int | None = None,
    device: str | torch.device | None = None,
) -> Attribution:
    """Rank the calls of ``model_b`` (quantized, or in lower precision) by the share of the final error they cause.

    Args:
        model_b: the quantized or low-precision model (torchao, optimum-quanto,
            a GGUF file dequantized by transformers, a bf16 cast...). Its module
            paths must be those of the model A's trace was captured from. It is
            put in eval mode; its modes (and device, with ``device``) are restored.
        trace_a: the float model's trace (folder, JSON file or ``Trace``),
            captured with payloads (``tensors="full"``, the default).
        modules: ``"layers"`` (default: each decoder layer, N = number of
            layers), ``"leaves"`` (each module without submodules that holds a
            parameter: about 7 per decoder layer), or globs over B's module
            paths (relative or full; ``*`` one path segment, ``**`` any
            number: ``"model.layers.*.mlp"``).
        budget: also choose this many calls greedily, each step measuring the
            final error with every chosen call restored at once (``budget``
            steps of up to N forwards each). Default: none.
        device: run ``model_b`` there (default: where it is).

    Returns:
        An ``Attribution``; ``ranking`` most costly first.

    Raises:
        TraceFormatError: the trace cannot be read or holds no payloads.
        UsageError: bad ``modules`` or ``budget``; B's forward raises on A's
            inputs, or its output has no floating tensor that pairs with A's.
    """
    started = time.perf_counter()
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise UsageError(f"budget={budget!r}: expected a whole number >= 1")
    run_device = check_device(device)
    trace = trace_a if isinstance(trace_a, Trace) else load_trace(trace_a)
    _check_payloads(trace)
    with prepared(model_b, run_device) as where:
        job = _Job(trace, model_b, where)
        job.measure(modules)
        steps = greedy(job.candidates(), job.final_restored, job.base.value, budget) if budget else []
    return Attribution(trace_a=str(trace.directory), model_b=type(model_b).__name__, granularity=job.granularity,
                       final_error=job.base, residual_error=job.residual, ranking=tuple(job.ranking),
                       budget=tuple(steps), skipped=tuple(job.skipped), warnings=tuple(job.warnings),
                       forward_passes=job.forwards, module_runs=job.module_runs, seconds=time.perf_counter() - started)


def _check_payloads(trace: Trace) -> None:
    if trace.summary_only or not any(record.has_payload for _, record in trace.records()):
        raise TraceFormatError(f"{trace.json_path}: holds no tensor payloads; attribution runs B's calls on A's "
                               "recorded tensors: capture A with tensors=\"full\"")


def _seed(metadata: dict[str, Any]) -> int:
    seed = metadata.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else 0


class _Job:
    """One attribution: B's forward on A's inputs, the local errors, one restored forward per call."""

    def __init__(self, trace: Trace, model: nn.Module, device: torch.device) -> None:
        self.trace, self.model, self.device = trace, model, device
        self.seed = _seed(trace.metadata)
        self.modules = dict(model.named_modules(remove_duplicate=False))
        self.warnings: list[str] = []
        self.skipped: list[SkippedUnit] = []
        self.ranking: list[AttributedCall] = []
        self.deltas: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self.keys: dict[tuple[str, int], tuple[str, int]] = {}  # (B's full path, call) -> (relative path, call)
        self.forwards = 0
        self.module_runs = 0
        self.surrogates = KernelSurrogates()
        # (relative path, call) -> the local error with plain kernels, where they are not the module's own
        self.plain_deltas: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self.granularity = LAYERS
        self.residual = math.nan  # the final error with every ranked call restored
        root = trace.roots[0]
        try:
            self.args, self.kwargs = rebuild_inputs(trace, root, Target(device, param_dtype(model)),
                                                    own=fresh_caches(trace, root))
        except NotRebuildable as e:
            raise UsageError(f"{trace.json_path}: A's top-level inputs cannot be rebuilt ({e})") from None
        self.recorded = {r.slot: trace.load(r) for r in root.outputs() if r.has_payload}
        self.shadow = shadow_run(model, self.args, self.kwargs, seed=self.seed, stats=False)  # paths, orders
        self.forwards += 1
        if self.shadow.error is not None or self.shadow.trace is None:
            raise UsageError(f"B's forward on A's recorded inputs raised {self.shadow.error}")
        base = final_error(self.recorded, self.shadow.output)
        if base is None:
            raise UsageError(f"{trace.json_path}: no floating output of B pairs with A's recorded final outputs "
                             "(slot or shape differs)")
        self.base: FinalError = base
        self.nodes_a = {(n.relative_path, n.call_index): n for n in root.walk() if n.phase == "forward"}

    def final_with(self, deltas: Deltas, ahead: Mapping[Key, Any] | None = None) -> float:
        """The final error of B's forward with the ``deltas`` calls restored and the ``ahead`` ones answering A's
        outputs without running (:mod:`.restore`); NaN when the forward raised."""
        self.forwards += 1
        with torch.no_grad(), restored(self.model, deltas, ahead):
            seed_rng(self.seed)
            try:
                output = self.model(*self.args, **self.kwargs)
            except Exception as e:  # noqa: BLE001 - reported as a warning; the call is not ranked
                names = ", ".join(p for p, _ in {**deltas, **(ahead or {})})
                self.warnings.append(f"B's forward with {names} restored raised {type(e).__name__}")
                return math.nan
        after = final_error(self.recorded, output)
        return after.value if after is not None else math.nan

    def final_restored(self, deltas: Deltas) -> float:
        """B's final error with the calls of ``deltas`` restored together, the others as B runs them: the mixed-
        precision model ``--budget`` weighs. The restored calls run plain kernels and lose their plain local
        error, as in the per-call runs (their own kernels would round a moved input again); the rest run B's."""
        plain = {key: self.plain_deltas.get(key, delta) for key, delta in deltas.items()}
        weights = [w for path in {path for path, _ in deltas} for w in opaque_weights(self.modules[path])]
        with self.surrogates.applied_to(weights):
            return self.final_with(plain)

    def measure(self, modules: str | Sequence[str]) -> None:
        """Local errors, the final error with every ranked call restored, then one forward per call from it on."""
        assert self.shadow.trace is not None
        calls = [n for n in self.shadow.trace.nodes() if n.relative_path]
        chosen, self.granularity = selected_calls(self.model, calls, modules)
        locals_: list[tuple[Node, LocalError]] = []
        for node in chosen:
            local = self._local(node)
            if local is not None:
                key = (node.relative_path, node.call_index)
                self.deltas[key] = local.delta
                self.keys[(node.module_path, node.call_index)] = key
                locals_.append((node, local))
        if not locals_:
            return
        answers = {self.keys[(n.module_path, n.call_index)]: substitute(local.output, minus(local.delta))
                   for n, local in locals_}
        exits = {self.keys[(n.module_path, n.call_index)]: n.exit_order for n, _ in locals_}
        with self.surrogates:
            self.residual = self.final_with({}, answers)
        if math.isnan(self.residual):
            raise UsageError("B's forward with every ranked call restored raised: no call can be ranked")
        measured: list[tuple[Node, LocalError, float]] = []
        for node, local in locals_:
            key = (node.relative_path, node.call_index)
            if not any(bool(d.any()) for d in local.delta.values()):
                # bit for bit A's output on A's inputs (a norm left in float): alone, it causes no error
                measured.append((node, local, self.residual))
                continue
            # the calls done before this one starts see A's inputs: they answer A's outputs without running;
            # this one answers its own output on A's inputs, measured with its real kernel
            ahead = {k: answers[k] for k, done in exits.items() if done is not None and done < node.enter_order}
            ahead[key] = local.output
            after = {k: self.plain_deltas.get(k, d) for k, d in self.deltas.items() if k not in ahead}
            with self.surrogates:
                alone = self.final_with(after, ahead)
            if math.isnan(alone):
                self.skipped.append(SkippedUnit(node.module_path, node.call_index,
                                                "B's forward with the other calls restored raised"))
                continue
            measured.append((node, local, alone))
        self.ranking = _ranked(measured, self.base.value, self.residual)

    def _local(self, node: Node) -> LocalError | None:
        node_a = self.nodes_a.get((node.relative_path, node.call_index))
        if node_a is None:
            self.skipped.append(SkippedUnit(node.module_path, node.call_index,
                                            "A's trace holds no call at this module path and call index"))
            return None
        module = self.modules[node.relative_path]
        slot_dtypes = self.shadow.slot_dtypes.get((node.relative_path, node.call_index), {})
        dtype = param_dtype(module) or next(iter(slot_dtypes.values()), None) or param_dtype(self.model)
        target = Target(module_device(module, self.device), dtype, dict(slot_dtypes))
        self.module_runs += 1
        own = self.shadow.inputs.get((node.relative_path, node.call_index))
        local = local_error(self.trace, node_a, module, target, self.seed, own)
        if not local.delta:
            self.skipped.append(SkippedUnit(node.module_path, node.call_index, local.reason))
            return None
        if not all(self.surrogates.same_as_kernel(w, target.dtype or w.dtype) for w in opaque_weights(module)):
            # its plain kernel is not its real one (it rounds activations): its plain local error is its own
            self.module_runs += 1
            with self.surrogates:
                plain = local_error(self.trace, node_a, module, target, self.seed, own)
            if plain.delta.keys() == local.delta.keys():
                self.plain_deltas[(node.relative_path, node.call_index)] = plain.delta
        return local

    def candidates(self) -> list[Candidate]:
        """Every ranked call as a budget candidate, most costly first."""
        return [(self.keys[(c.module_path, c.call_index)], c.module_path,
                 self.deltas[self.keys[(c.module_path, c.call_index)]], c.share) for c in self.ranking]


def _ranked(measured: list[tuple[Node, LocalError, float]], base: float, residual: float) -> list[AttributedCall]:
    """Most costly first: by share, then by local error (both descending).

    A call's share is the final error it causes on its own, over B's final error:
    ``(E(only this call quantized) - E(every call restored)) / E(B)``, clipped to
    [0, 1]: what a one-at-a-time scan measures, less what no ranked call covers.
    """
    def share(alone: float) -> float:
        if not base > 0:
            return 0.0
        return min(1.0, max(0.0, (alone - residual) / base))

    rows = sorted(measured, key=lambda item: (-share(item[2]), -_finite(item[1].x_noise)))
    return [AttributedCall(module_path=node.module_path, call_index=node.call_index,
                           module_type=node.module_type or "", local_error=local.x_noise,
                           local_rel_rms_err=local.rel_rms_err, local_max_abs_err=local.max_abs_err,
                           share=share(alone), final_error_alone=alone, rank=i + 1)
            for i, (node, local, alone) in enumerate(rows)]


def _finite(value: float) -> float:
    return value if math.isfinite(value) else (math.inf if value > 0 else -1.0)
