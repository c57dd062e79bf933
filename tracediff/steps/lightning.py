"""A PyTorch Lightning callback around :class:`tracediff.StepRecorder`.

::

    import lightning.pytorch as pl
    from tracediff.steps.lightning import StepRecorderCallback

    trainer = pl.Trainer(max_steps=100, callbacks=[StepRecorderCallback("runs/a", every=10)])
    trainer.fit(module, loader)

Each training batch is one step (``on_train_batch_start`` to
``on_train_batch_end``); the recorder is made at ``on_train_start`` for the
LightningModule and the trainer's first optimizer, and closed when training
ends or raises. Keyword arguments are those of ``StepRecorder``.

Differences from a plain loop: under automatic optimization Lightning runs
forward and backward inside ``optimizer.step(closure)``, after the optimizer's
step pre-hook, so buffers are taken before this step's forward (params and
optimizer state are still taken before the update). With gradient
accumulation, batches without an optimizer step take params at their end.
Only the first optimizer is recorded.

Lightning is imported only when ``StepRecorderCallback`` is first used; this
module imports without it. Install it with ``pip install 'tracediff[lightning]'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .recorder import StepRecorder

__all__ = ["StepRecorderCallback"]

_CLASS: type | None = None


def _callback_class() -> type:
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    try:
        from lightning.pytorch import Callback
    except ImportError as e:
        raise ImportError("tracediff.steps.lightning needs Lightning: pip install 'tracediff[lightning]'") from e

    class StepRecorderCallback(Callback):
        """Record training steps of a Lightning ``Trainer`` into ``out_dir`` (see the module docstring)."""

        def __init__(self, out_dir: str | Path, **recorder_options: Any) -> None:
            super().__init__()
            self.out_dir = Path(out_dir)
            self.recorder_options = recorder_options
            self.recorder: StepRecorder | None = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            optimizer = trainer.optimizers[0] if trainer.optimizers else None
            self.recorder = StepRecorder(pl_module, self.out_dir, optimizer=optimizer, **self.recorder_options)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if self.recorder is not None:
                self.recorder.begin_step(batch)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.recorder is not None and self.recorder.in_step:
                self.recorder.end_step()

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            if self.recorder is not None:
                if self.recorder.in_step:
                    self.recorder.end_step(exception)
                self._close(raise_failure=False)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self._close(raise_failure=True)

        def _close(self, *, raise_failure: bool) -> None:
            recorder, self.recorder = self.recorder, None
            if recorder is None:
                return
            try:
                recorder.close()
            except Exception:
                if raise_failure:
                    raise

    StepRecorderCallback.__module__ = __name__
    _CLASS = StepRecorderCallback
    return _CLASS


def __getattr__(name: str) -> Any:
    if name == "StepRecorderCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
