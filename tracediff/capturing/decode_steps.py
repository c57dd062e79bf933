"""Decode steps: which forward pass of ``model.generate(...)`` each top-level call belongs to.

Inside ``tracediff.capture(model, out, steps=...)``, ``model.generate`` is
wrapped for the duration of the block. Every top-level call of the model made
while it runs gets ``step`` in the trace: 0 for the prefill, k for the forward
pass that reads the k-th generated token (``docs/trace-format.md``, 2.1)::

    with tracediff.capture(model, "traces/gen", steps=[0, 1, -1]):
        model.generate(input_ids, max_new_tokens=256, do_sample=False)

``steps`` selects the steps whose tensors are written in full; the others keep
their statistics only (``other_steps="stats"``, the default), or nothing but
the call tree, each tensor's shape, dtype, device and element count, and the tokens
(``other_steps="tree"``: no statistics are computed for them, so a long
generation costs little more than the generation). Negative numbers
count from the last step, which is known only once ``generate`` returns: the
payloads of the latest ``max(-k)`` steps are held in memory (copied, as the
payload pipeline copies them) and written when ``generate`` returns, or dropped
once enough later steps have run (with ``other_steps="tree"`` their
statistics are computed only for the steps that are written). Default
(``steps=None``): every step in full.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import format as fmt
from ..errors import TracediffError, UsageError
from ..files.payloads import write_tensor_file
from ..trace.load import parse_shape
from .pipeline import Measure
from .stats import StatsBuffers
from .tokens import ReferenceTokens, StepTokens

_MISSING = object()
OTHER_STEPS = ("stats", "tree")


def check_other_steps(other_steps: str) -> str:
    """``other_steps`` when it is one of ``OTHER_STEPS``; UsageError otherwise."""
    if other_steps not in OTHER_STEPS:
        raise UsageError(f"other_steps={other_steps!r}: expected one of {', '.join(OTHER_STEPS)}")
    return other_steps


def parse_steps(steps: str | Iterable[int] | None) -> tuple[int, ...] | None:
    """``"0,1,-1"`` or ``[0, 1, -1]`` -> ``(0, 1, -1)``; None keeps every step. UsageError for anything else."""
    if steps is None:
        return None
    items: list[Any] = [s.strip() for s in steps.split(",")] if isinstance(steps, str) else list(steps)
    parsed = []
    for item in items:
        try:
            number = int(item) if isinstance(item, str) or type(item) is int else None
        except ValueError:
            number = None
        if number is None:
            raise UsageError(f"steps={steps!r}: expected step numbers such as 0,1,-1 (negative: from the last)")
        parsed.append(number)
    if not parsed:
        raise UsageError(f"steps={steps!r}: expected at least one step number")
    return tuple(dict.fromkeys(parsed))


@dataclass
class _HeldStep:
    """The payloads of a step that may turn out to be among the last ones, kept until that is known."""

    step: int
    node: dict[str, Any]  # the step's top-level call
    measures: bool = False  # statistics deferred to the write (other_steps="tree": a dropped step needs none)
    payloads: list[tuple[Path, torch.Tensor, Measure | None]] = field(default_factory=list)
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    nbytes: int = 0

    def submit(self, path: Path, tensor: torch.Tensor, measure: Measure | None = None) -> int:
        """Stand in for the payload writer: copy the tensor (the model may change it later) and keep it."""
        nbytes = tensor.numel() * tensor.element_size()
        self.payloads.append((path, tensor.detach().clone(), measure))
        self.nbytes += nbytes
        return nbytes

    def after_written(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)


class StepTracker:
    """Numbers the top-level calls made by ``generate`` and switches the encoder between full and statistics.

    ``begin(node)`` is called by the recorder for every top-level call before
    its inputs are encoded. ``fail`` receives a write error of a held payload.
    """

    def __init__(self, model: nn.Module, encoder: Any, selected: tuple[int, ...] | None,
                 fail: Callable[[TracediffError], None], forcing: ReferenceTokens | None = None,
                 others: str = "stats") -> None:
        self.model = model
        self.others = others  # what the steps not selected keep (OTHER_STEPS)
        self.forcing = forcing  # teacher forcing: the reference's tokens, fed to every generation (tokens.py)
        self.nodes: list[dict[str, Any]] = []  # the top-level calls of the current generation, in step order
        self.encoder = encoder
        self.selected = selected
        self.fail = fail
        self.base_mode = encoder.tensors
        self.real_pipeline = encoder.pipeline
        self.recorded = 0  # steps recorded, all generations together
        self.full: list[int] = []  # steps written in full, in the order they were decided
        self._depth = 0
        self._step = 0
        self._window = max((-s for s in selected or () if s < 0), default=0)
        self._held: deque[_HeldStep] = deque()
        self._planned: int | None = None  # forward passes of the current generation, when known in advance
        self._saved: Any = _MISSING
        self._installed = False

    def install(self) -> None:
        """Wrap ``model.generate`` (when the model has one) until ``restore``."""
        generate = getattr(self.model, "generate", None)
        if not callable(generate):
            return
        self._saved = self.model.__dict__.get("generate", _MISSING)
        tracker = self

        @functools.wraps(generate)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            tokens = StepTokens(tracker.nodes, tracker.forcing) if not tracker._depth else None
            if tokens is not None:  # a nested generate (an assistant model) records no tokens of its own
                kwargs = tokens.install(tracker.model, args, kwargs) or kwargs
            tracker._started(planned_forward_passes(tracker.model, kwargs))
            try:
                output = generate(*args, **kwargs)
                if tokens is not None:
                    tokens.finish(output)
                return output
            finally:
                tracker._ended()

        self.model.__dict__["generate"] = wrapped  # an instance attribute, removed by restore()
        self._installed = True

    def restore(self) -> None:
        """Put back ``model.generate`` as it was; write what a generation left held."""
        if self._installed:
            if self._saved is _MISSING:
                self.model.__dict__.pop("generate", None)
            else:
                self.model.__dict__["generate"] = self._saved
            self._installed = False
        while self._depth:
            self._ended()

    @property
    def options(self) -> dict[str, Any] | None:
        """The metadata's ``options.steps``: None when no generation ran."""
        if not self.recorded:
            return None
        return {fmt.STEPS_SELECTED: list(self.selected) if self.selected is not None else None,
                fmt.STEPS_RECORDED: self.recorded, fmt.STEPS_FULL: sorted(self.full), fmt.STEPS_OTHERS: self.others}

    def begin(self, node: dict[str, Any]) -> None:
        """A top-level call starts: give it its step and set how its tensors are recorded."""
        if not self._depth:
            return
        step = self._step
        self._step += 1
        self.recorded += 1
        node[fmt.STEP] = step
        self.nodes.append(node)
        self.encoder.forget_seen()  # never point an entry of this step to another step's payload
        if self.selected is None or step in self.selected or self._last_known(step):
            self._record(full=True, held=None)
            self.full.append(step)
        elif self._window and self._planned is None and self.base_mode != "summary":
            while len(self._held) >= self._window:
                self._drop(self._held.popleft())
            held = _HeldStep(step, node, measures=self.others == "tree")
            self._held.append(held)
            self._record(full=True, held=held)
        else:
            self._record(full=False, held=None)

    def _record(self, *, full: bool, held: _HeldStep | None) -> None:
        self.encoder.tensors = self.base_mode if full else "summary"
        self.encoder.statistics = full or self.others == "stats"
        if self.base_mode == "full":
            self.encoder.pipeline = held if held is not None else self.real_pipeline

    def _last_known(self, step: int) -> bool:
        """Whether ``step`` is selected counting from the last one, when the number of steps is known."""
        return self._planned is not None and any(s < 0 and step == self._planned + s for s in self.selected or ())

    def _started(self, planned: int | None = None) -> None:
        self._depth += 1
        if self._depth == 1:
            self._step = 0
            self._planned = planned
            self.nodes.clear()  # the list the generation's token recorder holds

    def _ended(self) -> None:
        self._depth -= 1
        if self._depth:
            return
        last = self._step - 1
        if self._planned is not None and self._step != self._planned and self._window:
            warnings.warn(f"tracediff: generate made {self._step} forward passes where {self._planned} were "
                          f"planned; the steps selected from the last were written as if the last were step "
                          f"{self._planned - 1} (options.steps.full lists the steps written)", stacklevel=2)
        self._record(full=True, held=None)
        while self._held:
            held = self._held.popleft()
            if held.step - last - 1 in (self.selected or ()):
                self._write(held)
                self.full.append(held.step)
            else:
                self._drop(held)

    def _drop(self, held: _HeldStep) -> None:
        """A step that is not among the last ones: its entries keep their statistics only."""
        tree = self.others == "tree"
        for key in (fmt.INPUTS, fmt.OUTPUTS, fmt.CHILDREN):  # the root's later calls are other steps
            _drop_values(held.node.get(key), tree)
        self.encoder.files -= len(held.payloads)
        self.encoder.payload_bytes -= held.nbytes
        for callback in held.callbacks:  # journal lines of calls whose payloads were not kept
            callback()

    def _write(self, held: _HeldStep) -> None:
        pipeline = self.real_pipeline
        try:
            for path, tensor, measure in held.payloads:
                if pipeline is not None:
                    pipeline.submit(path, tensor, measure)
                else:
                    if measure is not None:
                        measure(tensor, StatsBuffers())
                    write_tensor_file(path, tensor)
        except TracediffError as e:
            self.fail(e)
            return
        for callback in held.callbacks:
            pipeline.after_written(callback) if pipeline is not None else callback()


