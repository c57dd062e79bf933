"""Which module calls of B are ranked: leaves, decoder layers, or the calls a glob names.

* ``"layers"`` (the default): each element of a repeated block list (a
  ``ModuleList`` or ``Sequential`` of two or more modules of one type that
  hold submodules: a decoder's ``layers``, GPT-2's ``h``). Outermost lists
  only. N is the number of layers: the cheapest choice.
* ``"leaves"``: every module without submodules that holds a parameter
  (Linear, Embedding, norms; a quantized Linear keeps its path). The finest
  choice: N is about seven per decoder layer.
* any other string (or several): globs over B's module paths, relative
  (``model.layers.*.mlp``) or full (``LlamaForCausalLM.model.layers.0``), in
  transformers' convention (:mod:`tracediff.globs`): ``*`` is one path
  segment, ``**`` any number (``model.layers.*`` is the layers, not what is
  inside them).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..errors import UsageError
from ..globs import matches_any
from ..trace.model import Node

LAYERS = "layers"
LEAVES = "leaves"


def granularity_patterns(modules: str | Sequence[str]) -> list[str]:
    patterns = [modules] if isinstance(modules, str) else list(modules)
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise UsageError(f"modules={modules!r}: expected 'layers', 'leaves' or globs over module paths")
    return patterns


def layer_paths(model: nn.Module) -> list[str]:
    """Relative paths of the elements of the outermost repeated block lists of ``model``."""
    found: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or any(name.startswith(f"{p}.") for p in found):
            continue
        children = list(module.named_children())
        if len(children) >= 2 and len({type(c) for _, c in children}) == 1 and \
                all(any(True for _ in c.children()) for _, c in children):
            found.extend(f"{name}.{child}" if name else child for child, _ in children)
    return found


def leaf_paths(model: nn.Module) -> list[str]:
    """Relative paths of the modules without submodules that own a parameter."""
    return [name for name, module in model.named_modules() if name and not any(True for _ in module.children())
            and any(True for _ in module.parameters(recurse=False))]


def selected_calls(model: nn.Module, calls: Sequence[Node], modules: str | Sequence[str]) -> tuple[list[Node], str]:
    """B's calls to rank (in execution order) and the granularity's name; raises ``UsageError`` when none."""
    patterns = granularity_patterns(modules)
    if patterns == [LAYERS]:
        wanted = set(layer_paths(model))
        if not wanted:
            raise UsageError(f"--modules layers: {type(model).__name__} has no repeated block list (a ModuleList of "
                             "layers); use --modules leaves or a glob")
        chosen = [n for n in calls if n.relative_path in wanted]
        return chosen, LAYERS
    if patterns == [LEAVES]:
        wanted = set(leaf_paths(model))
        return [n for n in calls if n.relative_path in wanted], LEAVES
    chosen = [n for n in calls if n.relative_path and any(
        matches_any(name, patterns) for name in (n.relative_path, n.module_path))]
    if not chosen:
        raise UsageError(f"--modules {' '.join(patterns)}: matches no module call of {type(model).__name__}")
    return chosen, "glob"
