"""The JAX adapter: Flax NNX modules, fed to the same recorder as torch's and MLX's.

A Flax NNX module (``flax.nnx.Module``) is called through its class's ``__call__``, as an MLX module is:
``NnxCallPatch`` wraps it on each class the model uses (:mod:`tracediff.capturing.class_call`), under the
dotted path of ``nnx.iter_modules`` (``layers.0.linear``). Arrays are waited for
(``block_until_ready``) and copied to the host where they are recorded; bfloat16 keeps its bits. Calls
inside ``jax.jit`` or ``nnx.jit`` see tracers, not values: those are recorded as their ``repr``, so capture
an eager forward. Flax Linen modules (``flax.linen``) are not supported: their calls go through
``nn.Module.__call__`` machinery of their own (method interception would be the way in).

``tracediff capture`` takes an NNX model from a SPEC; ``--dtype`` and ``--device`` are refused for it (cast
the model in the SPEC's function), and an inputs file's tensors become JAX arrays of the example's dtype.

jax and flax are never imported here: a model is an NNX module only if the process has imported
``flax.nnx`` already (it made the model).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ...files.host import host_array, host_tensor
from ..class_call import ClassCallPatch, HostCopies, module_paths, replace_arrays
from ..observer import CallObserver
from ..signatures import forward_parameters
from .base import AdapterBase, Installed, Recorder

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


def jax_host_copy(array: Any) -> torch.Tensor:
    """A concrete JAX array, waited for, as a CPU tensor (bfloat16 by its bits); raises for a tracer."""
    return host_tensor(np.asarray(array.block_until_ready()), copy=True)  # ml_dtypes' bfloat16 by its bits


class NnxCallPatch(ClassCallPatch):
    """Wraps ``__call__`` of every class a Flax NNX ``model`` uses; undone by ``restore()``."""

    def __init__(self, model: Any, observer: CallObserver, *, root_name: str) -> None:
        array = sys.modules["jax"].Array
        host = HostCopies(jax_host_copy)
        super().__init__(module_paths(nnx_modules(model), root_name), observer,
                         lambda value: replace_arrays(value, array, host))


def is_jax_array(value: Any) -> bool:
    """True when ``value`` is a ``jax.Array`` (without importing jax)."""
    array_type = getattr(sys.modules.get("jax"), "Array", None)
    return isinstance(array_type, type) and isinstance(value, array_type)


def jax_host(value: Any) -> Any:
    """``value`` with every JAX array (nested in lists, tuples and dicts too) as a CPU tensor."""
    return replace_arrays(value, sys.modules["jax"].Array, HostCopies(jax_host_copy))


def to_jax(tensor: torch.Tensor, like: Any = None) -> Any:
    """A CPU tensor as a JAX array (bfloat16 by its bits), of ``like``'s dtype when given."""
    jnp = sys.modules["jax.numpy"]
    host = tensor.detach().cpu().contiguous()
    if host.dtype == torch.bfloat16:
        array = jnp.asarray(host_array(host).view(jnp.bfloat16))  # ml_dtypes' bfloat16
    else:
        array = jnp.asarray(host.numpy())
    return array.astype(like.dtype) if like is not None and hasattr(like, "dtype") else array


class NnxAdapter(AdapterBase):
    """Flax NNX models (``flax.nnx.Module``): module calls through their classes' ``__call__``."""

    framework = FRAMEWORK
    models = "Flax NNX"
    supported_options: frozenset[str] = frozenset()

    def recognises(self, model: Any) -> bool:
        return is_nnx_module(model)

    def version(self) -> str | None:
        return jax_version()

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> Installed:
        return NnxCallPatch(model, recorder.observer, root_name=recorder.model_name)

    def host(self, value: Any) -> Any:
        return jax_host(value) if "jax" in sys.modules else value

    def metadata(self, model: Any) -> dict[str, Any]:
        modules = [module for _, module in nnx_modules(model)]
        return {"forward_parameters": forward_parameters(modules, method="__call__")}

    def is_array(self, value: Any) -> bool:
        return is_jax_array(value)

    def from_host(self, tensor: torch.Tensor, like: Any) -> Any:
        return to_jax(tensor, like=like)
