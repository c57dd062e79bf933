"""Capturing a model that is a file (``tracediff capture model.gguf --inputs inputs.safetensors --out DIR``).

The adapter whose models are files like the path (:func:`tracediff.capturing.adapters.adapter_for_path`), or
whose runtime the model object is, loads it with the runtime options given (the ``options`` the adapter
declares; llama.cpp: ``kv_cache_type``, ``flash_attn``, ``threads``) and runs
it on the tensors of the inputs file, the file the reference side wrote with ``--save-inputs``; the run is
captured as any model's (:func:`tracediff.capture`). The options are recorded in the trace metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ..errors import InputsFileError, UsageError
from ..files.confine import check_regular_file
from ..files.payloads import read_tensor_file
from .adapters import adapter_for, adapter_for_path
from .adapters.base import check_runtime_options
from .options import CaptureOptions
from .session import CaptureSession, _capture


def is_model_file(spec: str) -> bool:
    """True when ``spec`` names a file some adapter's runtime loads (a ``.gguf``), not a SPEC."""
    return adapter_for_path(Path(spec)) is not None


def read_inputs(path: str | Path) -> dict[str, Any]:
    """Every tensor of a safetensors inputs file, by key (``kwargs.input_ids``)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    check_regular_file(path, error=InputsFileError, what="inputs file")
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise InputsFileError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0]})") from e
    return {key: read_tensor_file(path, key) for key in keys}


def capture_file(
    model: str | Path | Any,
    out_dir: str | Path,
    *,
    inputs: str | Path | Mapping[str, Any],
    options: Mapping[str, Any] | None = None,
    tensors: Literal["full", "summary", "repr"] = "full",
    overwrite: bool = False,
) -> CaptureSession:
    """Load ``model`` with its runtime's adapter, run it on ``inputs`` and capture the run into ``out_dir``.

    Args:
        model: a file a registered adapter opens (``model.gguf``: llama.cpp), or a model object of such a
            runtime (a ``llama_cpp.Llama``; the objects each runtime takes are in docs/frameworks.md).
        out_dir: the trace folder (empty or absent unless ``overwrite``).
        inputs: a safetensors file, or its tensors by key (``kwargs.input_ids``, ``NAME``, ``args.0``); llama.cpp
            takes the token ids of ``kwargs.input_ids`` (or of the only integer tensor).
        options: the runtime's load options, the ones its adapter declares (``tracediff capture --help`` lists
            them; llama.cpp: ``kv_cache_type`` f32|f16|bf16|q8_0, default f16; ``flash_attn`` auto|on|off,
            default auto; ``threads``). An option it does not declare, or a value outside its choices, is refused.
        tensors: ``"full"``, ``"summary"`` or ``"repr"``, as for :func:`tracediff.capture`.

    Raises:
        UsageError: no adapter opens the file (or it is no regular file), the file does not load, an option is
            not the runtime's, the inputs lack what the model needs or hold what it cannot run (llama.cpp: token
            ids outside its vocabulary, negative or beyond 32 bits, more of them than its context holds).
        InputsFileError: the inputs file is missing or unreadable.
    """
    if isinstance(model, (str, Path)):
        source: Any = Path(model)
        adapter = adapter_for_path(source)
        if adapter is None:
            raise UsageError(f"{source}: no runtime opens this kind of file")
    else:
        source = model
        adapter = adapter_for(model)
    settings = check_runtime_options(adapter, options or {})
    where = str(inputs) if isinstance(inputs, (str, Path)) else "inputs"
    tensors_in = read_inputs(inputs) if isinstance(inputs, (str, Path)) else dict(inputs)
    adapter.check_inputs(tensors_in, where)  # refused before anything is loaded or written
    loaded = adapter.load(source, settings)
    adapter.check_run(loaded, tensors_in, where)  # what the loaded model cannot run, before anything is written
    with _capture(loaded, out_dir, CaptureOptions(tensors=tensors, overwrite=overwrite), adapter) as session:
        adapter.run_inputs(loaded, tensors_in)
    return session
