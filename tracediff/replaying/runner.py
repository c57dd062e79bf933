"""Running one module call of B on A's recorded inputs and comparing it with A's recorded outputs."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..alignment.pairing.permuted import pair_orders
from ..alignment.pairing.slots import Parameters
from ..compare.metrics import compare_tensors
from ..compare.relative import relative_rms
from ..compare.tolerance import default_tolerance
from ..trace.load import Trace
from ..trace.model import Node, TensorRecord
from .inputs import NotRebuildable, Target, cast, output_slots, rebuild_inputs, substitute
from .layout import fitted, inputs_in_b_layout, layouts_differ, output_partners
from .oracle import NOISE_MULTIPLIER, float64_ops, judge
from .result import B_DIFFERS, NOT_COMPARABLE, OUT_OF_TOLERANCE, SAME_MATH, WITHIN_TOLERANCE, ReplayedTensor
from .shadow import seed_rng
from .states import fresh_states, holds_state


@dataclass
class CallSetup:
    """Everything needed to run one matched call: A's node, B's module (and its float64 twin), where to run."""

    trace: Trace
    node_a: Node
    node_b: Node | None
    module: nn.Module
    #: The float64 twin of ``module`` and where its inputs go, made on first use (None without the oracle).
    twin: Callable[[], tuple[nn.Module, Target] | None]
    target: Target
    seed: int
    atol: float | None
    rtol: float | None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    #: what B's own forward passed this call (the shadow run), when known: replay then uses B's layout
    b_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    #: the parameter names of A's and B's ``forward`` for this call, when the traces know them
    parameters: Parameters = (None, None)

    def load(self, record: TensorRecord) -> torch.Tensor:
        """A's payload for ``record``, read once per call."""
        if record.slot not in self.tensors:
            self.tensors[record.slot] = self.trace.load(record)
        return self.tensors[record.slot]

    def recorded_outputs(self) -> dict[str, torch.Tensor]:
        """A's recorded outputs that have a payload, by slot (unreadable ones left out)."""
        out = {}
        for record in self.node_a.outputs():
            if record.has_payload:
                try:
                    out[record.slot] = self.load(record)
                except Exception:  # noqa: BLE001 - reported as a missing output row
                    continue
        return out


def _run(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], seed: int,
         patch: Callable[[], Any] | None) -> Any:
    args, kwargs = fresh_states(args), fresh_states(kwargs)  # each run its own copy of a KV cache
    with torch.no_grad(), (patch() if patch is not None else nullcontext()):
        seed_rng(seed)
        return module(*args, **kwargs)


