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

from ...trace.model import Node

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
    partner: dict[int, int] = {}
    for block in matcher.get_matching_blocks():
        partner.update({block.a + k: block.b + k for k in range(block.size)})
    _fill_gaps(nodes_a, nodes_b, partner)
    return [(nodes_a[i], nodes_b[j]) for i, j in sorted(partner.items())]


def _fill_gaps(nodes_a: list[Node], nodes_b: list[Node], partner: dict[int, int]) -> None:
    """Pair the calls left between two aligned runs with the best-scoring call in the same gap of B."""
    taken = set(partner.values())
    next_partner = [len(nodes_b)] * (len(nodes_a) + 1)  # the smallest partner index after each call of A
    for i in range(len(nodes_a) - 1, -1, -1):
        next_partner[i] = min(next_partner[i + 1], partner.get(i + 1, len(nodes_b))) if i + 1 < len(nodes_a) \
            else len(nodes_b)
    low = -1
    for i in range(len(nodes_a)):
        if i in partner:
            low = max(low, partner[i])
            continue
        scored = [(_score(nodes_a[i], nodes_b[j], j - low), j) for j in range(low + 1, next_partner[i])
                  if j not in taken]
        scored = [(score, j) for score, j in scored if score > 0]
        if scored:
            _, best = max(scored, key=lambda item: (item[0], -item[1]))
            partner[i] = best
            taken.add(best)
            low = best


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
