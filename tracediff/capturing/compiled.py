"""Capturing a model that runs under ``torch.compile``.

Every way a model is compiled is captured, with the model's own module paths:

* ``torch.compile(model)``: the ``OptimizedModule`` it returns is captured as the model it wraps
  (``uncompiled``), so no path carries ``_orig_mod``;
* ``model.compile()``, and regional compilation (``layer.compile()`` for each decoder layer, or a layer
  replaced by ``torch.compile(layer)``: ``own_modules`` skips the wrapper);
* a model compiled inside the capture block.

How values are taken. When Dynamo traces a patched ``forward`` (:mod:`._patch`), the call is recorded from
inside the graph by the opaque op ``tracediff::record`` (:mod:`.record_op`), never by tracediff's Python
code, which Dynamo therefore never traces: no graph break is added, the graph is the one Dynamo builds for
the model, and the recorded tensors are the ones the compiled code computed. The records are chained by a
data dependency, so the compiler keeps them in program order (inductor's default reordering moved records
chained by an effect token alone); one that still cannot be placed is counted in the metadata's
``unrecorded_calls`` and the capture is incomplete, never a shorter tree called complete.

What may still differ from an uncaptured compiled run: every recorded module output is materialised in
memory, so a value inductor would have kept in registers inside a fused kernel is stored in its dtype
first. In float32 a store rounds nothing, though the kernels around it may be fused otherwise (float32
rounding: bit-identical logits on some stock models, 1e-7 apart on others); in bfloat16 or float16 a
consumer fused with its producer may then read the rounded value where it would have used the float32
one. docs/compiled.md gives the measurements.

``CompileWatch`` notes the compiled regions and Dynamo's counters around a capture, for the trace metadata's
``compile`` object: how the capture changed the compilation (graphs compiled, graph breaks and their
reasons, recompilations while capturing).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from .. import format as fmt
from ..errors import UsageError

#: How the metadata names the way values of compiled regions are recorded, by ``compiled`` mode.
RECORDING = {"modules": "in-graph op tracediff::record", "regions": "at compiled region calls, from outside"}
TORCH_COMPILE = "torch.compile"
MODULE_COMPILE = "Module.compile"
FORWARD_COMPILE = "torch.compile(forward)"  # module.forward = torch.compile(module.forward), as for generate


def is_optimized_module(value: Any) -> bool:
    """True for the ``OptimizedModule`` that ``torch.compile(module)`` returns (never imports Dynamo)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    return isinstance(optimized, type) and isinstance(value, optimized)


def uncompiled(model: Any) -> Any:
    """The module an ``OptimizedModule`` wraps (through any number of them); any other model as it is."""
    while is_optimized_module(model):
        model = model._orig_mod
    return model


#: The ways a capture takes the values of compiled code (``capture(compiled=...)``).
MODULES = "modules"
REGIONS = "regions"
COMPILED_MODES = (MODULES, REGIONS)
FORWARD = "forward"
COMPILED_CALL = "_compiled_call_impl"  # what Module.__call__ runs after module.compile()


def own_modules(model: Any) -> Iterator[tuple[str, Any]]:
    """``named_modules()`` of ``model`` without the ``OptimizedModule`` wrappers a regional compilation put in.

    A submodule replaced by ``torch.compile(layer)`` is reported as ``layer`` at the wrapper's name: the
    ``_orig_mod`` step of its path is dropped, and the wrapper itself (whose ``forward`` is Dynamo's) is
    skipped, so each module has one path, the one it has without compilation.
    """
    for name, module in model.named_modules():
        if is_optimized_module(module):
            continue
        yield own_name(model, name), module


def patch_plan(model: Any, *, regions_only: bool) -> list[tuple[str, Any, str]]:
    """``(own name, object, attribute)`` for each callable a capture wraps.

    Every module's ``forward`` (``regions_only=False``). With ``regions_only``, a compiled region is wrapped
    where its compiled code is entered, from outside (the ``forward`` of a ``torch.compile(layer)`` wrapper,
    the ``_compiled_call_impl`` that ``layer.compile()`` set), and nothing inside it is touched: the
    compiled code that runs is the one compiled before the capture, with no recompilation.
    """
    if not regions_only:
        return [(name, module, FORWARD) for name, module in own_modules(model)]
    plan: list[tuple[str, Any, str]] = []
    inside: list[str] = []  # names of regions met so far: their descendants are not wrapped
    for name, module in model.named_modules():
        if any(name.startswith(region + ".") or not region for region in inside):
            continue
        own = own_name(model, name)
        if is_optimized_module(module):
            plan.append((own, module, FORWARD))
            inside.append(name)
        elif module.__dict__.get(COMPILED_CALL) is not None:
            plan.append((own, module, COMPILED_CALL))
            inside.append(name)
        elif _compiled_forward(module):
            plan.append((own, module, FORWARD))
            inside.append(name)
        else:
            plan.append((own, module, FORWARD))
    return plan


