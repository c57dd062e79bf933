"""Capturing a model that is a file (``tracediff capture model.gguf --inputs inputs.safetensors --out DIR``).

The adapter whose models are files like the path (:func:`tracediff.capturing.adapters.adapter_for_path`)
loads it with the runtime options given (llama.cpp: ``kv_cache_type``, ``flash_attn``, ``threads``) and runs
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
from .adapters import adapter_for_path
from .session import CaptureSession, capture


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
    model_file: str | Path,
    out_dir: str | Path,
    *,
    inputs: str | Path,
    options: Mapping[str, Any] | None = None,
    tensors: Literal["full", "summary", "repr"] = "full",
    overwrite: bool = False,
) -> CaptureSession:
    """Load ``model_file`` with its runtime's adapter, run it on ``inputs`` and capture the run into ``out_dir``.

    Args:
        model_file: a file a registered adapter opens (``model.gguf``: llama.cpp).
        out_dir: the trace folder (empty or absent unless ``overwrite``).
        inputs: a safetensors file; llama.cpp takes the token ids of ``kwargs.input_ids`` (or of the file's
            only integer tensor).
        options: the runtime's load options (llama.cpp: ``kv_cache_type`` f32|f16|bf16|q8_0, default f16;
            ``flash_attn`` auto|on|off, default auto; ``threads``).
        tensors: ``"full"``, ``"summary"`` or ``"repr"``, as for :func:`tracediff.capture`.

    Raises:
        UsageError: no adapter opens the file (or it is no regular file), the file does not load, the inputs
            lack what the model needs or hold what it cannot run (llama.cpp: token ids outside its vocabulary,
            negative or beyond 32 bits, more of them than its context holds).
        InputsFileError: the inputs file is missing or unreadable.
    """
    path = Path(model_file)
    adapter = adapter_for_path(path)
    if adapter is None:
        raise UsageError(f"{path}: no runtime opens this kind of file")
    tensors_in = read_inputs(inputs)
    adapter.check_inputs(tensors_in, str(inputs))  # refused before anything is loaded or written
    model = adapter.load(path, dict(options or {}))
    adapter.check_run(model, tensors_in, str(inputs))  # what the loaded model cannot run, before anything is written
    with capture(model, out_dir, tensors=tensors, overwrite=overwrite) as session:
        adapter.run_inputs(model, tensors_in)
    return session
