"""Matching the nodes of two traces, and the tensors within matched nodes.

By name (the default): a node of A matches the node of B with the same path
relative to the root (the root's class name is ignored, so ``LlamaModel`` and
``MyLlama`` both start at ``""``) and the same call index. Rename rules,
``[[regex, replacement], ...]`` applied in order with ``re.sub`` to A's
relative paths, bridge implementations whose module names differ.

By structure (the fallback when fewer than half of B's nodes matched by
name): the two traces' nodes, in call order, are aligned as sequences on
their signature (leaf or not, and the shapes and dtypes of inputs, and of
outputs for leaves), and ``suggest_rename`` turns the pairs into rename rules
(layer numbers generalized to ``(\\d+)``) for the user to check and reuse.

Within a matched pair of nodes, tensors pair by slot (``inputs.args.0``,
``outputs.1``...). Inputs passed positionally on one side and by keyword on
the other are then paired in order when shape and dtype agree.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TraceFormatError, UsageError
from ..trace.load import Trace
from ..trace.model import Node, TensorRecord

RenameRules = list[tuple[str, str]]


@dataclass(frozen=True)
class Matching:
    pairs: tuple[tuple[Node, Node], ...]
    unmatched_a: tuple[Node, ...]
    unmatched_b: tuple[Node, ...]
    structural: bool


def load_rename_file(path: str | Path) -> RenameRules:
    """Read ``{"rename": [[regex, replacement], ...]}`` from a JSON file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{p}: rename map not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceFormatError(f"{p}: not a JSON rename map ({e})") from None
    rules = data.get("rename") if isinstance(data, dict) else None
    if not isinstance(rules, list):
        raise TraceFormatError(f'{p}: expected {{"rename": [[regex, replacement], ...]}}')
    return check_rename(rules, source=str(p))


def check_rename(rules: Any, *, source: str = "rename") -> RenameRules:
    """Validate rename rules: a list of ``[regex, replacement]`` pairs whose regexes compile."""
    out: RenameRules = []
    for i, rule in enumerate(rules or []):
        if not (isinstance(rule, (list, tuple)) and len(rule) == 2 and all(isinstance(x, str) for x in rule)):
            raise UsageError(f"{source}: rule {i} is {rule!r}; expected [regex, replacement]")
        try:
            re.compile(rule[0])
        except re.error as e:
            raise UsageError(f"{source}: rule {i} regex {rule[0]!r} does not compile ({e})") from None
        out.append((rule[0], rule[1]))
    return out


def apply_rename(path: str, rules: RenameRules) -> str:
    for pattern, replacement in rules:
        path = re.sub(pattern, replacement, path)
    return path


def match_nodes(a: Trace, b: Trace, rename: RenameRules) -> Matching:
    """Match by renamed path and call index; fall back to structure when fewer than half of B match."""
    nodes_a, nodes_b = a.nodes(), b.nodes()
    by_key = {node.key: node for node in nodes_b}
    pairs = []
    for node in nodes_a:
        other = by_key.pop((node.phase, apply_rename(node.relative_path, rename), node.call_index), None)
        if other is not None:
            pairs.append((node, other))
    structural = 2 * len(pairs) < len(nodes_b)
    if structural:
        pairs = _structural_pairs(nodes_a, nodes_b)
    paired_a = {id(x) for x, _ in pairs}
    paired_b = {id(y) for _, y in pairs}
    return Matching(
        pairs=tuple(sorted(pairs, key=lambda p: p[1].enter_order)),
        unmatched_a=tuple(n for n in nodes_a if id(n) not in paired_a),
        unmatched_b=tuple(n for n in nodes_b if id(n) not in paired_b),
        structural=structural,
    )


def _signature(node: Node) -> tuple[Any, ...]:
    leaf = not node.children
    shown = node.tensors if leaf else node.inputs()
    return (leaf, tuple((t.slot.split(".")[0], t.shape, t.dtype) for t in shown))


def _structural_pairs(nodes_a: list[Node], nodes_b: list[Node]) -> list[tuple[Node, Node]]:
    sig_a = [_signature(n) for n in nodes_a]
    sig_b = [_signature(n) for n in nodes_b]
    matcher = difflib.SequenceMatcher(None, sig_a, sig_b, autojunk=False)
    pairs = []
    for block in matcher.get_matching_blocks():
        pairs.extend((nodes_a[block.a + k], nodes_b[block.b + k]) for k in range(block.size))
    return pairs


_NUMBER = re.compile(r"\d+")


def suggest_rename(pairs: tuple[tuple[Node, Node], ...]) -> RenameRules:
    """Rename rules that map A's paths to B's for every pair, with layer numbers generalized."""
    counts: Counter[tuple[str, str]] = Counter()
    for node_a, node_b in pairs:
        rule = _generalize(node_a.relative_path, node_b.relative_path)
        if rule is not None:
            counts[rule] += 1
    return [rule for rule, _ in counts.most_common()]


def _generalize(path_a: str, path_b: str) -> tuple[str, str] | None:
    if path_a == path_b:
        return None
    numbers_a, numbers_b = _NUMBER.findall(path_a), _NUMBER.findall(path_b)
    if numbers_a and numbers_a == numbers_b:
        pattern = "^" + _NUMBER.sub(r"(\\d+)", re.escape(path_a)) + "$"
        counter = iter(range(1, len(numbers_b) + 1))
        replacement = _NUMBER.sub(lambda _m: f"\\{next(counter)}", path_b.replace("\\", "\\\\"))
        return pattern, replacement
    return "^" + re.escape(path_a) + "$", path_b.replace("\\", "\\\\")


def pair_tensors(
    node_a: Node, node_b: Node
) -> tuple[list[tuple[TensorRecord, TensorRecord]], list[TensorRecord], list[TensorRecord]]:
    """Pair the tensors of two matched nodes; returns (pairs, only in A, only in B)."""
    by_slot_b = {t.slot: t for t in node_b.tensors}
    pairs, left_a = [], []
    for t in node_a.tensors:
        other = by_slot_b.pop(t.slot, None)
        if other is not None:
            pairs.append((t, other))
        else:
            left_a.append(t)
    left_b = list(by_slot_b.values())
    # An input passed positionally on one side and by keyword on the other.
    spare_a = [t for t in left_a if t.slot.startswith("inputs")]
    spare_b = [t for t in left_b if t.slot.startswith("inputs")]
    for ta, tb in zip(spare_a, spare_b):
        if ta.shape == tb.shape and ta.dtype == tb.dtype:
            pairs.append((ta, tb))
            left_a.remove(ta)
            left_b.remove(tb)
    if not node_a.has_outputs or not node_b.has_outputs:  # pruned parent outputs: not a mismatch
        left_a = [t for t in left_a if not t.slot.startswith("outputs")]
        left_b = [t for t in left_b if not t.slot.startswith("outputs")]
    return pairs, left_a, left_b
