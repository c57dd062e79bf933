"""``tracediff.StepRecorder``: hashes and statistics of every training step, for a plain PyTorch loop.

::

    import tracediff

    with tracediff.StepRecorder(model, "runs/a", optimizer=opt, every=1) as recorder:
        for batch in loader:
            with recorder.step(batch):
                loss = model(**batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad()

Then ``tracediff steps runs/a runs/b`` names the first step, group and tensor
at which two runs differ. What a record of step ``k`` holds, and when it is taken:

========== ==================================================================
rngs       at entry of the block: hashes of torch (CPU, each initialized CUDA
           device), numpy and ``random`` states (:mod:`~tracediff.steps.rngs`)
batch      at entry: every tensor, array and plain value of ``batch``, nested
params     in the optimizer's step pre-hook, i.e. the values the update reads
buffers    with params
grads      as each gradient is accumulated (``register_post_accumulate_grad_hook``;
           with gradient accumulation the last accumulation wins)
optimizer  with params: type, hyperparameters and state, i.e. the state
           before this step's update (:mod:`~tracediff.steps.optimizer`)
========== ==================================================================

Without an optimizer, or when it did not step inside the block (a skipped
GradScaler step), params, buffers and optimizer state are taken when the block
exits; ``taken_at`` in the record says which. Tensors get a SHA-256 content
hash (:mod:`~tracediff.steps.hashing`) and the statistics asked for
(:mod:`~tracediff.steps.tensor_stats`).

Recording reads tensors and never writes them, so training is bit-identical
with and without it. A hook never raises into training: what cannot be
recorded becomes an ``{"error": ...}`` entry. A block that raises leaves its
record with ``"complete": false`` and the error; a killed process leaves the
record written at entry (also ``"complete": false``). If writing fails (disk
full) recording stops with a warning and ``close()`` raises the error.
"""

from __future__ import annotations

import datetime as _dt
import warnings
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from ..capturing.distributed import current_rank, is_dtensor, world_size
from ..errors import TracediffError, UsageError
from ..files.atomic import write_json
from .entries import batch_entries, error_entry, tensor_entry
from .environment import environment_variables, installed_packages, system_info
from .hashing import HASH_ALGORITHM
from .layout import FORMAT_VERSION, RUN_FILE, RUN_FORMAT, prepare_out_dir, record_path
from .optimizer import optimizer_snapshot
from .options import GROUPS, checked_groups, checked_schedule, checked_stats
from .records import aggregate_hash, aggregate_key
from .rngs import rng_entries
from .stat_names import DEFAULT_STATS

_NO_BATCH = object()
_R = TypeVar("_R", bound="StepRecorder")
_STATE_GROUPS = ("params", "buffers", "optimizer")


