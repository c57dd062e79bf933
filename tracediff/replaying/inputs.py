"""Rebuilding a recorded call's inputs, and walking a module's outputs by slot.

A node of the trace holds its inputs flattened: tensors as records with a
slot (``inputs.args.0``, ``inputs.kwargs.position_embeddings.1``) and
non-tensor values typed (``inputs.kwargs.use_cache`` -> ``False``). They are
put back into ``(args, kwargs)``: numbered levels become tuples (the trace
does not say whether a container was a list or a tuple), named levels become
dicts. Tensors are read from their payloads and cast to the dtype B's own
forward gave that slot (or B's module's parameters' dtype), then moved to
B's device; integer and bool tensors keep their dtype.

A value the trace knows only by its repr (a transformers ``DynamicCache``, a
config, an arbitrary object) is rebuilt the way B's own forward builds it:
with ``own``, what B's forward passed the same call (the shadow run on A's
top-level inputs, :mod:`.shadow`), the value at the same slot is taken, a
stateful one (a KV cache) as a fresh copy of what it held when B's forward
first passed it (:mod:`.states`). On a trace of ``model(input_ids=ids)``
each layer's cache is then the empty cache B's forward made, as A's was: a
prefill's layer attends over its own keys and values only. Without such a
value, a tensor without payload (SUMMARY or ``repr`` traces, or a payload a
later call overwrote in the standard trace), or a missing position raises
``NotRebuildable`` with the reason; the call is then listed as skipped.
For the top-level call, :func:`fresh_caches` leaves a cache passed in for a
prefill to B's forward (``None`` in its place: B builds its own).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import TracediffError
from ..trace.load import Trace
from ..trace.model import Node, ReprValue, TensorRecord
from .states import Snapshot

_LITERAL_REPR_LIMIT = 200
Loader = Callable[[TensorRecord], torch.Tensor]
Inputs = tuple[tuple[Any, ...], dict[str, Any]]


class NotRebuildable(Exception):
    """A recorded value cannot be turned back into what the module was given."""


@dataclasses.dataclass(frozen=True)
class Target:
    """Where and in which dtype a rebuilt floating tensor goes; ``slot_dtypes`` are B's own, by slot."""

    device: torch.device
    dtype: torch.dtype | None
    slot_dtypes: dict[str, torch.dtype] = dataclasses.field(default_factory=dict)

    def floating_dtype(self, slot: str) -> torch.dtype | None:
        return self.slot_dtypes.get(slot, self.dtype)


def _literal(value: ReprValue, slot: str) -> Any:
    """A plain literal (None, bool, number, string) written as a repr by the standard trace."""
    text = str(value).strip()
    if len(text) <= _LITERAL_REPR_LIMIT:
        try:
            parsed = ast.literal_eval(text)  # literals only: never evaluates code
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            parsed = ReprValue
        if parsed is None or isinstance(parsed, (bool, int, float, str)):
            return parsed
    raise NotRebuildable(f"{slot} is known only by its repr ({_shown(text)})")


def fresh_caches(trace: Trace, root: Node) -> Inputs | None:
    """For a top-level call: ``None`` in place of each KV cache A's trace knows only by its repr (a
    ``DynamicCache`` passed in by hand, or by ``generate``), when A's call was a prefill, as ``own`` for
    :func:`rebuild_inputs`; ``None`` when there is no such cache or no evidence of a prefill.

    The evidence is the first ``position_ids`` or ``cache_position`` tensor recorded inside the call: when
    each of its rows starts at 0, the cache held no earlier step, and B's forward, given none, builds the
    empty cache A's started from. A cache that held earlier steps is left unrebuildable."""
    names = [slot.split(".", 2)[2] for slot, value in root.values.items()
             if slot.startswith("inputs.kwargs.") and slot.count(".") == 2
             and isinstance(value, ReprValue) and _CACHE_REPR.match(str(value))]
    if not names or not _starts_at_zero(trace, root):
        return None
    return (), dict.fromkeys(names)


_CACHE_REPR = re.compile(r"\w*Cache\(")
_POSITIONS = (".position_ids", ".cache_position")


def _starts_at_zero(trace: Trace, root: Node) -> bool:
    for node in root.walk():
        for record in node.inputs():
            if record.slot.endswith(_POSITIONS) and record.has_payload and record.stale_reason is None:
                try:
                    positions = trace.load(record)
                except TracediffError:
                    return False
                if positions.numel() == 0 or positions.is_floating_point():
                    return False
                rows = positions.reshape(-1, positions.shape[-1]) if positions.dim() else positions.reshape(1, 1)
                return bool((rows.min(dim=-1).values == 0).all())
    return False


def _repr_value(value: ReprValue, slot: str, own: Inputs | None, target: Target) -> Any:
    """A literal written as a repr, else B's own value at ``slot`` (a fresh copy of a stateful one)."""
    try:
        return _literal(value, slot)
    except NotRebuildable:
        found, mine = _at_slot(own, slot)
        if not found:
            raise
    if isinstance(mine, Snapshot):
        return mine.copy(target.dtype, target.device)
    if isinstance(mine, (torch.Tensor, list, tuple, dict)):  # B passes a value A did not: not the same argument
        raise NotRebuildable(f"{slot} is known only by its repr ({_shown(str(value))}), and B passes a "
                             f"{type(mine).__name__} there")
    return mine


