"""The runtimes capture knows, one adapter each, and the one place that chooses among them.

``capture()`` and ``tracediff capture`` call :func:`adapter_for` (a model object) or :func:`adapter_for_path`
(a model that is a file) once, and talk to the adapter it returns from then on: no other code asks which
framework a model belongs to. Built in: torch (:mod:`.torch`), MLX (:mod:`.mlx`), Flax NNX (:mod:`.jax`).
Another runtime plugs in with :func:`register_adapter`::

    from tracediff.capturing.adapters import AdapterBase, register_adapter

    class MyRuntime(AdapterBase):
        framework, models = "myrt", "MyRuntime"
        def recognises(self, model): ...
        ...

    register_adapter(MyRuntime())

Adapters registered later are asked first, the built-in ones last; the first that recognises the model is
chosen. The contract is in :mod:`.base`; docs/frameworks.md says how to add a runtime.
"""

from __future__ import annotations

import threading
from importlib import import_module
from pathlib import Path
from typing import Any

from ...errors import UsageError
from .base import GATED_OPTIONS, Adapter, AdapterBase, Installed, Recorder, RuntimeOption, check_options

__all__ = ["Adapter", "AdapterBase", "Installed", "Recorder", "RuntimeOption", "GATED_OPTIONS", "adapter_for",
           "adapter_for_path", "adapters", "array_adapter", "check_options", "file_adapters", "find_adapter",
           "known_models", "register_adapter", "unregister_adapter"]

_REQUIRED = ("framework", "models", "supported_options", "graph", "file_kind", "options", "recognises", "version",
             "install", "host", "metadata", "measure", "is_array", "from_host", "prepare", "opens", "load",
             "check_inputs", "check_run", "run_inputs")
_registered: list[Adapter] = []
_lock = threading.Lock()


#: The built-in runtimes whose models are files, by module and class: the command line reads their declared
#: options (``file_kind``, ``options``) without importing torch, so these modules import their runtimes lazily.
_FILE_RUNTIMES = (
    ("llama_cpp", "LlamaCppAdapter"),
    ("onnxruntime", "OnnxRuntimeAdapter"),
    ("openvino", "OpenVINOAdapter"),
    ("executorch", "ExecuTorchAdapter"),
)


def _builtin() -> list[Adapter]:
    from .jax import NnxAdapter
    from .mlx import MlxAdapter
    from .torch import TorchAdapter

    return [TorchAdapter(), MlxAdapter(), NnxAdapter(), *_builtin_files()]


def _builtin_files() -> list[Adapter]:
    return [getattr(import_module(f".{module}", __name__), name)() for module, name in _FILE_RUNTIMES]


def file_adapters() -> list[Adapter]:
    """The registered adapters, latest first, then the built-in ones whose models are files: those a file's
    path is offered to (:func:`adapter_for_path`), and whose declared options the command line takes. Imports
    no torch unless a registered adapter did."""
    with _lock:
        registered = list(reversed(_registered))
    return [*registered, *_builtin_files()]


def register_adapter(adapter: Adapter) -> None:
    """Add a runtime's adapter, asked before those registered earlier and the built-in ones.

    Raises UsageError when ``adapter`` lacks a part of the contract (subclass ``AdapterBase`` for the optional
    ones). Registering the same object twice keeps one registration.
    """
    missing = [name for name in _REQUIRED if not hasattr(adapter, name)]
    if missing:
        raise UsageError(f"adapter {type(adapter).__name__}: lacks {', '.join(missing)} (subclass "
                         "tracediff.capturing.adapters.AdapterBase for the optional parts)")
    if not isinstance(adapter.framework, str) or not adapter.framework:
        raise UsageError(f"adapter {type(adapter).__name__}: framework must be a non-empty string")
    with _lock:
        if adapter not in _registered:
            _registered.append(adapter)


def unregister_adapter(adapter: Adapter) -> None:
    """Remove an adapter added with ``register_adapter`` (nothing happens when it is not registered)."""
    with _lock:
        if adapter in _registered:
            _registered.remove(adapter)


def adapters() -> list[Adapter]:
    """Every adapter in the order they are asked: the registered ones, latest first, then the built-in ones."""
    with _lock:
        registered = list(reversed(_registered))
    return [*registered, *_builtin()]


def adapter_for(model: Any) -> Adapter:
    """The adapter of ``model``'s runtime; UsageError naming the runtimes known when none recognises it."""
    found = find_adapter(model)
    if found is None:
        raise UsageError(f"model: expected a {known_models()} model, got {type(model).__name__}")
    return found


def array_adapter(value: Any) -> Adapter | None:
    """The adapter of the runtime ``value`` is an array of (a torch tensor, an MLX or JAX input), or None."""
    return next((adapter for adapter in adapters() if adapter.is_array(value)), None)


def find_adapter(model: Any) -> Adapter | None:
    """The adapter of ``model``'s runtime, or None."""
    return next((adapter for adapter in adapters() if adapter.recognises(model)), None)


def known_models() -> str:
    """The runtimes whose models capture takes, for messages: ``"torch, MLX or Flax NNX"``."""
    with _lock:
        registered = list(_registered)
    names = list(dict.fromkeys(adapter.models for adapter in [*_builtin(), *registered]))
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def adapter_for_path(path: Path) -> Adapter | None:
    """The adapter whose models are files like ``path`` (``model.gguf``), or None."""
    return next((adapter for adapter in file_adapters() if adapter.opens(path)), None)
