"""Building frozen slotted dataclasses fast: one per tensor record when a trace is read, one per compared tensor.

A frozen dataclass's ``__init__`` stores each field through
``object.__setattr__``: about 9 microseconds for the 39 fields of a
comparison row, which a 400,000-tensor alignment pays 400,000 times.
Calling each slot's descriptor instead still costs about 4.5.

:func:`frozen_builder` returns a function taking the same arguments, with
the same defaults, that builds the instance as an *open twin*: a plain
class with the same ``__slots__`` and no ``__setattr__`` of its own, whose
attribute stores the interpreter does inline. Then it sets ``__class__``
to the frozen class, which Python allows between classes of the same slot
layout. About 1.2 microseconds for a row; the instance is the same, and as
frozen, from the moment the function returns it.

A value decided in stages (an alignment row: measured, then judged) is built
as a *draft* instead: an instance of a subclass of the frozen class that adds
no slots and takes ``object.__setattr__`` and ``object.__delattr__`` back, so
the stages set its fields at the same inline speed. :func:`draft_builder` builds one the same way,
:func:`freeze` turns drafts into the frozen class in place (no copy), after
which they refuse every change like any other instance, and :func:`replaced`
is ``dataclasses.replace`` for either kind at the builders' speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def frozen_builder(cls: type[T]) -> Callable[..., T]:
    """A function building ``cls`` (a frozen dataclass with ``slots=True``, no ``__post_init__``, no factories,
    no base class but ``object``)."""
    slots = _own_slots(cls)
    twin = type(f"_Open{cls.__name__}", (), {"__slots__": slots, "__module__": cls.__module__})
    return _compile(cls, twin, cls)


def draft_builder(draft: type[T]) -> Callable[..., T]:
    """A function building ``draft`` from the fields of its frozen base, without ``__init__``.

    ``draft`` subclasses one class :func:`frozen_builder` accepts, adds no slots (``__slots__ = ()``) and sets
    ``__setattr__ = object.__setattr__`` and ``__delattr__ = object.__delattr__`` (with the frozen class's
    ``__delattr__`` left in place, every store goes through a Python-level lookup: three times slower); its
    instances stay open until :func:`freeze`.
    """
    base = draft.__bases__[0]
    own = vars(draft)
    if (len(draft.__bases__) != 1 or own.get("__slots__") != () or own.get("__setattr__") is not object.__setattr__
            or own.get("__delattr__") is not object.__delattr__):
        raise TypeError(f"{draft.__name__}: expected a subclass of one frozen dataclass with __slots__ = (), "
                        "__setattr__ = object.__setattr__ and __delattr__ = object.__delattr__")
    _own_slots(base)
    return _compile(base, draft, None)


def freeze(drafts: Iterable[Any], cls: type[T]) -> list[T]:
    """``drafts`` (instances of a :func:`draft_builder` class whose base is ``cls``), now instances of ``cls``.

    Each instance changes class in place, so every reference to it sees the frozen value; a frozen instance
    cannot be re-opened this way (its ``__setattr__`` refuses ``__class__`` too).
    """
    out = []
    for draft in drafts:
        if type(draft).__bases__[0] is not cls:
            raise TypeError(f"{type(draft).__name__} is not a draft of {cls.__name__}")
        draft.__class__ = cls
        out.append(draft)
    return out


_BUILDERS: dict[type, Callable[..., Any]] = {}


def replaced(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)`` for a frozen or draft instance of the kinds above (same class,
    a new instance; ``obj`` never changes), built by :func:`frozen_builder` or :func:`draft_builder`."""
    cls = type(obj)
    build = _BUILDERS.get(cls)
    if build is None:
        build = _BUILDERS[cls] = draft_builder(cls) if vars(cls).get("__slots__") == () else frozen_builder(cls)
    values = {f.name: getattr(obj, f.name) for f in fields(obj)}  # type: ignore[arg-type]
    for name, value in changes.items():
        if name not in values:
            raise TypeError(f"{cls.__name__} has no field {name!r}")
        values[name] = value
    built: T = build(**values)
    return built


def _own_slots(cls: type) -> tuple[str, ...]:
    slots = vars(cls).get("__slots__")
    if slots is None or not is_dataclass(cls) or hasattr(cls, "__post_init__") or cls.__bases__ != (object,):
        raise TypeError(f"{cls.__name__}: expected a slotted dataclass of its own, without __post_init__")
    return tuple(slots)


def _compile(cls: type, made: type, final: type | None) -> Callable[..., Any]:
    """``build(...)`` with ``cls``'s fields and defaults: an instance of ``made`` with every field stored, its
    class then set to ``final`` (None: left as ``made``)."""
    params: list[str] = []
    body: list[str] = []
    namespace: dict[str, Any] = {"_new": object.__new__, "_made": made, "_final": final}
    for f in fields(cls):
        if f.default_factory is not MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a default factory is not supported")
        namespace[f"_default_{f.name}"] = f.default
        params.append(f.name if f.default is MISSING else f"{f.name}=_default_{f.name}")
        body.append(f"    obj.{f.name} = {f.name}\n")
    swap = "    obj.__class__ = _final\n" if final is not None else ""
    source = f"def build({', '.join(params)}):\n    obj = _new(_made)\n{''.join(body)}{swap}    return obj\n"
    exec(source, namespace)  # its text is made of the dataclass's own field names only
    built: Callable[..., Any] = namespace["build"]
    return built
