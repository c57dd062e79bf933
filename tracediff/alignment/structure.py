"""Pairing module calls by structure when their names do not line up.

The calls of each side, in the order they started, are aligned as two
sequences on a signature that ignores dtypes (a bf16 port pairs with its fp32
reference) and names: whether the call is a leaf, the shapes of its input
tensors, and for leaves the shapes of its outputs. Runs of equal signatures
pair one to one. Inside a run that differs on both sides, calls still pair
when their scores agree: the same module type and output shapes, with
name-token similarity and position breaking ties.

Used by ``tracediff.align`` for every call that names and the rename map left
unpaired (``match="auto"``), or for every call (``match="structure"``).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from ..trace.model import Node

_TOKEN = re.compile(r"[a-z]+|\d+")


def signature(node: Node) -> tuple[Any, ...]:
    """What structural matching compares: leaf or not, and the shapes of inputs (and of outputs for leaves)."""
    leaf = not node.children
    shown = node.tensors if leaf else node.inputs()
    return (leaf, tuple((t.slot.split(".")[0], t.shape) for t in shown))


def structural_pairs(nodes_a: list[Node], nodes_b: list[Node]) -> list[tuple[Node, Node]]:
    """Pairs of calls aligned on their signatures, in call order (see the module docstring)."""
    sig_a = [signature(n) for n in nodes_a]
    sig_b = [signature(n) for n in nodes_b]
    matcher = difflib.SequenceMatcher(None, sig_a, sig_b, autojunk=False)
    pairs: list[tuple[Node, Node]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs.extend((nodes_a[i1 + k], nodes_b[j1 + k]) for k in range(i2 - i1))
        elif tag == "replace":
            pairs.extend(_scored_pairs(nodes_a[i1:i2], nodes_b[j1:j2]))
    return pairs


def _scored_pairs(run_a: list[Node], run_b: list[Node]) -> list[tuple[Node, Node]]:
    """Within a differing run, pair calls of the same type and output shapes, in order, best score first."""
    pairs: list[tuple[Node, Node]] = []
    start = 0
    for node_a in run_a:
        scored = [(_score(node_a, run_b[j], j - start), j) for j in range(start, len(run_b))]
        scored = [(score, j) for score, j in scored if score > 0]
        if not scored:
            continue
        _, best = max(scored, key=lambda item: (item[0], -item[1]))
        pairs.append((node_a, run_b[best]))
        start = best + 1
    return pairs


def _score(a: Node, b: Node, distance: int) -> float:
    """0 when the calls cannot be the same computation; higher for the same type, names and nearby positions."""
    if bool(a.children) != bool(b.children) or _main_shape(a) != _main_shape(b):
        return 0.0
    if [t.shape for t in a.inputs()][:1] != [t.shape for t in b.inputs()][:1]:
        return 0.0
    same_type = 0.5 if a.module_type and a.module_type == b.module_type else 0.0
    return 1.0 + same_type + name_similarity(a.relative_path, b.relative_path) - 0.01 * distance


def _main_shape(node: Node) -> tuple[int, ...] | None:
    """The shape of the first output (a tensor, or the first element or field of a tuple or ModelOutput)."""
    outputs = node.outputs()
    return outputs[0].shape if outputs else None


def name_similarity(path_a: str, path_b: str) -> float:
    """Jaccard similarity of the lower-case word and number tokens of two paths (0 to 1)."""
    tokens_a, tokens_b = set(_TOKEN.findall(path_a.lower())), set(_TOKEN.findall(path_b.lower()))
    if not tokens_a or not tokens_b:
        return 0.0
    return len(tokens_a & tokens_b) / len(tokens_a | tokens_b)
