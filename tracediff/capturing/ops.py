"""Op-level capture: the torch functions a module's own ``forward`` code calls.

``tracediff.capture(model, out, ops=True)`` records, besides every module
call, each call of a ``torch.*`` function, a ``torch.nn.functional.*``
function or a ``torch.Tensor`` method or operator made while a module of the
model runs. Each becomes an *op node*, a child of the innermost module call
in progress, placed among that call's submodule calls in call order::

    {"module_path": "LlamaModel.layers.1.self_attn", "call_index": 0,
     "op": "torch.nn.functional.scaled_dot_product_attention", "op_index": 12,
     "inputs": {"args": [...], "kwargs": {"scale": {"py_type": "float", "py_value": 0.25}}},
     "outputs": {...tensor entry...}}

``module_path`` and ``call_index`` are the enclosing module call's; ``op`` is
the qualified name (``torch.matmul``, ``torch.Tensor.mul``); ``op_index``
counts the recorded ops of that call from 0. Tensors are encoded exactly as
module tensors (payloads written and measured once, shared with the module
entries that hold the same tensor).

How it works: a ``torch.overrides.TorchFunctionMode`` is pushed for the
duration of the capture. While a handler runs, torch disables the mode, so
the functions an op calls internally (``softmax`` calling
``Tensor.softmax``) are not recorded; and an op is attributed to the
innermost module call only, so what a child module computes is recorded in
the child, never twice. Functions called outside any module call (the user's
code around the model, backward hooks) are not recorded.

Selection (see ``OpSelection``):

* by default every op except views and shape or metadata queries
  (``view``, ``reshape``, ``transpose``, ``permute``, ``expand``,
  ``contiguous``, ``__getitem__``, ``size``, property reads such as
  ``.shape``...: ``DEFAULT_EXCLUDED``);
* ``ops=["matmul", "softmax"]``: only these (glob patterns; a pattern
  without a dot matches the last part of the name, so ``matmul`` matches
  ``torch.matmul`` and ``torch.Tensor.matmul``; one with a dot matches the
  whole qualified name). An explicit list replaces the default exclusion, so
  ``ops=["view"]`` records views;
* ``ops_exclude``: patterns removed from the selection;
* ``ops_in``: module path patterns (with or without the root class name);
  ops are recorded only inside matching module calls and their submodules;
* ``ops_min_numel``: ops whose tensor outputs all have fewer elements are
  skipped (default 0: none is).

Ops that return no tensor, and ops that return one of their inputs
unchanged (``x.to(x.dtype)``, ``contiguous()`` on a contiguous tensor) are
never recorded. A parameter (``nn.Parameter``) passed to an op, such as the
weight of ``F.linear``, is recorded as ``{"py_type": "Parameter", "repr":
"Parameter(shape=[...], dtype=...)"}``, not as a payload.

Limits: only Python-level calls that go through torch's
``__torch_function__`` protocol are seen (custom CUDA extensions called
directly, or code inside ``torch.compile``-d regions, are not); ops run on
other threads are not recorded; recording costs one Python call per op and
the writing of every op output, so restrict it with ``ops_in`` on large
models.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._pytree import tree_flatten

from .. import format as fmt
from ..errors import UsageError
from ..globs import matches_any
from .encode import tensor_version

# Views and queries of shape or metadata: they create no new values worth comparing.
DEFAULT_EXCLUDED: tuple[str, ...] = (
    "*.__get__", "*.__set__", "view", "view_as", "reshape", "reshape_as", "transpose", "t", "permute",
    "contiguous", "expand", "expand_as", "squeeze", "unsqueeze", "flatten", "unflatten", "narrow", "select",
    "split", "split_with_sizes", "chunk", "unbind", "movedim", "moveaxis", "swapaxes", "swapdims", "as_strided",
    "detach", "__getitem__", "__setitem__", "__len__", "__iter__", "__bool__", "__index__", "__format__",
    "__repr__", "__hash__", "__contains__", "__reduce_ex__", "__deepcopy__", "size", "dim", "ndimension",
    "numel", "nelement", "stride", "storage_offset", "data_ptr", "is_contiguous", "is_floating_point",
    "is_complex", "element_size", "get_device", "type", "requires_grad_", "item", "tolist",
)


def _matches(name: str, pattern: str) -> bool:
    if "." in pattern:
        return fnmatch.fnmatchcase(name, pattern)
    return fnmatch.fnmatchcase(name.rsplit(".", 1)[-1], pattern)


@dataclass(frozen=True)
class OpSelection:
    """Which ops are recorded, and where.

    ``include`` None means every op but ``DEFAULT_EXCLUDED``; a tuple of
    patterns means only the ops matching one of them. ``exclude`` patterns
    are removed from the selection. ``inside`` (module path globs, tried on
    the full path and on the path without the root class name) limits
    recording to matching module calls and everything they call; empty means
    everywhere. ``min_numel`` skips ops whose tensor outputs are all smaller.
    """

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    inside: tuple[str, ...] = ()
    min_numel: int = 0
    _cache: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_options(
        cls,
        ops: bool | Sequence[str],
        *,
        exclude: str | Sequence[str] = (),
        inside: str | Sequence[str] = (),
        min_numel: int = 0,
    ) -> OpSelection | None:
        """The selection for ``capture``'s options; None when op capture is off."""
        if not ops and not inside and not exclude:  # False, or an empty list
            return None
        if isinstance(ops, str):
            ops = [ops]
        include = None if isinstance(ops, bool) else tuple(str(p) for p in ops)
        if include == ():
            include = None
        if isinstance(exclude, str):
            exclude = [exclude]
        if isinstance(inside, str):
            inside = [inside]
        if int(min_numel) < 0:
            raise UsageError(f"ops_min_numel={min_numel}: expected a number of elements >= 0")
        return cls(include=include, exclude=tuple(exclude), inside=tuple(inside), min_numel=int(min_numel))

    def records(self, name: str) -> bool:
        """True when the op ``name`` (a qualified name) is selected."""
        chosen = self._cache.get(name)
        if chosen is None:
            if self.include is None:
                chosen = not any(_matches(name, p) for p in DEFAULT_EXCLUDED)
            else:
                chosen = any(_matches(name, p) for p in self.include)
            chosen = chosen and not any(_matches(name, p) for p in self.exclude)
            self._cache[name] = chosen
        return chosen

    def records_inside(self, path: str) -> bool:
        """True when ops are recorded in the call of module ``path`` itself (before its parents count)."""
        if not self.inside:
            return True
        relative = path.split(".", 1)[1] if "." in path else ""
        return matches_any(path, self.inside) or matches_any(relative, self.inside)

    def to_dict(self) -> dict[str, Any]:
        return {"include": list(self.include) if self.include is not None else None, "exclude": list(self.exclude),
                "inside": list(self.inside), "min_numel": self.min_numel}


