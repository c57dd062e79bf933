"""B's own forward on A's top-level inputs, recorded as a call tree with statistics and without payloads.

It gives what replay needs from B itself: B's module calls (paths and call
indices, matched to A's nodes exactly as ``align`` matches two traces, on the
same evidence: the statistics of every tensor), the
dtype and device B's own forward gives each input slot, which inputs B's own
calls receive as tensors (to detect inputs that are not equivalent across
implementations, such as a mask that A's attention kernel applied
internally), and B's final output, the baseline for patching.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import format as fmt
from ..capturing.compiled import is_optimized_module, own_name
from ..capturing.signatures import forward_parameters
from ..capturing.stats import tensor_stats
from ..trace.load import Trace
from ..trace.model import Node, TensorRecord
from .inputs import output_slots
from .states import shared_objects, snapshot_states

_PLAIN = (type(None), bool, int, float, str)


@dataclass
class ShadowRun:
    """B's call tree on A's inputs (a payload-free ``Trace``), B's output, or why it could not run."""

    trace: Trace | None
    output: Any = None
    error: str | None = None
    slot_dtypes: dict[tuple[str, int], dict[str, torch.dtype]] = field(default_factory=dict)
    # what each call of B received, by (relative path, call index): replay fills it with A's values
    inputs: dict[tuple[str, int], tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=dict)


def seed_rng(seed: int) -> None:
    """Seed torch's CPU generator (and CUDA's once initialized) before each run, for dropout and friends."""
    torch.default_generator.manual_seed(seed)  # cheaper than torch.manual_seed, which is called per module call
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(seed)


def module_paths(model: nn.Module) -> dict[int, str]:
    """``id(module) -> relative path`` (``""`` for the root; a shared module keeps its first name)."""
    paths: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if not is_optimized_module(module):  # a compiled layer's wrapper: its module is named for it
            paths.setdefault(id(module), own_name(model, name))
    return paths


def _describe_inputs(node: Node, args: tuple[Any, ...], kwargs: dict[str, Any], order: list[int],
                     dtypes: dict[str, torch.dtype], stats: bool) -> None:
    def walk(value: Any, slot: str) -> None:
        if isinstance(value, torch.Tensor):
            node.tensors.append(TensorRecord(slot=slot, order=order[0], shape=tuple(value.shape),
                                             dtype=str(value.dtype), stats=tensor_stats(value) if stats else {}))
            order[0] += 1
            if value.is_floating_point():
                dtypes[slot] = value.dtype
        elif isinstance(value, _PLAIN):
            node.values[slot] = value
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{slot}.{i}")
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{slot}.{key}")

    for i, arg in enumerate(args):
        walk(arg, f"inputs.args.{i}")
    for key, arg in kwargs.items():
        walk(arg, f"inputs.kwargs.{key}")


@contextmanager
def _recording(model: nn.Module, root_name: str, run: ShadowRun, stats: bool) -> Iterator[list[Node]]:
    paths = module_paths(model)
    roots: list[Node] = []
    stack: list[Node] = []
    counts: defaultdict[str, int] = defaultdict(int)
    order = [0]
    seen: dict[int, Any] = {}  # a stateful argument (a KV cache) -> its snapshot, taken when first passed
    shared = shared_objects(model)

    def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        relative = paths.get(id(module), "?")
        call_index = counts[relative]
        counts[relative] += 1
        node = Node(module_path=f"{root_name}.{relative}" if relative else root_name, relative_path=relative,
                    call_index=call_index, module_type=type(module).__name__, depth=len(stack),
                    enter_order=order[0], parent=stack[-1] if stack else None)
        dtypes: dict[str, torch.dtype] = {}
        _describe_inputs(node, args, kwargs, order, dtypes, stats)
        run.slot_dtypes[(relative, call_index)] = dtypes
        run.inputs[(relative, call_index)] = (snapshot_states(args, seen, shared),
                                              snapshot_states(dict(kwargs), seen, shared))
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)

    def post(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if not stack:
            return
        node = stack.pop()
        node.has_outputs = True
        for slot, tensor in output_slots(output):
            node.tensors.append(TensorRecord(slot=slot, order=order[0], shape=tuple(tensor.shape),
                                             dtype=str(tensor.dtype), stats=tensor_stats(tensor) if stats else {}))
            order[0] += 1
        node.exit_order = order[0]

    handles = []
    try:
        for module in model.modules():
            if is_optimized_module(module):  # the wrapper runs its module, which is recorded
                continue
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(module.register_forward_hook(post, with_kwargs=True))
        yield roots
    finally:
        for handle in handles:
            handle.remove()


def shadow_run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, seed: int,
               stats: bool = True) -> ShadowRun:
    """Run ``model(*args, **kwargs)`` once under ``no_grad`` and record its call tree (with each tensor's
    statistics unless ``stats`` is False); never raises."""
    root_name = type(model).__name__
    run = ShadowRun(trace=None)
    try:
        with _recording(model, root_name, run, stats) as roots, torch.no_grad():
            seed_rng(seed)
            run.output = model(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the port's code; reported, then replay matches by name
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        run.error = f"{type(e).__name__}: {first}"
        return run
    run.trace = Trace(directory=Path("."), json_path=Path(f"<{root_name}>"), roots=roots,
                      metadata={fmt.FORWARD_PARAMETERS: forward_parameters(model)})
    return run
