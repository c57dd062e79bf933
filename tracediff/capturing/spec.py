"""Capturing a model named by a SPEC, as ``tracediff capture`` does.

A SPEC is ``package.module:function`` or ``path/to/script.py:function``; the
function takes no arguments and returns ``(model, inputs)``, where inputs is
a tensor, a tuple of positional arguments, or a dict of keyword arguments.

Inputs files are safetensors files whose keys name where each tensor goes:
``args.0``, ``args.1``, ... for positional arguments and ``kwargs.NAME`` for
keyword arguments. ``save_inputs`` writes that layout and ``load_inputs``
reads it back into the structure of the example inputs, so that two
implementations can be captured on bit-identical inputs. Non-tensor inputs
(``use_cache=False``) always come from the SPEC's function.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, cast

import torch

from ..errors import CaptureSpecError, InputsFileError, OutputDirError, UsageError
from ..files.atomic import check_out_dir, ensure_writable_dir
from ..files.confine import check_regular_file
from ..files.payloads import read_tensor_file
from .adapters import Adapter, array_adapter, find_adapter, known_models
from .conditions import parse_device, parse_dtype
from .journal import claim_folder
from .options import CaptureOptions
from .pipeline import DEFAULT_POOL_MB
from .session import CaptureSession, _capture
from .tokens import check_forcing_model, check_forcing_prompt, prompt_ids, read_reference_tokens

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


def call_spec(spec: str) -> tuple[Any, str]:
    """Import the SPEC's function (``package.module:function`` or ``path/to/script.py:function``), call it.

    Returns what it returned and the function's name (for messages); anything it raises becomes one line.
    """
    target, sep, func_name = spec.rpartition(":")
    if not sep or not target or not func_name:
        raise CaptureSpecError(f"{spec}: expected package.module:function or path/to/script.py:function")
    module = _import_target(spec, target)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise CaptureSpecError(f"{spec}: {target} has no function {func_name!r}")
    try:
        return func(), func_name
    except Exception as e:  # noqa: BLE001 - the user's code; report it in one line
        raise CaptureSpecError(f"{spec}: calling {func_name}() raised {_describe(e)}") from e


def load_spec(spec: str) -> tuple[Any, Inputs]:
    """Import the SPEC's function, call it, and return ``(model, (args, kwargs))``."""
    model, _, inputs = _load_spec(spec)
    return model, inputs


def _load_spec(spec: str) -> tuple[Any, Adapter, Inputs]:
    """``load_spec``, with the adapter of the model's runtime, chosen here once."""
    result, func_name = call_spec(spec)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise CaptureSpecError(f"{spec}: {func_name}() must return (model, inputs), got {type(result).__name__}")
    model, inputs = result
    adapter = find_adapter(model)
    if adapter is None:
        raise CaptureSpecError(f"{spec}: the model returned by {func_name}() is a {type(model).__name__}, "
                               f"not a {known_models()} model")
    return model, adapter, _split_inputs(spec, inputs, adapter)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _describe(e: BaseException) -> str:
    """``Type: first line of the message``: the user's exception in our one-line error."""
    return f"{type(e).__name__}: {_first_line(e)}"


def _import_target(spec: str, target: str) -> Any:
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target)
        if not path.is_file():
            raise CaptureSpecError(f"{spec}: no such script {path}")
        name = f"tracediff_spec_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise CaptureSpecError(f"{spec}: {path} cannot be imported")
        module = importlib.util.module_from_spec(loader_spec)
        # Registered like any import: dataclasses and pickling look the module up in sys.modules.
        sys.modules[name] = module
        try:
            with _on_sys_path(str(path.parent.resolve())):
                loader_spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001
            sys.modules.pop(name, None)
            raise CaptureSpecError(f"{spec}: importing {path} raised {_describe(e)}") from e
        return module
    try:
        # As `python -m` does: a package in the current directory is importable from the console script too.
        with _on_sys_path(os.getcwd()):
            return importlib.import_module(target)
    except Exception as e:  # noqa: BLE001
        raise CaptureSpecError(f"{spec}: cannot import {target} ({_describe(e)})") from e


