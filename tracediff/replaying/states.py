"""Stateful arguments of B's calls (a KV cache), kept as B's own forward first passed them.

Replay calls B's module in B's own argument layout with what the shadow run saw (:mod:`.layout`). A tensor
there is a value; an object that is neither a tensor, a plain value nor a container is usually state the
call writes into: transformers' ``DynamicCache`` appends each call's keys and values. Passed as it is, the
object B's forward left behind holds every layer's keys already, each run appends more (the next run sees
twice the keys, a float64 run leaves float64 keys that a float32 run then meets in its attention), and the
float64 run reads float32 tensors out of it.

So the shadow run keeps a deep copy of each such object as it was when a call first received it (once per
object: a per-layer cache is, for each layer's calls, what it was when the forward started), and every
run of a call gets a fresh copy of that, its floating tensors in the run's dtype (float64 for the oracle).
B's modules, parameters and buffers held by such an object are referenced, never copied. An object that
cannot be copied is passed as it is.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)
_NOT_STATE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, nn.Module)


class Snapshot:
    """A stateful argument as B's forward first passed it; :meth:`copy` gives each run its own."""

    __slots__ = ("_value", "_shared")

    def __init__(self, value: Any, shared: Mapping[int, Any]) -> None:
        self._value = value
        self._shared = shared

    def copy(self, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Any:
        """A fresh deep copy; with ``dtype``, its floating tensors in that dtype (and on ``device``)."""
        copied = copy.deepcopy(self._value, dict(self._shared))
        if dtype is not None or device is not None:
            _cast_held(copied, dtype, device, set())
        return copied


def shared_objects(model: nn.Module) -> dict[int, Any]:
    """B's modules, parameters and buffers by ``id``: a deep copy's memo, so that a copy references them."""
    held: dict[int, Any] = {}
    for module in model.modules():
        held[id(module)] = module
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            held[id(tensor)] = tensor
    return held


def snapshot_states(value: Any, seen: dict[int, Any], shared: Mapping[int, Any]) -> Any:
    """``value`` (a call's args or kwargs) with each stateful object in it replaced by its :class:`Snapshot`,
    taken the first time it is seen (``seen``: by ``id``, across the calls of one forward)."""
    if isinstance(value, torch.Tensor) or isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list, dict)):
        return _map_items(value, lambda item: snapshot_states(item, seen, shared))
    if isinstance(value, _NOT_STATE) or id(value) in shared or not hasattr(value, "__dict__") or \
            dataclasses.is_dataclass(value):  # a dataclass of tensors is a value (a ModelOutput-like record)
        return value
    if id(value) not in seen:
        try:
            seen[id(value)] = Snapshot(copy.deepcopy(value, dict(shared)), shared)
        except Exception:  # noqa: BLE001 - an object that cannot be copied is passed as it is
            seen[id(value)] = value
    return seen[id(value)]


def holds_state(value: Any) -> bool:
    """Does ``value`` (a call's args or kwargs) hold a :class:`Snapshot`: an argument A's trace cannot hold?"""
    if isinstance(value, Snapshot):
        return True
    if isinstance(value, (tuple, list)):
        return any(holds_state(item) for item in value)
    if isinstance(value, dict):
        return any(holds_state(item) for item in value.values())
    return False


def fresh_states(value: Any, dtype: torch.dtype | None = None, device: torch.device | None = None) -> Any:
    """``value`` with every :class:`Snapshot` in it replaced by a fresh copy (see :meth:`Snapshot.copy`)."""
    if isinstance(value, Snapshot):
        return value.copy(dtype, device)
    if isinstance(value, (tuple, list, dict)):
        return _map_items(value, lambda item: fresh_states(item, dtype, device))
    return value


def _map_items(value: tuple | list | dict, change: Callable[[Any], Any]) -> Any:
    """``value`` with ``change`` applied to each item; ``value`` itself when no item changed (a named tuple and
    a ``ModelOutput`` keep their type)."""
    if isinstance(value, dict):
        changed = {key: change(item) for key, item in value.items()}
        if all(changed[key] is value[key] for key in value):
            return value
        out = value.copy()  # a ModelOutput stays one
        out.update(changed)
        return out
    items = [change(item) for item in value]
    if all(x is y for x, y in zip(items, value)):
        return value
    return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)


def _cast_held(value: Any, dtype: torch.dtype | None, device: torch.device | None, seen: set[int]) -> Any:
    """``value`` with the floating tensors it holds (attributes, items) in ``dtype`` and every tensor on
    ``device``; containers and objects changed in place where they can be, rebuilt where they cannot."""
    if isinstance(value, torch.Tensor):
        wanted = dtype if dtype is not None and value.is_floating_point() else None
        return value.to(device=device, dtype=wanted) if wanted is not None or device is not None else value
    if isinstance(value, _PLAIN) or isinstance(value, _NOT_STATE) or id(value) in seen:
        return value
    seen.add(id(value))
    if isinstance(value, list):
        value[:] = [_cast_held(item, dtype, device, seen) for item in value]
    elif isinstance(value, tuple):
        items = [_cast_held(item, dtype, device, seen) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    elif isinstance(value, dict):
        for key in list(value):
            value[key] = _cast_held(value[key], dtype, device, seen)
    elif hasattr(value, "__dict__"):
        for name, item in list(vars(value).items()):
            cast = _cast_held(item, dtype, device, seen)
            if cast is not item:
                object.__setattr__(value, name, cast)
    return value