def own_name(model: Any, name: str) -> str:
    """``name`` (a path of ``named_modules()``) without the ``_orig_mod`` steps of compiled wrappers."""
    if "_orig_mod" not in name:
        return name
    kept: list[str] = []
    current = model
    for part in name.split("."):
        wrapper = is_optimized_module(current)
        current = getattr(current, part)
        if not (wrapper and part == "_orig_mod"):
            kept.append(part)
    return ".".join(kept)


def compiled_regions(model: Any, root_name: str, *, root_compiled: bool) -> list[dict[str, str]]:
    """The compiled modules of ``model``: ``{"module_path": ..., "how": "torch.compile" | "Module.compile"}``."""
    regions = [{fmt.MODULE_PATH: root_name, "how": TORCH_COMPILE}] if root_compiled else []
    for name, module in model.named_modules():
        own = own_name(model, name)
        path = f"{root_name}.{own}" if own else root_name
        if is_optimized_module(module):
            regions.append({fmt.MODULE_PATH: path, "how": TORCH_COMPILE})
        elif module.__dict__.get(COMPILED_CALL) is not None:
            regions.append({fmt.MODULE_PATH: path, "how": MODULE_COMPILE})
        elif _compiled_forward(module):
            regions.append({fmt.MODULE_PATH: path, "how": FORWARD_COMPILE})
    return regions


def _compiled_forward(module: Any) -> bool:
    """True when the module's own ``forward`` attribute is a function ``torch.compile`` returned."""
    forward = module.__dict__.get(FORWARD)
    return forward is not None and getattr(forward, "_torchdynamo_orig_callable", None) is not None


def _walkable(model: Any) -> bool:
    """True for a model whose modules can be walked (``modules()`` and ``named_modules()``, as a torch module's);
    which runtime a model is, is its adapter's question (``capturing/adapters``), not this module's."""
    return callable(getattr(model, "modules", None)) and callable(getattr(model, "named_modules", None))


def has_compiled_region(model: Any) -> bool:
    """True when a module of ``model`` is compiled (``torch.compile(layer)``, ``layer.compile()``, a compiled
    ``forward``)."""
    return _walkable(model) and any(
        is_optimized_module(module) or module.__dict__.get(COMPILED_CALL) is not None or _compiled_forward(module)
        for module in model.modules())


def _dynamo_counters() -> dict[str, Counter[str]] | None:
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return None
    return {section: Counter(counters[section]) for section in ("stats", "graph_break", "frames")}


def _compilations_since(start_us: int) -> list[dict[str, Any]]:
    """Dynamo's record of each frame it compiled since ``start_us`` (its last 64 at most)."""
    utils = sys.modules.get("torch._dynamo.utils")
    metrics = getattr(utils, "get_compilation_metrics", None)
    if metrics is None:
        return []
    events = []
    for event in metrics():
        if (getattr(event, "start_time_us", None) or 0) < start_us:
            continue
        events.append({"compile_id": event.compile_id, "function": event.co_name,
                       "recompile_reason": event.recompile_reason, "failure": event.fail_reason,
                       "graph_ops": event.graph_op_count})
    return events


class CompileWatch:
    """What a capture knows of compilation: the compiled regions and Dynamo's activity while it ran.

    ``CompileWatch(model, mode)`` is made before anything is patched, with ``mode`` one of ``COMPILED_MODES``
    (checked with the capture's other options: :mod:`.options`); ``model`` is then the module to patch (an
    ``OptimizedModule``'s own). ``metadata(root_name)`` is called once the capture has ended. Dynamo is never
    imported here: a process that has not imported it has compiled nothing yet.
    """

    def __init__(self, model: Any, mode: str = MODULES) -> None:
        self.mode = mode
        self.root_compiled = is_optimized_module(model)
        self.model = uncompiled(model)
        if mode == REGIONS and (self.root_compiled or not has_compiled_region(self.model)):
            what = "is compiled as a whole (torch.compile(model))" if self.root_compiled else "has no compiled region"
            raise UsageError(f"compiled='regions': the model {what}; it records the calls of regions compiled "
                             f"inside the model (layer.compile() or torch.compile(layer)): use compiled='modules'")
        self._before = _dynamo_counters()
        self._start_us = time.time_ns() // 1000

    def metadata(self, root_name: str) -> dict[str, Any] | None:
        """The metadata's ``compile`` object, or None when nothing was compiled and nothing compiled ran."""
        regions = compiled_regions(self.model, root_name, root_compiled=self.root_compiled) \
            if _walkable(self.model) else []
        after = _dynamo_counters()
        during = None
        if after is not None:
            before = self._before or {section: Counter() for section in after}
            delta = {section: after[section] - before[section] for section in after}
            compilations = _compilations_since(self._start_us)
            during = {
                "frames_compiled": delta["frames"]["total"],
                "graphs": delta["stats"]["unique_graphs"],
                "graph_breaks": sum(delta["graph_break"].values()),
                "graph_break_reasons": {reason[:300]: n for reason, n in sorted(delta["graph_break"].items())},
                "recompiles": sum(1 for event in compilations if event["recompile_reason"]),
                "compilations": compilations,
            }
        if not regions and not (during and during["frames_compiled"]):
            return None
        return {fmt.COMPILE_REGIONS: regions, fmt.COMPILE_RECORDING: RECORDING[self.mode], fmt.COMPILE_DURING: during}
