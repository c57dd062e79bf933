"""The MLX adapter: every ``mlx.nn.Module`` call of a model, fed to the same recorder as torch's.

An MLX module is called through its class's ``__call__`` (Python looks dunder methods up on the type, so
an instance attribute would never be called). For the duration of a capture, ``MlxCallPatch`` wraps
``__call__`` on each class the model uses (:mod:`tracediff.capturing.class_call`); the wrapper reports
only calls of the model's own instances, under the dotted path ``named_modules()`` gives them, and passes
every other call (another model's module, a subclass's ``super().__call__``) straight through.
``restore()`` puts back exactly what each class had in its own ``__dict__``, after an exception too.

MLX is lazy: an array is a graph until evaluated. The wrapper evaluates every array it records
(``mx.eval``) when the call begins (inputs) and when it returns (outputs), and hands the recorder host
copies as CPU tensors, so that payloads, statistics and the journal are written by the same code as a
torch capture, with the dtype kept (bfloat16 travels as its bits). An array seen again (one module's
output is the next one's input) maps to the same host copy while it lives, so it is written once.

mlx is never imported here: a model is an MLX module only if the process has imported ``mlx.nn``
already (it made the model). Replay and op-level capture of MLX models are out of scope.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ...errors import UsageError
from ...files.host import host_array, host_tensor
from ..class_call import ClassCallPatch, HostCopies, module_paths, replace_arrays
from ..observer import CallObserver
from ..signatures import forward_parameters
from .base import AdapterBase, Installed, Recorder

FRAMEWORK = "mlx"


def is_mlx_module(model: Any) -> bool:
    """True when ``model`` is an ``mlx.nn.Module`` (without importing mlx)."""
    mlx_nn = sys.modules.get("mlx.nn")
    module_type = getattr(mlx_nn, "Module", None)
    return isinstance(module_type, type) and isinstance(model, module_type)


def is_mlx_array(value: Any) -> bool:
    """True when ``value`` is an ``mlx.core.array`` (without importing mlx)."""
    array_type = getattr(sys.modules.get("mlx.core"), "array", None)
    return isinstance(array_type, type) and isinstance(value, array_type)


def mlx_version() -> str | None:
    """The version of the imported mlx, or None."""
    core = sys.modules.get("mlx.core")
    return getattr(core, "__version__", None)


def check_mlx_options(**options: Any) -> None:
    """Refuse the capture options that only a torch model supports, naming the first one set."""
    from .base import check_options

    check_options(MlxAdapter(), options)


class HostArrays:
    """Evaluates MLX arrays and gives their host copies as CPU tensors, one copy per living array."""

    def __init__(self) -> None:
        core = sys.modules["mlx.core"]
        self._mx = core
        self._array = core.array
        self._bfloat16 = core.bfloat16
        self._uint16 = core.uint16
        self._host = HostCopies(self._copy)

    def convert(self, value: Any) -> Any:
        """``value`` with every array (nested in lists, tuples and dicts too) replaced by its host tensor.

        Arrays are evaluated together first. An array that cannot be evaluated (a tracer inside
        ``mx.compile``) stays as it is and is recorded as its ``repr``.
        """
        arrays: list[Any] = []
        self._collect(value, arrays)
        if not arrays:
            return value
        try:
            self._mx.eval(*arrays)
        except Exception:  # noqa: BLE001 - recording must never break the user's forward
            return value
        return replace_arrays(value, self._array, self._host)

    def _collect(self, value: Any, found: list[Any]) -> None:
        if isinstance(value, self._array):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                self._collect(item, found)
        elif isinstance(value, dict):
            for item in value.values():
                self._collect(item, found)

    def _copy(self, array: Any) -> torch.Tensor:
        if array.dtype == self._bfloat16:
            return host_tensor(np.array(array.view(self._uint16)), bits_of="bfloat16")
        return host_tensor(np.array(array))


class MlxCallPatch(ClassCallPatch):
    """Wraps ``__call__`` of every class an MLX ``model`` uses; undone by ``restore()``.

    ``root_name`` prefixes every path (``Model.model.layers.0``); the root is reported as ``root_name``.
    """

    def __init__(self, model: Any, observer: CallObserver, *, root_name: str) -> None:
        super().__init__(module_paths(model.named_modules(), root_name), observer, HostArrays().convert)


def to_mlx(value: Any, like: Any = None) -> Any:
    """A CPU tensor as an MLX array (bfloat16 by its bits), for inputs read from a file; others unchanged."""
    if not isinstance(value, torch.Tensor):
        return value
    mx = sys.modules["mlx.core"]
    tensor = value.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        array = mx.array(host_array(tensor)).view(mx.bfloat16)
    else:
        array = mx.array(tensor.numpy())
    return array.astype(like.dtype) if like is not None and hasattr(like, "dtype") else array


def cast_mlx(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dtype: str) -> tuple[Any, ...]:
    """The model and its floating inputs cast to ``dtype`` (``"bfloat16"``...), as ``--dtype`` does for torch."""
    mx = sys.modules["mlx.core"]
    target = getattr(mx, dtype, None)
    if target is None:
        raise UsageError(f"dtype {dtype!r}: MLX has no such dtype")
    model.set_dtype(target)

    def cast(value: Any) -> Any:
        if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
            return value.astype(target)
        return value

    return model, tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


class MlxAdapter(AdapterBase):
    """MLX models (``mlx.nn.Module``): module calls through their classes' ``__call__``."""

    framework = FRAMEWORK
    models = "MLX"
    supported_options: frozenset[str] = frozenset()

    def recognises(self, model: Any) -> bool:
        return is_mlx_module(model)

    def version(self) -> str | None:
        return mlx_version()

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> Installed:
        return MlxCallPatch(model, recorder.observer, root_name=recorder.model_name)

    def host(self, value: Any) -> Any:
        return HostArrays().convert(value)

    def metadata(self, model: Any) -> dict[str, Any]:
        return {"forward_parameters": forward_parameters(model.modules(), method="__call__")}

    def is_array(self, value: Any) -> bool:
        return is_mlx_array(value)

    def from_host(self, tensor: torch.Tensor, like: Any) -> Any:
        return to_mlx(tensor, like=like)

    def prepare(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, dtype: Any, device: Any
                ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        if device is not None:
            raise UsageError("device: an MLX model runs on MLX's default device; set it with "
                             "mx.set_default_device in the SPEC's function")
        if dtype is not None:
            return cast_mlx(model, args, kwargs, str(dtype).removeprefix("torch."))
        return model, args, kwargs