def _drop_values(value: Any, tree: bool = False) -> None:
    """Remove ``value`` from every tensor entry under ``value`` (a node: its inputs, outputs and children);
    with ``tree``, their statistics too but ``numel`` (never computed: they were deferred to the write)."""
    if isinstance(value, dict):
        if fmt.is_tensor_entry(value):
            value.pop(fmt.VALUE, None)
            if tree:  # as other_steps="tree" writes the entries of a step it knew was left out
                shape = parse_shape(value[fmt.SHAPE])
                value[fmt.STATS] = {"numel": math.prod(shape) if shape is not None else 0}
                for key in fmt.STRING_STAT_KEYS:
                    value.pop(key, None)
            return
        for item in value.values():
            _drop_values(item, tree)
    elif isinstance(value, list):
        for item in value:
            _drop_values(item, tree)


# Options of ``generate`` that can end a generation early, or make more or fewer forward passes than tokens.
_UNPLANNED = ("assistant_model", "prompt_lookup_num_tokens", "stop_strings", "max_time", "prefill_chunk_size")


def planned_forward_passes(model: nn.Module, kwargs: dict[str, Any]) -> int | None:
    """How many forward passes ``model.generate(**kwargs)`` makes, when nothing can end it early: one per
    new token, ``max_new_tokens`` of them, when at least as many are required (``min_new_tokens``) or no
    end-of-sequence token is set; None otherwise (beams, assistants, stop strings, stopping criteria, time
    limits, chunked prefill, ``max_length``), and then the last steps are held until the end is seen."""
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)

    def option(name: str) -> Any:
        return kwargs[name] if name in kwargs else getattr(config, name, None)

    if any(option(name) for name in _UNPLANNED) or len(kwargs.get("stopping_criteria") or ()) or \
            "max_length" in kwargs:  # the configuration's own max_length yields to max_new_tokens
        return None
    new, least = option("max_new_tokens"), option("min_new_tokens") or 0
    if type(new) is not int or new < 1 or (option("num_beams") or 1) != 1:
        return None
    eos = option("eos_token_id")
    if least < new and eos is not None and not (isinstance(eos, (list, tuple)) and not eos):
        return None
    return new
