"""Wrapping ``__call__`` on the classes of a model whose modules are called through their class (MLX, Flax NNX).

Python looks ``__call__`` up on the type, so a call cannot be intercepted per instance as torch's ``forward``
is (``_patch.py``). ``ClassCallPatch`` wraps ``__call__`` on each class the model's modules have, for the
duration of a capture: a call of one of the model's own instances is reported to the recorder, under its
path, with its arguments and result as ``host`` gives them (host copies the recorder can write); every
other call (an instance outside the model, a subclass's ``super().__call__``) passes straight through.
``restore()`` puts back exactly what each class had in its own ``__dict__``. A class that defines no
``__call__`` (a container) is left alone.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from .observer import CallObserver

_MISSING = object()


def module_paths(named: Iterable[tuple[str, Any]], root_name: str) -> dict[int, tuple[Any, str]]:
    """``id(module) -> (module, path)`` for ``(dotted name, module)`` pairs; a shared module keeps its shortest
    name, as torch's ``named_modules()`` keeps one."""
    names: dict[int, tuple[Any, list[str]]] = {}
    for name, module in named:
        names.setdefault(id(module), (module, []))[1].append(name)
    paths: dict[int, tuple[Any, str]] = {}
    for key, (module, found) in names.items():
        name = min(found, key=lambda n: (n.count("."), n))
        paths[key] = (module, f"{root_name}.{name}" if name else root_name)
    return paths


def replace_arrays(value: Any, array_type: type, host: Callable[[Any], Any]) -> Any:
    """``value`` with every ``array_type`` instance, nested in lists, tuples (named ones keep their type) and
    dicts too, replaced by ``host(array)``; everything else as it is."""
    if isinstance(value, array_type):
        return host(value)
    if isinstance(value, list):
        return [replace_arrays(item, array_type, host) for item in value]
    if isinstance(value, tuple):
        items = [replace_arrays(item, array_type, host) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {key: replace_arrays(item, array_type, host) for key, item in value.items()}
    return value


class HostCopies:
    """One host copy per living array: an array seen again (one module's output is the next one's input)
    gives the same copy while it lives, so its payload is written once.

    ``copy(array)`` makes the copy; when it raises (a tracer, a dtype torch cannot hold), the array itself is
    returned and recorded as its ``repr``.
    """

    def __init__(self, copy: Callable[[Any], Any]) -> None:
        self._copy = copy
        self._copies: dict[int, tuple[Callable[[], Any], Any]] = {}

    def __call__(self, array: Any) -> Any:
        key = id(array)
        held = self._copies.get(key)
        if held is not None and held[0]() is array:
            return held[1]
        try:
            copy = self._copy(array)
        except Exception:  # noqa: BLE001 - recording must never break the user's forward
            return array

        def forget(_ref: Any, key: int = key) -> None:
            self._copies.pop(key, None)

        try:
            ref: Callable[[], Any] = weakref.ref(array, forget)
        except TypeError:  # an array type without weak references: kept for the capture
            ref = functools.partial(_same, array)
        self._copies[key] = (ref, copy)
        return copy


def _same(value: Any) -> Any:
    return value


def class_call(cls: type) -> Callable[..., Any] | None:
    """The ``__call__`` an instance of ``cls`` runs (the nearest class in the MRO defining one), or None."""
    return next((c.__dict__["__call__"] for c in cls.__mro__ if "__call__" in c.__dict__ and c is not object),
                None)


class ClassCallPatch:
    """Wraps ``__call__`` of every class in ``paths`` (``id -> (module, path)``); undone by ``restore()``."""

    def __init__(self, paths: dict[int, tuple[Any, str]], observer: CallObserver,
                 host: Callable[[Any], Any]) -> None:
        self._saved: list[tuple[type, Any]] = []
        self._paths = paths
        self._observer = observer
        self._host = host
        classes = {type(module): None for module, _ in paths.values()}
        try:
            for cls in classes:
                original = class_call(cls)
                if original is None:
                    continue
                self._saved.append((cls, cls.__dict__.get("__call__", _MISSING)))
                setattr(cls, "__call__", self._wrap(cls, original))  # noqa: B010
        except BaseException:
            self.restore()
            raise

    def _wrap(self, cls: type, original: Callable[..., Any]) -> Callable[..., Any]:
        paths, observer, host = self._paths, self._observer, self._host

        @functools.wraps(original)
        def call(module: Any, *args: Any, **kwargs: Any) -> Any:
            known = paths.get(id(module))
            if type(module) is not cls or known is None or known[0] is not module:
                return original(module, *args, **kwargs)
            token = observer.enter(module, known[1], host(args), host(kwargs))
            try:
                out = original(module, *args, **kwargs)
            except BaseException as exc:
                observer.error(token, exc)
                raise
            observer.exit(token, host(out))
            return out

        return call

    def restore(self) -> None:
        """Put back every class's ``__call__`` as it was before the patch."""
        for cls, saved in reversed(self._saved):
            if saved is _MISSING:
                if "__call__" in cls.__dict__:
                    delattr(cls, "__call__")
            else:
                setattr(cls, "__call__", saved)  # noqa: B010 - a dunder put back on the class
        self._saved.clear()
