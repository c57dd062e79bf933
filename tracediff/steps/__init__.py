"""Training-run introspection: record every step of two runs, then find the first that differs.

Record a run (a plain PyTorch loop)::

    import tracediff

    with tracediff.StepRecorder(model, "runs/a", optimizer=opt) as recorder:
        for batch in loader:
            with recorder.step(batch):
                loss_fn(model(batch["x"]), batch["y"]).backward()
                opt.step()
                opt.zero_grad()

Record the other run into ``runs/b`` the same way, then::

    result = tracediff.compare_steps("runs/a", "runs/b")
    result.first_divergence   # StepDivergence(step=3, group="optimizer", name="param_groups.0.lr", ...)
    result.steps              # DataFrame: one row per step, entries that differ, largest drift

or ``tracediff steps runs/a runs/b``. Each step record holds content hashes
(SHA-256, see :mod:`tracediff.steps.hashing`) and statistics
(:mod:`tracediff.steps.tensor_stats`) of the RNG states, the batch, the
parameters, buffers, gradients and optimizer state (:mod:`tracediff.steps.recorder`);
the comparison rule is in :mod:`tracediff.steps.rule`. With Lightning, use
``tracediff.steps.lightning.StepRecorderCallback`` (needs ``pip install tracediff[lightning]``).
"""

from typing import TYPE_CHECKING, Any

from .compare import compare_steps
from .result import StatRow, StepComparison, StepDivergence, StepSummary, Verdict
from .stat_names import DEFAULT_STATS, STAT_NAMES

if TYPE_CHECKING:
    from .recorder import StepRecorder


def __getattr__(name: str) -> Any:
    """``StepRecorder`` is imported on first use: it needs torch, comparing records does not."""
    if name == "StepRecorder":
        from .recorder import StepRecorder

        return StepRecorder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "StepRecorder",
    "compare_steps",
    "StepComparison",
    "StepDivergence",
    "StepSummary",
    "StatRow",
    "Verdict",
    "DEFAULT_STATS",
    "STAT_NAMES",
]
