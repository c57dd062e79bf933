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

A graph runtime also declares, as data, what the rest of tracediff needs to know of it, so that adding one
touches no file outside ``capturing/adapters/``:

* ``graph``: its :class:`tracediff.trace.vocabulary.GraphVocabulary` (scope syntax; view, same-value and
  rotary ops; the approximations its kernels make), written into every trace it captures;
* ``file_kind`` and ``options``: for a runtime whose models are files, how ``tracediff capture --help``
  names them (``"a GGUF file (llama.cpp)"``) and its load options as :class:`RuntimeOption` (each one
  flag, ``--kv-cache-type``, and one key of ``load``'s options, ``kv_cache_type``). The CLI builds its
  option groups from them, and refuses an option given for another runtime's file.

``AdapterBase`` gives the optional parts defaults (a model that is not a file, no inputs of its own kind,
no dtype or device changes); a runtime's adapter subclasses it and overrides what it has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ...errors import UsageError
from ...trace.vocabulary import GraphVocabulary
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
ADAPTER_METADATA = frozenset({"forward_parameters", "model_class", "runtime", "compute_dtype"})


@dataclass(frozen=True)
class RuntimeOption:
    """One load option of a runtime whose models are files: the flag ``--{name with dashes}`` and the key
    ``name`` of ``load``'s options. ``kind``: ``"str"`` (one of ``choices`` when given), ``"int"`` (at least 1)
    or ``"path"`` (a file beside the model, such as ExecuTorch's ETRecord)."""

    name: str
    help: str
    choices: tuple[str, ...] | None = None
    kind: Literal["str", "int", "path"] = "str"
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


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
    graph: GraphVocabulary | None
    file_kind: str
    options: tuple[RuntimeOption, ...]

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

    def load(self, source: Any, options: Mapping[str, Any]) -> Any: ...

    def check_inputs(self, inputs: Mapping[str, Any], source: str = "inputs") -> None: ...

    def check_run(self, model: Any, inputs: Mapping[str, Any], source: str = "inputs") -> None: ...

    def run_inputs(self, model: Any, inputs: Mapping[str, Any]) -> None: ...


class AdapterBase:
    """Defaults for an adapter's optional parts; ``framework``, ``models`` and the five methods are its own."""

    framework = ""
    models = ""
    supported_options: frozenset[str] = frozenset()
    graph: GraphVocabulary | None = None  # a module runtime's calls say what they are
    file_kind = ""  # no file is a model
    options: tuple[RuntimeOption, ...] = ()

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

    def load(self, source: Any, options: Mapping[str, Any]) -> Any:
        """The model to capture, from a file's ``Path`` or a model object of this runtime (``source``), under the
        checked ``options`` (keys of ``options`` declared); default: a model object as it is, no file."""
        if isinstance(source, Path):
            raise UsageError(f"{source}: {self.models} models are not loaded from a file")
        return source

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


def check_runtime_options(adapter: Adapter, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as ``adapter.load`` takes them, once checked against the options it declares: UsageError for
    a name it does not declare, a value outside the choices, an ``int`` below 1 or a ``path`` that is not text.
    A value of None is an option not given."""
    declared = {option.name: option for option in adapter.options}
    checked: dict[str, Any] = {}
    for name, value in options.items():
        if value is None:
            continue
        option = declared.get(name)
        if option is None:
            known = ", ".join(sorted(declared)) or "none"
            raise UsageError(f"option {name!r} is not one of {adapter.models}'s (its options: {known})")
        if option.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{option.flag} {value!r}: expected a whole number of at least 1")
        elif option.kind == "path":
            if not isinstance(value, (str, Path)):
                raise UsageError(f"{option.flag} {value!r}: expected a file's path")
            value = Path(value)
        elif not isinstance(value, str) or (option.choices is not None and value not in option.choices):
            raise UsageError(f"{option.flag} {value!r}: expected one of {', '.join(option.choices or ())}")
        checked[name] = value
    return checked
