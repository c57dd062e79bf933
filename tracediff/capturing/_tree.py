"""Operations on the JSON call tree of the standard trace.

These follow the semantics of transformers' debugger so that a tree pruned
here reads exactly like one pruned there.
"""

from __future__ import annotations

import copy
import re
from typing import Any

Node = dict[str, Any]

_LAYER_SUFFIX = re.compile(r"(.*)\.(\d+)$")


def drop_parent_outputs(node: Node) -> None:
    """Remove ``outputs`` from every node that has children (leaves keep theirs)."""
    if node.get("children"):
        node.pop("outputs", None)
        for child in node["children"]:
            drop_parent_outputs(child)


def _is_layer_block(node: Node) -> bool:
    match = _LAYER_SUFFIX.match(node.get("module_path", ""))
    if not match or not node.get("children"):
        return False
    marker = f".{match.group(2)}."
    return any(marker in child.get("module_path", "") for child in node["children"])


def prune_intermediate_layers(node: Node) -> None:
    """Keep only the first and last of three or more numbered layer blocks, recursively."""
    children = node.get("children")
    if not children:
        return
    blocks = [i for i, child in enumerate(children) if _is_layer_block(child)]
    if len(blocks) > 2:
        dropped = set(blocks[1:-1])
        node["children"] = [child for i, child in enumerate(children) if i not in dropped]
    for child in node["children"]:
        prune_intermediate_layers(child)


def without_values(tree: Node) -> Node:
    """A deep copy of ``tree`` with every ``value`` key removed (tensor payload paths and repr lines)."""
    out = copy.deepcopy(tree)
    _strip_values(out)
    return out


def _strip_values(value: Any) -> None:
    if isinstance(value, dict):
        value.pop("value", None)
        for item in value.values():
            _strip_values(item)
    elif isinstance(value, list):
        for item in value:
            _strip_values(item)


def trace_file_names(model_name: str) -> tuple[str, str]:
    """The FULL_TENSORS and SUMMARY JSON file names of a trace of ``model_name``."""
    base = f"{model_name}_debug_tree"
    return f"{base}_FULL_TENSORS.json", f"{base}_SUMMARY.json"
