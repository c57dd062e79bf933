"""Operations on the JSON call tree of the standard trace.

These follow the semantics of transformers' debugger so that a tree pruned
here reads exactly like one pruned there.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from ..format import CHILDREN, MODULE_PATH, OUTPUTS, VALUE, trace_file_names

__all__ = ["drop_parent_outputs", "prune_intermediate_layers", "without_values", "trace_file_names"]

Node = dict[str, Any]

_LAYER_SUFFIX = re.compile(r"(.*)\.(\d+)$")


def drop_parent_outputs(node: Node) -> None:
    """Remove ``outputs`` from every node that has children (leaves keep theirs)."""
    if node.get(CHILDREN):
        node.pop(OUTPUTS, None)
        for child in node[CHILDREN]:
            drop_parent_outputs(child)


def _is_layer_block(node: Node) -> bool:
    match = _LAYER_SUFFIX.match(node.get(MODULE_PATH, ""))
    if not match or not node.get(CHILDREN):
        return False
    marker = f".{match.group(2)}."
    return any(marker in child.get(MODULE_PATH, "") for child in node[CHILDREN])


def prune_intermediate_layers(node: Node) -> None:
    """Keep only the first and last of three or more numbered layer blocks, recursively."""
    children = node.get(CHILDREN)
    if not children:
        return
    blocks = [i for i, child in enumerate(children) if _is_layer_block(child)]
    if len(blocks) > 2:
        dropped = set(blocks[1:-1])
        node[CHILDREN] = [child for i, child in enumerate(children) if i not in dropped]
    for child in node[CHILDREN]:
        prune_intermediate_layers(child)


def without_values(tree: Node) -> Node:
    """A deep copy of ``tree`` with every ``value`` key removed, at any depth: the standard SUMMARY file.

    transformers' debugger strips the key from every dict, so a keyword
    argument named ``value`` disappears from its SUMMARY file too; the drop-in
    does the same to stay byte-identical. tracediff's own traces strip tensor
    entries only (``format.is_tensor_entry``).
    """
    out = copy.deepcopy(tree)
    _strip_values(out)
    return out


def _strip_values(value: Any) -> None:
    if isinstance(value, dict):
        value.pop(VALUE, None)
        for item in value.values():
            _strip_values(item)
    elif isinstance(value, list):
        for item in value:
            _strip_values(item)