@contextmanager
def _on_sys_path(folder: str) -> Iterator[None]:
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def _split_inputs(spec: str, inputs: Any, adapter: Adapter) -> Inputs:
    if isinstance(inputs, torch.Tensor) or adapter.is_array(inputs):
        return (inputs,), {}
    if isinstance(inputs, tuple):
        return inputs, {}
    if isinstance(inputs, dict) and all(isinstance(k, str) for k in inputs):
        return (), dict(inputs)
    raise CaptureSpecError(f"{spec}: inputs must be a tensor, a tuple of positional arguments or a dict of "
                           f"keyword arguments, got {type(inputs).__name__}")


def _tensor_slots(inputs: Inputs, adapter: Adapter | None = None) -> dict[str, torch.Tensor]:
    """The tensors of ``inputs`` by slot; another runtime's array (MLX, JAX) as its host copy (a CPU tensor)."""
    args, kwargs = inputs
    slots = {f"args.{i}": v for i, v in enumerate(args)}
    slots.update({f"kwargs.{k}": v for k, v in kwargs.items()})
    found = {key: _as_tensor(value, adapter) for key, value in slots.items()}
    return {key: tensor for key, tensor in found.items() if tensor is not None}


def _array_runtime(value: Any, adapter: Adapter | None) -> Adapter | None:
    """The adapter whose array ``value`` is: the model's (``adapter``) when the capture chose it, else the
    registered one that takes it; None for a value no runtime's."""
    if adapter is None:
        return array_adapter(value)
    return adapter if adapter.is_array(value) else None


def _as_tensor(value: Any, adapter: Adapter | None = None) -> torch.Tensor | None:
    """A tensor as it is, a runtime's array as its host copy, anything else None."""
    if isinstance(value, torch.Tensor):
        return value
    runtime = _array_runtime(value, adapter)
    return None if runtime is None else cast(torch.Tensor, runtime.host(value))


def save_inputs(path: str | Path, inputs: Inputs) -> None:
    """Write the tensors of ``inputs`` to a safetensors file (keys ``args.i`` / ``kwargs.name``)."""
    _save_inputs(path, inputs, None)


def _save_inputs(path: str | Path, inputs: Inputs, adapter: Adapter | None) -> None:
    """``save_inputs``, the arrays of ``adapter``'s runtime (the model's) taken as such."""
    from safetensors.torch import save_file

    path = Path(path)
    ensure_writable_dir(path.parent if str(path.parent) else Path("."))
    tensors = {key: t.detach().cpu().contiguous() for key, t in _tensor_slots(inputs, adapter).items()}
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        save_file(tensors, str(tmp))
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputDirError(f"{path}: could not write inputs: {e.strerror or e}") from e


def load_inputs(path: str | Path, example: Inputs, *, inputs_map: Mapping[str, str] | None = None,
                on_note: Callable[[str], None] | None = None) -> Inputs:
    """Replace the tensors of ``example`` with those stored in ``path``.

    Keys must match the example's slots, after ``inputs_map`` (``{"args.0":
    "kwargs.input_ids"}``: which file key feeds which input; see
    :mod:`tracediff.capturing.inputs_map`). ``on_note`` receives a line when
    the only tensor of each side was paired automatically.
    """
    return _load_inputs(path, example, None, inputs_map=inputs_map, on_note=on_note)


def _load_inputs(path: str | Path, example: Inputs, adapter: Adapter | None, *,
                 inputs_map: Mapping[str, str] | None = None, on_note: Callable[[str], None] | None = None) -> Inputs:
    """``load_inputs``, the example's arrays taken as ``adapter``'s (the model's runtime) when it is given."""
    from safetensors import SafetensorError, safe_open

    from .inputs_map import resolve_keys

    path = Path(path)
    check_regular_file(path, error=InputsFileError, what="inputs file")  # a FIFO or /dev/zero: refused, not read
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise InputsFileError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0]})") from e
    slots = _tensor_slots(example, adapter)
    source, note = resolve_keys(path, sorted(keys), slots, inputs_map or {}, lambda k: read_tensor_file(path, k))
    if note is not None and on_note is not None:
        on_note(note)
    args, kwargs = list(example[0]), dict(example[1])
    for key, original in slots.items():
        # A fresh allocation: a tensor read from the file can sit at an address that is not 64-byte aligned,
        # and CPU kernels then take another path and round differently (a Linear differs in the last bit).
        loaded: Any = read_tensor_file(path, source[key]).to(original.device).clone()
        kind, _, name = key.partition(".")
        example_value = example[0][int(name)] if kind == "args" else example[1][name]
        runtime = _array_runtime(example_value, adapter)
        if runtime is not None:  # another runtime's input (MLX, JAX): an array of the example's dtype
            loaded = runtime.from_host(loaded, like=example_value)
        if kind == "args":
            args[int(name)] = loaded
        else:
            kwargs[name] = loaded
    return tuple(args), kwargs


