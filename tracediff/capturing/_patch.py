"""Wrapping and restoring ``forward`` on every module of a model.

We wrap ``forward`` (as transformers' debugger does) rather than register
hooks, because a forward hook cannot tell a module that raised from one that
returned ``None``. The patch remembers whether each module had its own
``forward`` attribute and puts back exactly that, so the model leaves the
context as it entered it.

Under ``torch.compile`` Dynamo traces the wrapper: it then records through the opaque op of
:mod:`.record_op` instead of calling the observer, and :mod:`.compiled` decides which callables are
wrapped (the model's own paths; with ``compiled="regions"``, compiled regions entered from outside).
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch import nn

from .compiled import patch_plan
from .observer import CallObserver
from .record_op import Lost, recorded_in_graph, register_site, release_sites, site_code

_MISSING = object()


class ForwardPatch:
    """Wraps the ``forward`` of ``model`` and all its submodules; undone by ``restore()``.

    ``root_name`` prefixes every path (``LlamaModel.layers.0``); the root
    module itself is reported as ``root_name``. ``child_grad_mode`` wraps the
    original forward of every submodule (not the root) in a context, e.g.
    ``torch.no_grad`` for the standard debugger's behaviour. ``lost`` is told of
    a call recorded inside compiled code whose record cannot be placed.
    """

    def __init__(
        self,
        model: nn.Module,
        observer: CallObserver,
        *,
        root_name: str,
        child_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        compiled_regions_only: bool = False,
        lost: Lost | None = None,
    ) -> None:
        self._saved: list[tuple[nn.Module, str, Any]] = []
        self._sites: list[int] = []  # where a compiled graph's records go (record_op.py)
        self._observer = observer
        self._child_context = child_context
        # compiled.py: the model's own paths under torch.compile; compiled regions entered from outside
        for name, module, attribute in patch_plan(model, regions_only=compiled_regions_only):
            path = f"{root_name}.{name}" if name else root_name
            self._saved.append((module, attribute, module.__dict__.get(attribute, _MISSING)))
            site = register_site(module, path, observer, attribute, lost=lost)
            self._sites.append(site)
            setattr(module, attribute, self._wrap(module, path, getattr(module, attribute), site, is_root=not name))

    def _wrap(self, module: nn.Module, path: str, original: Callable[..., Any], site: int, *, is_root: bool
              ) -> Callable[..., Any]:
        observer = self._observer
        context = None if is_root else self._child_context

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            if torch.compiler.is_compiling():  # Dynamo traces this call: record from inside the graph instead
                with context() if context is not None else contextlib.nullcontext():
                    return recorded_in_graph(site, original, args, kwargs)
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

        function = cast(types.FunctionType, forward)  # Dynamo's compiled variants are kept per code object
        function.__code__ = site_code(site, function.__code__)
        return forward

    def restore(self) -> None:
        """Put back every module's ``forward`` as it was before the patch."""
        release_sites(self._sites)
        self._sites.clear()
        for module, attribute, saved in reversed(self._saved):
            if saved is _MISSING:
                module.__dict__.pop(attribute, None)
            else:
                setattr(module, attribute, saved)
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