class StepRecorder:
    """Record hashes and statistics of training steps into ``out_dir`` (see the module docstring).

    Args:
        model: the module being trained; parameters and buffers are named as
            in ``model.named_parameters()`` / ``named_buffers()``.
        out_dir: the run folder. One that already holds a run is refused
            unless ``overwrite=True``.
        optimizer: the ``torch.optim.Optimizer`` stepping ``model`` (default
            None: no ``optimizer`` group, params taken at the block's exit).
        checksums: groups to record, any of ``rngs``, ``batch``, ``params``,
            ``buffers``, ``grads``, ``optimizer`` (default: all).
        stats: statistics per tensor (default ``DEFAULT_STATS``: nan, posinf,
            neginf, zeros, min, max, mean, abs_mean, std); ``"all"`` for every
            one in ``STAT_NAMES``; ``None`` or ``()`` for hashes only (fastest).
        every: record steps 0, N, 2N... (default 1: every step).
        steps: record exactly these step numbers instead of ``every``.
        env_vars: also write the environment variables to ``run.json``
            (default False), secrets redacted unless ``redact_secrets=False``.
        pip_freeze: also write installed packages and versions (default False).
        overwrite: replace a run already in ``out_dir`` (default False).

    Limitations: gradients are seen through hooks on the parameters that
    require grad when the recorder is made; under DDP a hook sees the local
    gradient before the all-reduce. DTensor parameters, gradients and optimizer
    state (FSDP2's ``fully_shard``, tensor parallelism) are recorded whole:
    gathered (``full_tensor()``) with their ``placements``, every rank joining
    the gathers at the optimizer's step (gradients too, then, not in backward),
    so ``tracediff steps`` compares a sharded run against a one-device run
    rank by rank. Each rank writes ``step={k}/rank{r}.json``,
    its rank read when the recorder is made: make it after
    ``torch.distributed.init_process_group``. Hashing runs on the training
    thread (about 1.5 GB/s with SHA-256 on a current CPU core).
    """

    def __init__(
        self,
        model: nn.Module,
        out_dir: str | Path,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        checksums: Collection[str] = frozenset(GROUPS),
        stats: Collection[str] | str | None = DEFAULT_STATS,
        every: int | None = None,
        steps: Iterable[int] | None = None,
        env_vars: bool = False,
        pip_freeze: bool = False,
        redact_secrets: bool = True,
        overwrite: bool = False,
    ) -> None:
        groups = checked_groups(checksums)
        self._stats = checked_stats(stats)
        self._schedule = checked_schedule(every, steps)
        if optimizer is not None and not hasattr(optimizer, "register_step_pre_hook"):
            raise UsageError(f"optimizer={type(optimizer).__name__}: expected a torch.optim.Optimizer "
                             "(torch >= 2.0), which has register_step_pre_hook")
        self._groups = tuple(g for g in groups if g != "optimizer" or optimizer is not None)
        self.out_dir = Path(out_dir)
        self.rank, self.world_size = current_rank(), world_size()
        prepare_out_dir(self.out_dir, rank=self.rank, world=self.world_size, overwrite=overwrite)
        self._model = model
        self._optimizer = optimizer
        self._step = 0
        self._record: dict[str, Any] | None = None
        self._grads: dict[str, dict[str, Any]] = {}
        self._sharded_grads: dict[str, torch.Tensor] = {}  # DTensor gradients not gathered yet, by name
        self._recorded: list[int] = []
        self._failure: TracediffError | None = None
        self._closed = False
        self._handles: list[Any] = []
        self._run: dict[str, Any] = {
            "format": RUN_FORMAT,
            "format_version": FORMAT_VERSION,
            "created": _now(),
            "closed": False,
            "world_size": self.world_size,
            "model_class": _qualname(model),
            "optimizer_class": _qualname(optimizer) if optimizer is not None else None,
            "options": {"checksums": list(self._groups), "stats": list(self._stats), **self._schedule.to_dict(),
                        "hash": HASH_ALGORITHM, "env_vars": env_vars, "pip_freeze": pip_freeze,
                        "redact_secrets": redact_secrets},
            "parameters": [name for name, _ in model.named_parameters()],
            "buffers": [name for name, _ in model.named_buffers()],
            "system": system_info(),
            "environment": environment_variables(redact=redact_secrets) if env_vars else None,
            "packages": installed_packages() if pip_freeze else None,
            "steps_recorded": [],
        }
        if self.rank == 0:
            write_json(self.out_dir / RUN_FILE, self._run)
        # Hooks last: nothing above can leave them behind by raising.
        if "grads" in self._groups:
            for name, param in model.named_parameters():
                if param.requires_grad:
                    self._handles.append(param.register_post_accumulate_grad_hook(partial(self._on_grad, name)))
        if optimizer is not None and set(_STATE_GROUPS) & set(self._groups):
            self._handles.append(optimizer.register_step_pre_hook(self._on_optimizer_step))

    @property
    def step_index(self) -> int:
        """The number of the next (or current) step block; starts at 0, advances at each block's exit."""
        return self._step

    @property
    def in_step(self) -> bool:
        """True between ``begin_step()`` and ``end_step()``."""
        return self._record is not None

    @property
    def recorded_steps(self) -> list[int]:
        """The steps this rank has written so far."""
        return list(self._recorded)

    @contextmanager
    def step(self, batch: Any = _NO_BATCH) -> Iterator[int]:
        """Wrap one training step (forward, backward, ``optimizer.step()``); yields the step number."""
        self.begin_step(batch)
        try:
            yield self._step
        except BaseException as e:
            self.end_step(e)
            raise
        self.end_step()

    def begin_step(self, batch: Any = _NO_BATCH) -> None:
        """Start step ``step_index`` (for loops that cannot use ``with recorder.step(batch)``)."""
        if self._closed:
            raise UsageError(f"{self.out_dir}: the recorder is closed; make a new StepRecorder")
        if self._record is not None:
            raise UsageError(f"{self.out_dir}: step {self._step} is still open; end it before starting another")
        self._record = {} if self._step not in self._schedule or self._failure else self._begin(batch)

    def end_step(self, error: BaseException | None = None) -> None:
        """End the open step (``error``: what interrupted it) and advance ``step_index``."""
        if self._record is None:
            raise UsageError(f"{self.out_dir}: no step is open; call begin_step() first")
        try:
            if self._record:
                self._finish(self._record, error)
        except Exception as e:  # noqa: BLE001 - a recording bug must not end the training run
            warnings.warn(f"tracediff: step {self._step} not recorded: {error_entry(e)['error']}",
                          RuntimeWarning, stacklevel=2)
        finally:
            self._record = None
            self._grads, self._sharded_grads = {}, {}
            self._step += 1

    def close(self) -> None:
        """Remove every hook and mark ``run.json`` closed; raise the write error that stopped recording, if any."""
        if self._closed:
            return
        self._closed = True
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.rank == 0 and self._failure is None:
            self._run.update(closed=True, steps_recorded=list(self._recorded))
            self._write(self.out_dir / RUN_FILE, self._run)
        if self._failure is not None:
            raise self._failure

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is None:
            self.close()
        else:
            try:
                self.close()
            except TracediffError:
                pass  # the training error is the one to report

    def _begin(self, batch: Any) -> dict[str, Any]:
        record: dict[str, Any] = {
            "format_version": FORMAT_VERSION, "step": self._step, "rank": self.rank,
            "world_size": self.world_size, "complete": False, "error": None, "started": _now(),
            "taken_at": {}, "groups": {},
        }
        if "rngs" in self._groups:
            record["groups"]["rngs"] = rng_entries()
            record["taken_at"]["rngs"] = "entry"
        if "batch" in self._groups:
            try:
                structure, entries = (None, {}) if batch is _NO_BATCH else batch_entries(batch, self._stats)
            except Exception as e:  # noqa: BLE001 - an odd batch container must not stop training
                structure, entries = {"value": "batch"}, {"batch": error_entry(e)}
            record["batch_structure"] = structure
            record["groups"]["batch"] = entries
            record["taken_at"]["batch"] = "entry"
        self._write(record_path(self.out_dir, self._step, self.rank), record, make_parent=True)
        return record

    def _on_grad(self, name: str, param: torch.Tensor) -> None:
        if not self._record or param.grad is None:
            return
        if is_dtensor(param.grad):  # gathered later, when every rank is at the same point (_gather_grads)
            self._sharded_grads[name] = param
            return
        self._grads[name] = tensor_entry(param.grad, self._stats)

    def _gather_grads(self) -> None:
        """Record the sharded gradients (FSDP2, TP), gathered in parameter order: the same collectives on every
        rank, outside backward."""
        for name, param in self._model.named_parameters():
            if name in self._sharded_grads and param.grad is not None:
                self._grads[name] = tensor_entry(param.grad, self._stats)
        self._sharded_grads = {}

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        record = self._record
        if record and self._sharded_grads:
            self._gather_grads()
        if record and not any(group in record["taken_at"] for group in _STATE_GROUPS):
            self._take_state(record, "optimizer_pre_step")

    def _take_state(self, record: dict[str, Any], where: str) -> None:
        for group in _STATE_GROUPS:
            if group not in self._groups or group in record["taken_at"]:
                continue
            try:
                record["groups"][group] = self._snapshot(group)
                record["taken_at"][group] = where
            except Exception as e:  # noqa: BLE001 - a hook must never break training
                record.setdefault("recording_errors", []).append(f"{group}: {error_entry(e)['error']}")

    def _snapshot(self, group: str) -> dict[str, Any]:
        if group == "params":
            return {name: tensor_entry(p, self._stats) for name, p in self._model.named_parameters()}
        if group == "buffers":
            return {name: tensor_entry(b, self._stats) for name, b in self._model.named_buffers()}
        assert self._optimizer is not None
        names = {id(p): name for name, p in self._model.named_parameters()}
        return optimizer_snapshot(self._optimizer, names, self._stats)

    def _finish(self, record: dict[str, Any], error: BaseException | None) -> None:
        if self._sharded_grads:
            self._gather_grads()
        self._take_state(record, "exit")
        if "grads" in self._groups:
            order = [n for n, _ in self._model.named_parameters()]
            record["groups"]["grads"] = {n: self._grads[n] for n in order if n in self._grads}
            record["taken_at"]["grads"] = "backward"
        record["groups"] = {g: record["groups"][g] for g in GROUPS if g in record["groups"]}
        for group, content in record["groups"].items():
            record[aggregate_key(group)] = aggregate_hash(group, content)
        record["complete"] = error is None
        if error is not None:
            lines = str(error).splitlines()
            record["error"] = {"type": type(error).__name__, "message": lines[0][:200] if lines else ""}
        self._write(record_path(self.out_dir, self._step, self.rank), record)
        if self._failure is None:
            self._recorded.append(self._step)

    def _write(self, path: Path, obj: dict[str, Any], *, make_parent: bool = False) -> None:
        if self._failure is not None:
            return
        try:
            if make_parent:
                path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, obj, indent=1)
        except (TracediffError, OSError) as e:
            self._failure = e if isinstance(e, TracediffError) else TracediffError(f"{path}: could not write ({e})")
            warnings.warn(f"tracediff: step recording stopped: {self._failure}", RuntimeWarning, stacklevel=3)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _qualname(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"