def _scalar_loss(spec: str, output: Any) -> torch.Tensor:
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss if loss.dim() == 0 else loss.sum()
    first = _first_float_tensor(output)
    if first is None or not first.requires_grad:
        raise CaptureSpecError(f"{spec}: --backward needs an output with a loss or a tensor that requires grad")
    return first.sum()


def _first_float_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else []
    for item in items:
        found = _first_float_tensor(item)
        if found is not None:
            return found
    return None


def capture_spec(
    spec: str,
    out_dir: str | Path,
    *,
    inputs: str | Path | None = None,
    save_inputs_to: str | Path | None = None,
    tensors: str = "full",
    overwrite: bool = False,
    verify: bool = False,
    prune_layers: bool = False,
    backward: bool = False,
    progress: bool = False,
    ops: bool | Sequence[str] = False,
    ops_exclude: Sequence[str] = (),
    ops_in: Sequence[str] = (),
    ops_min_numel: int = 0,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    inputs_map: Mapping[str, str] | None = None,
    on_note: Callable[[str], None] | None = None,
    writers: int | None = None,
    pool_mb: int = DEFAULT_POOL_MB,
    generate: bool = False,
    max_new_tokens: int | None = None,
    steps: str | Sequence[int] | None = None,
    teacher_forcing: str | Path | None = None,
    ranks: Literal["all"] | int = 0,
    other_steps: str = "stats",
    compiled: str = "modules",
) -> CaptureSession:
    """Load a SPEC, optionally replace its inputs, and capture one forward under ``torch.no_grad()``.

    ``compiled`` is ``capture``'s: how the values of code compiled with ``torch.compile`` are recorded
    (``"modules"``, default, or ``"regions"``; docs/compiled.md).

    With ``backward=True`` the forward runs with autograd and is followed by a
    backward pass from the output's ``loss`` when it has one, else from the
    sum of its first floating-point tensor; gradients are recorded too. The
    ``ops*`` options are ``capture``'s (op-level capture, off by default).

    ``dtype`` (``"bfloat16"``, ``"float16"``, ...) and ``device`` (``"cuda"``)
    cast the model and its floating inputs before the forward, as
    :func:`tracediff.capturing.conditions.to_conditions` does: how the
    baseline of ``align(..., baseline=...)`` is captured. Default: unchanged.
    Saved inputs (``save_inputs_to``) are written before the cast.

    ``inputs_map`` (``{"args.0": "kwargs.input_ids"}``) says which key of the
    ``inputs`` file feeds which input of the model (see
    :mod:`tracediff.capturing.inputs_map`); ``on_note`` receives a line when
    the inputs were paired automatically. Default: keys must match.

    ``writers`` and ``pool_mb`` are ``capture``'s (the payload pipeline).

    ``generate=True`` runs ``model.generate(*args, **kwargs)`` instead of the
    forward (with ``max_new_tokens`` when given), and each forward pass is
    recorded as a decode step; ``steps`` selects the steps written in full,
    ``other_steps`` what the others keep (``"stats"``, default, or ``"tree"``;
    see :mod:`tracediff.capturing.decode_steps`). Default: one forward.
    ``teacher_forcing`` (with ``generate``) feeds the reference trace's tokens
    to ``generate`` step by step (see :mod:`tracediff.capturing.tokens`); the
    reference is checked before the model is built, and its prompt and
    vocabulary against the model's before anything is captured.

    ``ranks`` is ``capture``'s: under torchrun, ``"all"`` has every rank write
    ``out_dir/rank{r}`` (the SPEC's function sets up the process group and
    the parallel model); the rank folders are then checked and taken by the
    capture itself, each by its own rank.

    The output folder is checked before the model is built, and an earlier
    trace in it is replaced only once the model and its inputs are ready.
    """
    every_rank = ranks == "all"
    if not every_rank:
        check_out_dir(Path(out_dir), overwrite=overwrite)
    if not generate and (steps is not None or max_new_tokens is not None):
        raise UsageError("steps and max_new_tokens concern the forward passes of model.generate: add generate=True "
                         "(--generate)")
    if not generate and teacher_forcing is not None:
        raise UsageError("teacher_forcing feeds tokens to model.generate: add generate=True (--generate)")
    if max_new_tokens is not None and (type(max_new_tokens) is not int or max_new_tokens < 1):
        raise UsageError(f"max_new_tokens={max_new_tokens!r}: expected a number of tokens, 1 or more")
    if generate and backward:
        raise UsageError("generate and backward cannot be combined: capture a forward with backward")
    options = CaptureOptions(
        tensors=tensors, prune_layers=prune_layers, overwrite=overwrite, verify=verify,  # type: ignore[arg-type]
        ranks=ranks, backward=backward, progress=progress, ops=ops, ops_exclude=ops_exclude, ops_in=ops_in,
        ops_min_numel=ops_min_numel, writers=writers, pool_mb=pool_mb, steps=steps,
        teacher_forcing=teacher_forcing, other_steps=other_steps, compiled=compiled)
    options.check_steps()  # the rest once the model's runtime is known (capture's CaptureOptions.checked)
    if other_steps != "stats" and steps is None:
        raise UsageError("other_steps says what the steps left out by steps keep: add steps (--steps 0,-1)")
    forcing = read_reference_tokens(teacher_forcing) if teacher_forcing is not None else None
    parse_dtype(dtype), parse_device(device)  # a bad --dtype/--device fails before the model is built
    # Taken now, held until the capture ends: a second capture into the folder meanwhile is refused.
    claim = claim_folder(Path(out_dir), overwrite=overwrite) if not every_rank else None
    try:
        model, adapter, example = _load_spec(spec)
        if generate and not callable(getattr(model, "generate", None)):
            raise CaptureSpecError(f"{spec}: the model ({type(model).__name__}) has no generate method")
        args, kwargs = (_load_inputs(inputs, example, adapter, inputs_map=inputs_map, on_note=on_note)
                        if inputs is not None else example)
        if save_inputs_to is not None:
            _save_inputs(save_inputs_to, (args, kwargs), adapter)
        model, args, kwargs = adapter.prepare(model, args, kwargs, dtype=dtype, device=device)
        if forcing is not None:
            check_forcing_model(forcing, model)
            check_forcing_prompt(forcing, prompt_ids(args, kwargs))
    except BaseException:
        if claim is not None:
            claim.release()
        raise
    session = None
    grad_mode = torch.enable_grad() if backward else torch.no_grad()
    try:
        # the adapter chosen when the SPEC's model came back, handed down: the runtime is decided once
        with grad_mode, _capture(model, out_dir, options, adapter) as session:
            if generate:
                extra = {"max_new_tokens": max_new_tokens} if max_new_tokens is not None else {}
                output = cast(Any, model).generate(*args, **kwargs, **extra)
            else:
                output = model(*args, **kwargs)
            if backward:
                _scalar_loss(spec, output).backward()
    except CaptureSpecError:
        raise
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: the partial trace was written; say where
        if session is not None:
            e.partial_trace = session.trace_dir  # type: ignore[attr-defined]
        raise
    except (Exception, SystemExit) as e:  # SystemExit: the model called sys.exit(); not ours to exit with
        if session is None or session.error is None:
            if isinstance(e, SystemExit):
                raise CaptureSpecError(f"{spec}: the forward called sys.exit({e.code!r}); "
                                       f"the partial trace is in {out_dir}") from None
            raise
        where = f"{session.error['module_path']} (call {session.error['call_index']})"
        what = f"SystemExit({e.code!r})" if isinstance(e, SystemExit) else type(e).__name__
        raise CaptureSpecError(f"{spec}: the forward raised {what} in {where}: {_first_line(e)}; "
                               f"the partial trace is in {session.trace_dir}") from e
    finally:
        if claim is not None:
            claim.release()  # already released by capture() unless it failed before taking it over
    return session
