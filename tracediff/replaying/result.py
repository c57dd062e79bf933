"""What ``tracediff.replay`` returns: one ``Replay`` with a row per replayed output tensor.

A ``ReplayedCall`` is one module call of B run alone on A's recorded inputs;
its ``tensors`` are the ``ReplayedTensor`` rows, one per output tensor. The
columns of ``Replay.table`` (and the keys of each row in ``to_dict()``):

======================  =====================================================
``module_path_a/_b``    the recorded path in A, B's path (root class included)
``call_index``          the call of B's module (0 for the first)
``tensor``              the output slot: ``outputs``, ``outputs.0``, ...
``local_max_abs_err``   ``max |a - b|``: A's recorded output against B's output
``local_max_rel_err``   ``max |a - b| / |a|`` (see ``tracediff.compare.metrics``)
``local_rel_rms_err``   ``rms(a - b) / rms(a)``: the relative local error
``within_tolerance``    ``|a - b| <= atol + rtol |a|`` everywhere
``precision_noise``     ``rms(b - exact)``: B against its own float64 run
``math_diff``           ``rms(a - exact)``: A against B's exact math
``noise_budget``        what the precisions explain (see ``replaying.oracle``)
``factor``              ``math_diff / noise_budget``
``verdict``             ``same math``, ``B differs``, ``not comparable``;
                        without the oracle ``within tolerance`` or
                        ``out of tolerance``
``reason``              why (the factor, the missing mask, the exception)
======================  =====================================================
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

REPLAY_FORMAT_VERSION = 1

SAME_MATH = "same math"
B_DIFFERS = "B differs"
NOT_COMPARABLE = "not comparable"
WITHIN_TOLERANCE = "within tolerance"
OUT_OF_TOLERANCE = "out of tolerance"
BLAMING = (B_DIFFERS, OUT_OF_TOLERANCE)


@dataclass(frozen=True)
class ReplayedTensor:
    """One output tensor of a replayed call: A's recorded value against B's, and the oracle's view."""

    tensor: str
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype_a: str | None
    dtype_b: str | None
    local_max_abs_err: float = math.nan
    local_max_rel_err: float = math.nan
    local_rms_err: float = math.nan
    local_rel_rms_err: float = math.nan
    atol: float = math.nan
    rtol: float = math.nan
    within_tolerance: bool | None = None
    precision_noise: float | None = None
    math_diff: float | None = None
    noise_budget: float | None = None
    factor: float | None = None
    verdict: str = NOT_COMPARABLE
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReplayedCall:
    """One module call of B run alone on A's recorded inputs."""

    module_path_a: str
    module_path_b: str
    call_index: int
    module_type: str | None
    order: int
    tensors: tuple[ReplayedTensor, ...]
    verdict: str
    reason: str = ""
    culprit: bool = False
    explained_by: tuple[str, ...] = ()
    patch_effect: float | None = None
    rank: int | None = None
    seconds: float = 0.0

    @property
    def worst(self) -> ReplayedTensor | None:
        """The row that decides the verdict: the largest factor (or local error without the oracle)."""
        rows = [t for t in self.tensors if t.verdict == self.verdict] or list(self.tensors)
        if not rows:
            return None
        return max(rows, key=lambda t: _finite_or(t.factor, -1.0) if t.factor is not None
                   else _finite_or(t.local_rel_rms_err, -1.0))

    @property
    def local_max_abs_err(self) -> float:
        values = [t.local_max_abs_err for t in self.tensors if not math.isnan(t.local_max_abs_err)]
        return max(values) if values else math.nan

    @property
    def local_rel_rms_err(self) -> float:
        values = [t.local_rel_rms_err for t in self.tensors if not math.isnan(t.local_rel_rms_err)]
        return max(values) if values else math.nan

    def describe(self) -> str:
        """``model.layers.2.mlp.down_proj (call 0): B differs, ...`` in one line."""
        where = self.module_path_b if self.module_path_a.split(".", 1)[-1] == self.module_path_b.split(".", 1)[-1] \
            else f"{self.module_path_b} (A: {self.module_path_a})"
        return f"{where} call {self.call_index}: {self.verdict}" + (f" ({self.reason})" if self.reason else "")

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "module_path_a": self.module_path_a, "module_path_b": self.module_path_b, "call_index": self.call_index,
            "module_type": self.module_type, "order": self.order, "verdict": self.verdict, "reason": self.reason,
            "culprit": self.culprit, "explained_by": list(self.explained_by), "patch_effect": self.patch_effect,
            "rank": self.rank, "local_max_abs_err": self.local_max_abs_err,
            "local_rel_rms_err": self.local_rel_rms_err,
            "precision_noise": worst.precision_noise if worst else None,
            "math_diff": worst.math_diff if worst else None,
            "noise_budget": worst.noise_budget if worst else None,
            "factor": worst.factor if worst else None,
            "seconds": self.seconds,
            "tensors": [t.to_dict() for t in self.tensors],
        }