def _at_slot(own: Inputs | None, slot: str) -> tuple[bool, Any]:
    """``(True, value)`` at ``slot`` of ``own`` (``inputs.kwargs.cache``, ``inputs.args.1.0``), else
    ``(False, None)``."""
    if own is None:
        return False, None
    parts = slot.split(".")
    if len(parts) < 3 or parts[1] not in ("args", "kwargs"):
        return False, None
    level: Any = own[0] if parts[1] == "args" else own[1]
    for part in parts[2:]:
        if isinstance(level, dict) and part in level:
            level = level[part]
        elif isinstance(level, (list, tuple)) and part.isdigit() and int(part) < len(level):
            level = level[int(part)]
        else:
            return False, None
    return True, level


def _shown(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _load(trace: Trace, record: TensorRecord, load: Loader | None) -> torch.Tensor:
    if record.stale_reason is not None:
        raise NotRebuildable(f"{record.slot}: {record.stale_reason}")
    if record.payload is None:
        kind = "repr lines" if record.repr_lines is not None else "statistics"
        raise NotRebuildable(f"{record.slot} has no payload in A's trace (only {kind})")
    try:
        return (load or trace.load)(record)
    except TracediffError as e:
        raise NotRebuildable(f"{record.slot}: {e}") from None


def cast(tensor: torch.Tensor, dtype: torch.dtype | None, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``; a floating tensor in ``dtype``, finite values saturating instead of overflowing.

    A float32 attention mask holds ``finfo(float32).min``; a plain cast to
    float16 turns it into ``-inf`` and a fully masked row into NaN, which is
    an artefact of the cast, not of the module under test.
    """
    if tensor.is_floating_point() and dtype is not None and dtype.is_floating_point and dtype != tensor.dtype:
        limit = torch.finfo(dtype).max
        if torch.finfo(tensor.dtype).max > limit:
            tensor = torch.where(torch.isfinite(tensor), tensor.clamp(-limit, limit), tensor)
        tensor = tensor.to(dtype)
    # A fresh, aligned allocation on the target device (payloads are memory-mapped).
    return tensor.to(device, copy=True)


def rebuild_inputs(trace: Trace, node: Node, target: Target, *, load: Loader | None = None,
                   own: Inputs | None = None) -> Inputs:
    """``(args, kwargs)`` of ``node``'s call, from A's payloads and typed values; a value known only by its
    repr from ``own`` (what B's own forward passed this call), when it holds one at that slot."""
    tree: dict[str, Any] = {}
    for record in node.inputs():
        tensor = _load(trace, record, load)
        dtype = target.floating_dtype(record.slot) if tensor.is_floating_point() else None
        _put(tree, record.slot, cast(tensor, dtype, target.device))
    for slot, value in node.values.items():
        if slot == "inputs" or slot.startswith("inputs."):
            _put(tree, slot, _repr_value(value, slot, own, target) if isinstance(value, ReprValue) else value)
    root = tree.get("inputs", {})
    if not isinstance(root, dict):
        raise NotRebuildable("the inputs are not recorded as args and kwargs")
    args = _assemble(root["args"], "inputs.args") if root.get("args") else ()
    kwargs = root.get("kwargs") or {}
    if not isinstance(args, tuple) or not isinstance(kwargs, dict):
        raise NotRebuildable("the inputs are not recorded as positional and keyword arguments")
    return args, {key: _assemble(value, f"inputs.kwargs.{key}") for key, value in kwargs.items()}


def _put(tree: dict[str, Any], slot: str, value: Any) -> None:
    parts = slot.split(".")
    level = tree
    for part in parts[:-1]:
        child = level.setdefault(part, {})
        if not isinstance(child, dict):
            raise NotRebuildable(f"{slot} nests inside a recorded value")
        level = child
    level[parts[-1]] = value


def _assemble(level: Any, where: str) -> Any:
    """Numbered levels become tuples (checked for gaps), named levels dicts."""
    if not isinstance(level, dict) or (dataclasses.is_dataclass(level)):
        return level
    if level and all(key.isdigit() for key in level):
        size = max(int(key) for key in level) + 1
        missing = [i for i in range(size) if str(i) not in level]
        if missing:
            raise NotRebuildable(f"{where}.{missing[0]} is not recorded")
        return tuple(_assemble(level[str(i)], f"{where}.{i}") for i in range(size))
    return {key: _assemble(item, f"{where}.{key}") for key, item in level.items()}


def output_slots(value: Any, slot: str = "outputs") -> Iterator[tuple[str, Any]]:
    """``(slot, tensor)`` for every tensor of a module's output, named as the trace names them."""
    if isinstance(value, torch.Tensor):
        yield slot, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from output_slots(item, f"{slot}.{i}")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from output_slots(item, f"{slot}.{key}")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from output_slots(getattr(value, f.name), f"{slot}.{f.name}")


def substitute(value: Any, replacement: Callable[[str, torch.Tensor], torch.Tensor], slot: str = "outputs") -> Any:
    """``value`` with each tensor replaced by ``replacement(slot, tensor)``; containers keep their types."""
    if isinstance(value, torch.Tensor):
        return replacement(slot, value)
    if isinstance(value, dict):
        out = value.copy()  # a ModelOutput stays a ModelOutput (item and attribute both updated)
        for key, item in value.items():
            out[key] = substitute(item, replacement, f"{slot}.{key}")
        return out
    if isinstance(value, list):
        return [substitute(item, replacement, f"{slot}.{i}") for i, item in enumerate(value)]
    if isinstance(value, tuple):
        items = [substitute(item, replacement, f"{slot}.{i}") for i, item in enumerate(value)]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: substitute(getattr(value, f.name), replacement, f"{slot}.{f.name}")
                   for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value
