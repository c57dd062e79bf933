"""Wrapping and restoring ``forward`` on every module of a model.

We wrap ``forward`` (as transformers' debugger does) rather than register
hooks, because a forward hook cannot tell a module that raised from one that
returned ``None``. The patch remembers whether each module had its own
``forward`` attribute and puts back exactly that, so the model leaves the
context as it entered it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

_MISSING = object()


class CallObserver(Protocol):
    """What a patched call reports to (a torch or an MLX module). None of these may raise."""

    def enter(self, module: Any, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...

    def exit(self, token: Any, output: Any) -> None: ...

    def error(self, token: Any, exc: BaseException) -> None: ...


class ForwardPatch:
    """Wraps the ``forward`` of ``model`` and all its submodules; undone by ``restore()``.

    ``root_name`` prefixes every path (``LlamaModel.layers.0``); the root
    module itself is reported as ``root_name``. ``child_grad_mode`` wraps the
    original forward of every submodule (not the root) in a context, e.g.
    ``torch.no_grad`` for the standard debugger's behaviour.
    """

    def __init__(
        self,
        model: nn.Module,
        observer: CallObserver,
        *,
        root_name: str,
        child_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        self._saved: list[tuple[nn.Module, Any]] = []
        self._observer = observer
        self._child_context = child_context
        for name, module in model.named_modules():
            path = f"{root_name}.{name}" if name else root_name
            self._saved.append((module, module.__dict__.get("forward", _MISSING)))
            module.forward = self._wrap(module, path, is_root=not name)

    def _wrap(self, module: nn.Module, path: str, *, is_root: bool) -> Callable[..., Any]:
        original = module.forward
        observer = self._observer
        context = None if is_root else self._child_context

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            token = observer.enter(module, path, args, kwargs)
            try:
                if context is None:
                    out = original(*args, **kwargs)
                else:
                    with context():
                        out = original(*args, **kwargs)
            except BaseException as exc:
                observer.error(token, exc)
                raise
            observer.exit(token, out)
            return out

        return forward

    def restore(self) -> None:
        """Put back every module's ``forward`` as it was before the patch."""
        for module, saved in reversed(self._saved):
            if saved is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.forward = saved
        self._saved.clear()


@contextlib.contextmanager
def print_options(**options: Any) -> Iterator[None]:
    """Set torch print options inside the block and restore the previous ones after."""
    from torch._tensor_str import PRINT_OPTS

    previous = dict(vars(PRINT_OPTS))
    torch.set_printoptions(**options)
    try:
        yield
    finally:
        for key, value in previous.items():
            setattr(PRINT_OPTS, key, value)