@dataclass(frozen=True)
class SkippedCall:
    """A module call that was not replayed, and why."""

    module_path_b: str
    call_index: int
    reason: str
    module_path_a: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Replay:
    """The result of ``tracediff.replay``: truthy when no module call of B is a culprit."""

    trace_a: str
    model_b: str
    oracle: bool
    device: str
    seed: int
    modules: tuple[ReplayedCall, ...]
    skipped: tuple[SkippedCall, ...]
    noise_multiplier: float
    end_to_end: dict[str, Any] | None = None
    warnings: tuple[str, ...] = ()
    patched: bool = False
    seconds: float = 0.0
    #: why the replay cannot pass: calls that differ with an unjudged call inside them, and unjudged calls
    #: that no call around them judged the same math (see ``tracediff.replaying.culprits``)
    undecided: tuple[str, ...] = ()
    #: B runs under ``torch.compile``: each module was replayed compiled (``torch.compile(module)``), its
    #: float64 oracle run eager
    compiled: bool = False

    @property
    def culprits(self) -> tuple[ReplayedCall, ...]:
        """The innermost calls whose own math differs, in execution order (``rank`` orders them by effect)."""
        return tuple(call for call in self.modules if call.culprit)

    @property
    def compared(self) -> int:
        """How many replayed calls had an output compared with A's (a call B's module could not run on A's
        inputs compared nothing)."""
        return sum(1 for call in self.modules if call.verdict != NOT_COMPARABLE and call.tensors)

    @property
    def nothing_compared(self) -> str | None:
        """Why the replay compared nothing, in one line; None when it compared something."""
        if self.compared:
            return None
        reasons = [call.reason for call in self.modules if call.reason] + [skip.reason for skip in self.skipped]
        why = f": {reasons[0]}" if reasons else ""
        return (f"nothing comparable: {len(self.modules)} call(s) replayed with no output compared, "
                f"{len(self.skipped)} skipped{why}")

    @property
    def not_comparable(self) -> tuple[ReplayedCall, ...]:
        """Replayed calls whose outputs could not be compared (B's module raised on A's inputs, ...)."""
        return tuple(call for call in self.modules if call.verdict == NOT_COMPARABLE)

    @property
    def passed(self) -> bool:
        """No culprit, nothing undecided, and something was compared: a replay that compared nothing, or in
        which a call that could not be judged may hold the mistake (``undecided``), never passes."""
        return self.verdict == "passed"

    @property
    def verdict(self) -> str:
        """``passed``, ``diverged`` (culprits), ``undecided`` (see ``undecided``) or ``nothing compared``."""
        if self.culprits:
            return "diverged"
        if self.compared == 0:
            return "nothing compared"
        return "undecided" if self.undecided else "passed"

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        state = "passed" if self.passed else f"{len(self.culprits)} culprit(s)" if self.culprits \
            else "undecided" if self.undecided else "nothing comparable"
        return (f"<Replay {state}: {len(self.modules)} calls replayed, {len(self.skipped)} skipped, "
                f"oracle {'on' if self.oracle else 'off'}>")

    def _repr_html_(self) -> str:
        from ..display import summary_html

        facts = [("trace A", self.trace_a), ("model B", f"{self.model_b} on {self.device}"),
                 ("replayed", len(self.modules)), ("skipped", len(self.skipped)),
                 ("oracle", f"on ({self.noise_multiplier:g}x noise)" if self.oracle else "off")]
        facts += [(f"culprit #{c.rank}", c.describe()) for c in self.culprits]
        return summary_html("tracediff replay", facts, verdict=self.verdict)

    @property
    def table(self) -> Any:
        """A pandas DataFrame: one row per replayed call and output tensor, in execution order."""
        import pandas as pd

        rows = []
        for call in self.modules:
            for t in call.tensors:
                rows.append({"order": call.order, "module_path_a": call.module_path_a,
                             "module_path_b": call.module_path_b, "call_index": call.call_index,
                             "module_type": call.module_type, **t.to_dict(), "culprit": call.culprit,
                             "explained_by": ", ".join(call.explained_by), "patch_effect": call.patch_effect})
        columns = ["order", "module_path_a", "module_path_b", "call_index", "module_type",
                   *ReplayedTensor.__dataclass_fields__, "culprit", "explained_by", "patch_effect"]
        return pd.DataFrame(rows, columns=columns)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (NaN and infinities are left to the renderer)."""
        culprits = [call.to_dict() for call in self.culprits]
        for entry in culprits:
            entry.pop("tensors")
        return {
            "format_version": REPLAY_FORMAT_VERSION,
            "passed": self.passed,
            "verdict": self.verdict,
            "undecided": list(self.undecided),
            "trace_a": self.trace_a,
            "model_b": self.model_b,
            "oracle": self.oracle,
            "noise_multiplier": self.noise_multiplier,
            "device": self.device,
            "seed": self.seed,
            "patched": self.patched,
            "compiled": self.compiled,
            "culprits": culprits,
            "modules": [call.to_dict() for call in self.modules],
            "skipped": [s.to_dict() for s in self.skipped],
            "end_to_end": self.end_to_end,
            "warnings": list(self.warnings),
            "seconds": self.seconds,
        }


def _finite_or(value: float | None, default: float) -> float:
    return default if value is None or math.isnan(value) else value