def _describe_error(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


@dataclass
class CallOutcome:
    rows: list[ReplayedTensor]
    verdict: str
    reason: str
    seconds: float


def replay_call(setup: CallSetup, *, oracle: bool, patch: Callable[[], Any] | None = None,
                twin_patch: Callable[[], Any] | None = None, twin_wanted: Callable[[], bool] | None = None
                ) -> CallOutcome:
    """Run B's module (and its float64 twin) on A's inputs; raises ``NotRebuildable`` when the inputs cannot be.

    ``patch`` and ``twin_patch`` give a context entered around B's run and the twin's; ``twin_wanted`` asks,
    after B's run, for the float64 run even when this call's own rows are within tolerance (a call judged
    inside this run needs it)."""
    started = time.perf_counter()
    # A's own layout first; when B's module does not take it, B's own layout filled with A's values
    in_b_layout, out_slots = False, None
    args, kwargs = rebuild_inputs(setup.trace, setup.node_a, setup.target, load=setup.load,
                                  own=setup.b_inputs)
    recorded = setup.recorded_outputs()
    try:
        output = _run(setup.module, args, kwargs, setup.seed, patch)
    except Exception as e:  # noqa: BLE001 - the port's code failed on A's inputs: a finding, not a crash
        if setup.node_b is None or setup.b_inputs is None or \
                not (layouts_differ(setup.node_a, setup.node_b) or holds_state(setup.b_inputs)):
            reason = f"B's module raised {_describe_error(e)} on A's inputs"
            return CallOutcome([], NOT_COMPARABLE, reason, time.perf_counter() - started)
        in_b_layout = True
        args, kwargs, out_slots = inputs_in_b_layout(setup.node_a, setup.node_b, setup.b_inputs, setup.load,
                                                     setup.parameters)
        try:
            output = _run(setup.module, args, kwargs, setup.seed, patch)
        except Exception as again:  # noqa: BLE001 - as above, in B's own layout too
            reason = f"B's module raised {_describe_error(again)} on A's inputs, in A's layout and in its own"
            return CallOutcome([], NOT_COMPARABLE, reason, time.perf_counter() - started)
    b_args, b_kwargs = (args, kwargs) if in_b_layout else ((), {})
    del args, kwargs
    produced, out_slots = _produced(setup, output, out_slots, recorded)
    mismatched_inputs = inputs_not_equivalent(setup)

    def rows_with(exact: dict[str, torch.Tensor], oracle_error: str = "") -> list[ReplayedTensor]:
        return [_row(setup, record, recorded.get(record.slot), produced.get(record.slot), exact.get(record.slot),
                     oracle=oracle, oracle_error=oracle_error, not_equivalent=mismatched_inputs)
                for record in setup.node_a.outputs()]

    rows = rows_with({})
    # The float64 run only matters for rows out of tolerance: a row within it is the same math already.
    wanted = oracle and (any(row.within_tolerance is False for row in rows)
                         or (twin_wanted is not None and twin_wanted()))
    twin = setup.twin() if wanted else None
    if twin is not None:
        try:
            if in_b_layout:
                args64, kwargs64 = _moved(b_args, twin[1]), _moved(b_kwargs, twin[1])
            else:
                args64, kwargs64 = rebuild_inputs(setup.trace, setup.node_a, twin[1], load=setup.load,
                                                  own=setup.b_inputs)
            with float64_ops():
                exact = dict(output_slots(_run(twin[0], args64, kwargs64, setup.seed, twin_patch)))
            rows = rows_with(_under_a_slots(exact, out_slots, recorded))
        except NotRebuildable:
            raise
        except Exception as e:  # noqa: BLE001 - the port's code in float64; reported in the rows
            rows = rows_with({}, f"the float64 run raised {_describe_error(e)}")
    verdict, reason = _call_verdict(rows, oracle)
    return CallOutcome(rows, verdict, reason, time.perf_counter() - started)


def judged_outputs(setup: CallSetup, output: Any, exact: Any = None, *, oracle: bool) -> CallOutcome:
    """The rows and verdict of ``setup``'s call from outputs produced elsewhere (inside its parent's run):
    B's ``output`` and, when the float64 run was made, its ``exact`` output, against A's recorded outputs."""
    recorded = setup.recorded_outputs()
    produced, out_slots = _produced(setup, output, None, recorded)
    exacts = _under_a_slots(dict(output_slots(exact)), out_slots, recorded) if exact is not None else {}
    rows = [_row(setup, record, recorded.get(record.slot), produced.get(record.slot), exacts.get(record.slot),
                 oracle=oracle, oracle_error="", not_equivalent="") for record in setup.node_a.outputs()]
    verdict, reason = _call_verdict(rows, oracle)
    return CallOutcome(rows, verdict, reason, 0.0)


def _produced(setup: CallSetup, output: Any, out_slots: dict[str, str] | None, recorded: dict[str, torch.Tensor]
              ) -> tuple[dict[str, torch.Tensor], dict[str, str] | None]:
    """B's ``output`` by A's slots, and the slot pairing used: ``out_slots`` when given, else the pairing
    ``align`` makes when B's slots are not A's (``outputs`` as ``outputs.0``)."""
    produced_b = dict(output_slots(output))
    if out_slots is None and setup.node_b is not None and not set(recorded) <= set(produced_b):
        out_slots = output_partners(setup.node_a, setup.node_b, setup.parameters)
    return _under_a_slots(produced_b, out_slots, recorded), out_slots


def _under_a_slots(produced: dict[str, torch.Tensor], out_slots: dict[str, str] | None,
                   recorded: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """B's outputs by A's slots, in A's layout (as they are when the call ran in A's layout)."""
    if out_slots is None:
        return produced
    out = {}
    for slot_a in recorded.keys() - out_slots.keys():  # slots the pairing left alone keep their name
        if slot_a in produced:
            out[slot_a] = produced[slot_a]
    for slot_a, slot_b in out_slots.items():
        value = produced.get(slot_b)
        if value is not None and slot_a in recorded:
            value = fitted(value, recorded[slot_a])
        if value is not None:
            out[slot_a] = value
    return out


def _moved(value: Any, target: Target) -> Any:
    """``value`` with every tensor on ``target``'s device, floating ones in its dtype (those a stateful argument
    holds too, in a fresh copy of it)."""
    moved = substitute(value, lambda _slot, t: cast(t, target.dtype if t.is_floating_point() else None,
                                                     target.device))
    return fresh_states(moved, target.dtype, target.device)


def inputs_not_equivalent(setup: CallSetup) -> str:
    """Why A's inputs are not what B's own forward gives this call, when a tensor of B's is None in A."""
    if setup.node_b is None:
        return ""
    b_slots = {record.slot for record in setup.node_b.inputs()}
    for slot, value in setup.node_a.values.items():
        if value is not None or not slot.startswith("inputs."):
            continue
        held = sorted(s for s in b_slots if s == slot or s.startswith(slot + "."))
        if not held:
            continue
        name = slot.rsplit(".", 1)[-1]
        shape = next((r.shape for r in setup.node_b.inputs() if r.slot == held[0]), None)
        remedy = ("A's attention kernel (sdpa, flash) probably applied the mask itself; capture A with eager "
                  "attention (attn_implementation=\"eager\") so that its trace holds the mask"
                  if "mask" in name else "capture A so that this input is recorded, or replay a module that "
                                         "receives it as B does")
        return (f"inputs not equivalent: A's trace holds {name}=None where B's own forward passes a tensor "
                f"of shape {tuple(shape) if shape else '?'}; {remedy}")
    return ""


def _row(setup: CallSetup, record: TensorRecord, a: torch.Tensor | None, b: torch.Tensor | None,
         exact: torch.Tensor | None, *, oracle: bool, oracle_error: str, not_equivalent: str) -> ReplayedTensor:
    base: dict[str, Any] = {"tensor": record.slot, "shape_a": record.shape, "dtype_a": record.dtype,
                            "shape_b": tuple(b.shape) if b is not None else None,
                            "dtype_b": str(b.dtype) if b is not None else None}
    if a is None:
        why = record.stale_reason or ("no payload in A's trace" if record.payload is None else "payload unreadable")
        return ReplayedTensor(**base, verdict=NOT_COMPARABLE, reason=f"A's {record.slot}: {why}")
    if b is None:
        return ReplayedTensor(**base, verdict=NOT_COMPARABLE, reason=f"B's output has no {record.slot}")
    if tuple(a.shape) != tuple(b.shape):
        return ReplayedTensor(**base, verdict=NOT_COMPARABLE,
                              reason=f"shapes differ: A {tuple(a.shape)}, B {tuple(b.shape)}")
    b, exact = _in_a_order(a, b, exact)
    default_atol, default_rtol = default_tolerance(str(a.dtype), str(b.dtype))
    atol = default_atol if setup.atol is None else setup.atol
    rtol = default_rtol if setup.rtol is None else setup.rtol
    b_cpu = b.detach().to("cpu")
    m = compare_tensors(a, b_cpu, atol=atol, rtol=rtol)
    rel_rms = relative_rms(a, b_cpu)
    local: dict[str, Any] = {"local_max_abs_err": m.max_abs_err, "local_max_rel_err": m.max_rel_err,
                             "local_rms_err": m.rms_err, "local_rel_rms_err": rel_rms, "atol": atol, "rtol": rtol,
                             "within_tolerance": m.within_tolerance}
    non_finite = m.nan_mismatch + m.inf_mismatch
    if not oracle:
        verdict = WITHIN_TOLERANCE if m.within_tolerance else OUT_OF_TOLERANCE
        reason = "" if m.within_tolerance else f"max abs error {m.max_abs_err:.3g} (atol {atol:g}, rtol {rtol:g})"
        if not m.within_tolerance and not_equivalent:
            verdict, reason = NOT_COMPARABLE, not_equivalent
        return ReplayedTensor(**base, **local, verdict=verdict, reason=reason)
    if exact is None or tuple(exact.shape) != tuple(a.shape):
        why = oracle_error or "the float64 run gave no such output"
        verdict = SAME_MATH if m.within_tolerance else NOT_COMPARABLE
        return ReplayedTensor(**base, **local, verdict=verdict, reason="" if m.within_tolerance else why)
    view = judge(a, b_cpu, exact)
    oracle_cols: dict[str, Any] = {"precision_noise": view.precision_noise, "math_diff": view.math_diff,
                                   "noise_budget": view.noise_budget, "factor": view.factor}
    if m.within_tolerance or (view.same_math and not non_finite):
        return ReplayedTensor(**base, **local, **oracle_cols, verdict=SAME_MATH,
                              reason="" if m.within_tolerance else f"{view.factor:.2g}x B's precision noise")
    if not_equivalent:
        return ReplayedTensor(**base, **local, **oracle_cols, verdict=NOT_COMPARABLE, reason=not_equivalent)
    if non_finite and view.same_math:
        reason = f"{m.nan_mismatch} NaN and {m.inf_mismatch} infinity mismatch(es) against A"
    else:
        reason = f"{view.factor:.3g}x the precision noise (same math allows {NOISE_MULTIPLIER:g}x)"
    return ReplayedTensor(**base, **local, **oracle_cols, verdict=B_DIFFERS, reason=reason)


def _in_a_order(a: torch.Tensor, b: torch.Tensor, exact: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """B's output (and its float64 twin's) in A's order, when B holds A's values with rotary pairs ordered
    otherwise inside each head (a Meta-to-transformers ``q_proj``: the port's layout, see
    :mod:`tracediff.alignment.pairing.permuted`); as they are otherwise."""
    if not (a.is_floating_point() and b.is_floating_point()) or a.dim() == 0 or not a.numel():
        return b, exact
    a64, b64 = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
    as_is = float((a64 - b64).abs().max())
    if not as_is > 1e-3 * float(a64.abs().max()):
        return b, exact
    for order in pair_orders(tuple(b.shape)):
        if float((a64 - order.apply(b64)).abs().max()) < 0.01 * as_is:
            twin = order.apply(exact) if exact is not None and tuple(exact.shape) == tuple(b.shape) else exact
            return order.apply(b), twin
    return b, exact


def _call_verdict(rows: list[ReplayedTensor], oracle: bool) -> tuple[str, str]:
    """The call's verdict: a blaming row first, then ``not comparable``, else the passing verdict."""
    if not rows:
        return NOT_COMPARABLE, "A's trace holds no outputs for this call"
    for verdict in (B_DIFFERS, OUT_OF_TOLERANCE):
        hits = [r for r in rows if r.verdict == verdict]
        if hits:
            worst = max(hits, key=lambda r: -1.0 if r.factor is None or math.isnan(r.factor) else r.factor)
            return verdict, f"{worst.tensor}: {worst.reason}" if worst.reason else worst.tensor
    # Some outputs compared fine and others could not be (an eager attention's weights against an sdpa
    # port's None): the call is judged on what could be compared, and says what could not.
    apart = [r for r in rows if r.verdict == NOT_COMPARABLE]
    note = "; ".join(f"{r.tensor} not comparable: {r.reason}" for r in apart[:3])
    if len(apart) == len(rows):
        return NOT_COMPARABLE, note
    return (SAME_MATH if oracle else WITHIN_TOLERANCE), note