@dataclass
class _Frame:
    node: dict[str, Any]
    prefix: str
    recording: bool
    next_index: int = 0


_NAMES: dict[Any, str] = {}


def op_name(func: Any) -> str:
    """The qualified name of a torch function (``torch.nn.functional.softmax``, ``torch.Tensor.mul``)."""
    try:
        return _NAMES[func]
    except (KeyError, TypeError):
        pass
    name = resolve_name(func) or f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)}"
    try:
        _NAMES[func] = name
    except TypeError:
        pass
    return name


def _tensors(value: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


class OpRecorder:
    """Wraps the module-call observer of a capture and records ops inside module calls.

    ``enter``/``exit``/``error`` forward to ``inner`` (with op recording
    paused, so that encoding a module's tensors records nothing) and keep the
    stack of module calls; ``node_of`` returns the JSON node the inner
    recorder opened for the call. ``encode(value, name)`` encodes a value and
    never raises; ``on_recorded(op_node, call_node)`` is told of each op node
    added to a call's children. ``start()`` pushes the torch function mode, ``stop()`` pops
    it; ``stop()`` is safe to call twice.
    """

    def __init__(self, inner: Any, selection: OpSelection, encode: Callable[[Any, str], Any],
                 node_of: Callable[[], dict[str, Any]],
                 on_recorded: Callable[[dict[str, Any], dict[str, Any]], None] | None = None) -> None:
        self.inner = inner
        self.on_recorded = on_recorded
        self.selection = selection
        self.encode = encode
        self.node_of = node_of
        self.frames: list[_Frame] = []
        self.paused = 0
        self.recorded = 0
        self.unrecorded = 0  # ops that could not be recorded (never raised into the forward)
        self._mode: _OpMode | None = None

    # --- the module-call observer ---------------------------------------------------------------------------------

    def enter(self, module: nn.Module, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.paused += 1
        try:
            token = self.inner.enter(module, path, args, kwargs)
            node = self.node_of()
        finally:
            self.paused -= 1
        inherited = bool(self.frames) and self.frames[-1].recording and bool(self.selection.inside)
        recording = inherited or self.selection.records_inside(path)
        prefix = fmt.call_prefix(path, node.get(fmt.CALL_INDEX, 0))
        self.frames.append(_Frame(node=node, prefix=prefix, recording=recording))
        return (token, len(self.frames))

    def exit(self, token: Any, output: Any) -> None:
        self._leave(token, self.inner.exit, output)

    def error(self, token: Any, exc: BaseException) -> None:
        self._leave(token, self.inner.error, exc)

    def _leave(self, token: Any, forward: Callable[[Any, Any], None], value: Any) -> None:
        """Close the call's frame (and any left open inside it), then pass the call's end to ``inner``."""
        inner_token, depth = token
        del self.frames[depth - 1:]
        self.paused += 1
        try:
            forward(inner_token, value)
        finally:
            self.paused -= 1

    # --- the torch function mode ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._mode = _OpMode(self)
        self._mode.__enter__()

    def stop(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one intercepted torch function, recording it when selected."""
        frame = self.frames[-1] if self.frames and not self.paused else None
        if frame is None or not frame.recording:
            return func(*args, **kwargs)
        name = op_name(func)
        if not self.selection.records(name):
            return func(*args, **kwargs)
        # An in-place op changes its inputs: encode them before it runs; other ops' inputs once the op is kept.
        in_place = name.endswith("_") and not name.endswith("__") or name.rsplit(".", 1)[-1].startswith("__i")
        before = _tensors((args, kwargs))
        versions = [tensor_version(t) for t in before]
        inputs = self._inputs(frame, name, args, kwargs) if in_place else None
        result = func(*args, **kwargs)
        try:
            outputs = _tensors(result)
            if not outputs or not self._worth_recording(outputs, before, versions):
                return result
            if inputs is None:
                inputs = self._inputs(frame, name, args, kwargs)
            index = frame.next_index
            frame.next_index += 1
            outputs_entry = self.encode(result, fmt.payload_name(self._stem(frame, name, index), fmt.OUTPUTS))
            node = fmt.op_node_entry(frame.node[fmt.MODULE_PATH], frame.node.get(fmt.CALL_INDEX, 0), name, index,
                                     inputs, outputs_entry)
            frame.node.setdefault(fmt.CHILDREN, []).append(node)
            self.recorded += 1
            if self.on_recorded is not None:  # the capture's journal: a process killed later still leaves it
                self.on_recorded(node, frame.node)
        except Exception:  # noqa: BLE001 - recording must never break the user's forward
            self.unrecorded += 1
        return result

    def _worth_recording(self, outputs: list[torch.Tensor], before: list[torch.Tensor],
                         versions: list[int | None]) -> bool:
        if self.selection.min_numel and all(t.numel() < self.selection.min_numel for t in outputs):
            return False
        unchanged = {id(t) for t, v in zip(before, versions) if v is not None and tensor_version(t) == v}
        return not all(id(t) in unchanged for t in outputs)

    def _stem(self, frame: _Frame, name: str, index: int) -> str:
        return f"{frame.prefix}_op{index}_{name.rsplit('.', 1)[-1].strip('_')}"

    def _inputs(self, frame: _Frame, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        stem = self._stem(frame, name, frame.next_index)
        inputs: dict[str, Any] = {}
        if args:
            inputs["args"] = [self._input(arg, f"{stem}_inputs_args_{i}") for i, arg in enumerate(args)]
        if kwargs:
            inputs["kwargs"] = {str(k): self._input(v, f"{stem}_inputs_kwargs_{k}") for k, v in kwargs.items()}
        return inputs

    def _input(self, value: Any, name: str) -> Any:
        """A parameter is the model's, not the computation's: described, not written (a weight is often 100 MB)."""
        if isinstance(value, nn.Parameter):
            return {"py_type": "Parameter", "repr": f"Parameter(shape={list(value.shape)}, dtype={value.dtype})"}
        return self.encode(value, name)


class _OpMode(TorchFunctionMode):
    """Hands every torch function call to the recorder (torch disables the mode while a handler runs)."""

    def __init__(self, recorder: OpRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        return self.recorder.call(func, args, kwargs or {})


def select_ops(
    model: nn.Module,
    ops: bool | Sequence[str],
    *,
    exclude: str | Sequence[str] = (),
    inside: str | Sequence[str] = (),
    min_numel: int = 0,
) -> OpSelection | None:
    """The op selection of ``capture``'s options, checked against ``model``; None when op capture is off.

    Raises:
        UsageError: ``min_numel`` is negative, or an ``inside`` pattern
            matches no module of ``model`` (with the closest paths).
    """
    selection = OpSelection.from_options(ops, exclude=exclude, inside=inside, min_numel=min_numel)
    if selection is None or not selection.inside:
        return selection
    root = type(model).__name__
    paths = [f"{root}.{name}" if name else root for name, _ in model.named_modules()]
    for pattern in selection.inside:
        if not any(OpSelection(inside=(pattern,)).records_inside(path) for path in paths):
            relative = [path.split(".", 1)[1] for path in paths if "." in path]
            close = difflib.get_close_matches(pattern, relative, n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UsageError(f"ops_in pattern {pattern!r} matches no module of {root}{hint}")
    return selection


def op_capture(recorder: Any, selection: OpSelection | None) -> OpRecorder | None:
    """An ``OpRecorder`` wrapping a capture's module-call recorder, or None when ``selection`` is None.

    ``recorder`` is the native capture's recorder: its ``_encode`` encodes
    values without raising and ``stack[-1]`` is the node of the call it just
    opened.
    """
    if selection is None:
        return None
    return OpRecorder(recorder, selection, recorder._encode, lambda: recorder.stack[-1],
                      on_recorded=recorder.op_recorded)
