"""The adapter contract: what the capture core asks of a runtime, and nothing else.

One adapter per runtime (torch, MLX, Flax NNX, a graph runtime such as llama.cpp). The core chooses exactly
one, once (:func:`tracediff.capturing.adapters.adapter_for`), and from then on talks only to it:

* ``recognises(model)``: True for a model of this runtime. It never imports the runtime: it looks in
  ``sys.modules`` (a model exists only once its runtime is imported).
* ``framework`` (the metadata's ``framework``), ``version()`` (its ``framework_version``) and ``models``
  (how a message names the runtime's models: ``"Flax NNX"`` in "ops=True is not supported for Flax NNX
  models").
* ``supported_options``: which of the options in ``GATED_OPTIONS`` it supports; the core refuses the others
  in one place (:func:`check_options`).
* ``install(model, recorder, options)``: its interception, undone exactly by the returned object's
  ``restore()``. A runtime of module calls reports them to ``recorder.observer`` (a ``CallObserver``); a graph
  runtime feeds ``recorder.record_node`` (a :class:`tracediff.capturing.graph.GraphNodeSink`).
* ``host(value)``: the runtime's arrays, nested in lists, tuples and dicts too, as host arrays or CPU tensors.
* ``metadata(model)``: what it adds to ``tracediff_metadata.json`` (keys of ``ADAPTER_METADATA``).

``AdapterBase`` gives the optional parts defaults (a model that is not a file, no inputs of its own kind,
no dtype or device changes); a runtime's adapter subclasses it and overrides what it has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import UsageError
from ..graph import GraphNodeSink
from ..observer import CallObserver

if TYPE_CHECKING:
    import torch

#: The capture options not every runtime supports, each with its value meaning "not used".
GATED_OPTIONS: dict[str, Any] = {
    "verify": False, "backward": False, "ops": False, "ops_exclude": (), "ops_in": (), "full_dtensor": False,
    "steps": None, "teacher_forcing": None, "compiled": "modules",
}
#: The metadata keys an adapter may fill (``framework`` and ``framework_version`` come from the adapter itself).
ADAPTER_METADATA = frozenset({"forward_parameters", "model_class", "runtime"})


class Recorder(GraphNodeSink, Protocol):
    """What ``install`` is handed: the call observer (module runtimes) and the graph node sink (graph runtimes)."""

    model_name: str  # the root's name: every path starts with it

    @property
    def observer(self) -> CallObserver: ...

    def call_lost(self, path: str, call_index: int | None, why: str) -> None:
        """A call ran and its record cannot be placed in the tree: counted, so the capture is never complete."""


class Installed(Protocol):
    """An adapter's interception, in place until ``restore()`` puts back exactly what it changed."""

    def restore(self) -> None: ...


class Adapter(Protocol):
    """A runtime, as the capture core sees it (see the module docstring)."""

    framework: str
    models: str
    supported_options: frozenset[str]

    def recognises(self, model: Any) -> bool: ...

    def version(self) -> str | None: ...

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> Installed: ...

    def host(self, value: Any) -> Any: ...

    def metadata(self, model: Any) -> dict[str, Any]: ...

    # The parts below have defaults in AdapterBase.

    def measure(self) -> Callable[..., dict[str, Any]] | None: ...

    def is_array(self, value: Any) -> bool: ...

    def from_host(self, tensor: torch.Tensor, like: Any) -> Any: ...

    def prepare(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, dtype: Any, device: Any
                ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]: ...

    def opens(self, path: Path) -> bool: ...

    def load(self, path: Path, options: Mapping[str, Any]) -> Any: ...

    def check_inputs(self, inputs: Mapping[str, Any], source: str = "inputs") -> None: ...

    def check_run(self, model: Any, inputs: Mapping[str, Any], source: str = "inputs") -> None: ...

    def run_inputs(self, model: Any, inputs: Mapping[str, Any]) -> None: ...


class AdapterBase:
    """Defaults for an adapter's optional parts; ``framework``, ``models`` and the five methods are its own."""

    framework = ""
    models = ""
    supported_options: frozenset[str] = frozenset()

    def measure(self) -> Callable[..., dict[str, Any]] | None:
        """The statistics of a host tensor (``numpy_stats``: the runtime's own threads are not joined by
        torch's); None: torch's ``tensor_stats``."""
        from ..stats import numpy_stats

        return numpy_stats

    def is_array(self, value: Any) -> bool:
        """True for one of the runtime's arrays (an input of its own kind); default: none."""
        return False

    def from_host(self, tensor: torch.Tensor, like: Any) -> Any:
        """A CPU tensor read from an inputs file as the runtime's input, like the example ``like``."""
        return tensor

    def prepare(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, dtype: Any, device: Any
                ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """The model and inputs under ``dtype``/``device`` (``--dtype``, ``--device``); default: refused."""
        for name, value in (("dtype", dtype), ("device", device)):
            if value is not None:
                raise UsageError(f"{name}={value!s} is not supported for {self.models} models: set it in the "
                                 "SPEC's function")
        return model, args, kwargs

    def opens(self, path: Path) -> bool:
        """True when the model is the file ``path`` (a ``.gguf``); default: no file is a model."""
        return False

    def load(self, path: Path, options: Mapping[str, Any]) -> Any:
        raise UsageError(f"{path}: {self.models} models are not loaded from a file")

    def check_inputs(self, inputs: Mapping[str, Any], source: str = "inputs") -> None:
        """UsageError, its message starting with ``source``, when a file's model could never run ``inputs``;
        called before the model is loaded. Default: nothing refused."""

    def check_run(self, model: Any, inputs: Mapping[str, Any], source: str = "inputs") -> None:
        """UsageError when the loaded ``model`` cannot run ``inputs`` (before anything is written). Default:
        nothing refused."""

    def run_inputs(self, model: Any, inputs: Mapping[str, Any]) -> None:
        raise UsageError(f"{self.models} models are called by the SPEC's inputs, not run from a file's")


def check_options(adapter: Adapter, options: Mapping[str, Any]) -> None:
    """Refuse the first option set in ``options`` that ``adapter`` does not support, naming its runtime."""
    for name, unused in GATED_OPTIONS.items():
        value = options.get(name, unused)
        if name not in adapter.supported_options and value not in (unused, False, None, (), [], 0, ""):
            raise UsageError(f"{name}={value!r} is not supported for {adapter.models} models: capture without it "
                             "(calls, inputs and outputs are recorded)")
