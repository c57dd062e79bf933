"""The parameter names of each module class's ``forward``, for the metadata's ``forward_parameters``.

A trace records positional arguments as ``inputs.args.N``; with these names an aligner can tell that A's
``args.1`` is ``cos`` and B's ``kwargs.attention_mask`` is something else, instead of guessing from shapes.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from torch import nn

_MARKS = {
    inspect.Parameter.VAR_POSITIONAL: "*",
    inspect.Parameter.VAR_KEYWORD: "**",
}


def forward_parameters(model: nn.Module | Iterable[Any], *, method: str = "forward") -> dict[str, list[str]]:
    """``{class name: parameter names of its forward}`` for every module class in ``model`` (spec section 7).

    ``method`` is the method a call runs: ``"forward"`` for torch, ``"__call__"`` for MLX and Flax NNX
    modules. ``model`` may also be the modules themselves (an iterable).

    ``self`` is left out; ``*args`` is written ``"*args"``, ``**kwargs`` ``"**kwargs"``, and ``"*"`` comes
    before keyword-only parameters, as Python writes a signature. A class name two classes share with
    different parameters, and a ``forward`` whose signature cannot be read, are left out.
    """
    found: dict[str, list[str] | None] = {}
    seen: set[type] = set()
    for module in model.modules() if isinstance(model, nn.Module) else model:
        cls = type(module)
        if cls in seen:
            continue
        seen.add(cls)
        names = _parameter_names(cls, method)
        name = cls.__name__
        if name in found and found[name] != names:
            names = None  # two classes, one name, other parameters: the name cannot say which
        found[name] = names
    return {name: names for name, names in found.items() if names is not None}


def _parameter_names(cls: type, method: str) -> list[str] | None:
    try:
        parameters = list(inspect.signature(getattr(cls, method)).parameters.values())
    except (TypeError, ValueError, AttributeError):
        return None
    names: list[str] = []
    starred = False
    for parameter in parameters[1:] if parameters and parameters[0].name == "self" else parameters:
        if parameter.kind in _MARKS:
            starred = starred or parameter.kind is inspect.Parameter.VAR_POSITIONAL
            names.append(_MARKS[parameter.kind] + parameter.name)
            continue
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not starred:
            names.append("*")
            starred = True
        names.append(parameter.name)
    return names
