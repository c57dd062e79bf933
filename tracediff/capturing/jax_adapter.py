"""The JAX adapter: Flax NNX modules, fed to the same recorder as torch's and MLX's.

A Flax NNX module (``flax.nnx.Module``) is called through its class's ``__call__``, as an MLX module is:
``NnxCallPatch`` wraps it on each class the model uses (:mod:`tracediff.capturing.class_call`), under the
dotted path of ``nnx.iter_modules`` (``layers.0.linear``). Arrays are waited for
(``block_until_ready``) and copied to the host where they are recorded; bfloat16 keeps its bits. Calls
inside ``jax.jit`` or ``nnx.jit`` see tracers, not values: those are recorded as their ``repr``, so capture
an eager forward. Flax Linen modules (``flax.linen``) are not supported: their calls go through
``nn.Module.__call__`` machinery of their own (method interception would be the way in).

jax and flax are never imported here: a model is an NNX module only if the process has imported
``flax.nnx`` already (it made the model).
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any

import numpy as np
import torch

from ._patch import CallObserver
from .class_call import ClassCallPatch, module_paths, replace_arrays

FRAMEWORK = "jax"


def is_nnx_module(model: Any) -> bool:
    """True when ``model`` is a ``flax.nnx.Module`` (without importing flax)."""
    module_type = getattr(sys.modules.get("flax.nnx"), "Module", None)
    return isinstance(module_type, type) and isinstance(model, module_type)


def jax_version() -> str | None:
    """The version of the imported jax, or None."""
    return getattr(sys.modules.get("jax"), "__version__", None)


def nnx_modules(model: Any) -> list[tuple[str, Any]]:
    """``(dotted name, module)`` of every module of ``model``, the root as ``""``."""
    nnx = sys.modules["flax.nnx"]
    return [(".".join(str(part) for part in path), module) for path, module in nnx.iter_modules(model)]


class JaxHost:
    """Host copies of JAX arrays as CPU tensors, one copy per living array."""

    def __init__(self) -> None:
        self._array = sys.modules["jax"].Array
        self._copies: dict[int, tuple[Any, torch.Tensor]] = {}

    def convert(self, value: Any) -> Any:
        """``value`` with every concrete array (nested in lists, tuples and dicts too) replaced by its host copy."""
        return replace_arrays(value, self._array, self._host)

    def _host(self, array: Any) -> Any:
        key = id(array)
        held = self._copies.get(key)
        if held is not None and held[0]() is array:
            return held[1]
        try:
            values = np.asarray(array.block_until_ready())
            if values.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: its bits, read as torch's
                tensor = torch.from_numpy(values.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
            else:
                tensor = torch.from_numpy(np.array(values))
        except Exception:  # noqa: BLE001 - a tracer inside jit, or a dtype torch cannot hold: its repr
            return array
        def forget(_ref: Any, key: int = key) -> None:
            self._copies.pop(key, None)

        try:
            ref: Any = weakref.ref(array, forget)
        except TypeError:  # an array type without weak references: kept for the capture
            ref = functools.partial(_same, array)
        self._copies[key] = (ref, tensor)
        return tensor


def _same(value: Any) -> Any:
    return value


class NnxCallPatch(ClassCallPatch):
    """Wraps ``__call__`` of every class a Flax NNX ``model`` uses; undone by ``restore()``."""

    def __init__(self, model: Any, observer: CallObserver, *, root_name: str) -> None:
        super().__init__(module_paths(nnx_modules(model), root_name), observer, JaxHost().convert)
