"""Judging a call that cannot run alone inside its parent's run on A's inputs.

Some calls of B cannot be replayed alone: they pair with A's call on their outputs only (a block cut at
another point: transformer-lens's ``attn`` against the output projection of transformers' BLOOM
attention, whose inputs A never recorded), or their inputs cannot be rebuilt from A's trace. The
innermost replayed call around them (their *host*) runs them too, on A's inputs: what they produce
there, compared with A's recorded outputs under the same oracle rule (the host's float64 run gives
their exact output), is their local error, **provided their inputs in that run are A's up to noise**.

The rule that makes sure of it without guessing: the host's inputs are A's (every replayed call's are,
unless A's trace holds ``None`` where B passes a tensor), and every call of B that ran before them
inside the host's run and has a partner in A was judged the same math. When it does not hold, they stay
unjudged and :func:`blocker` says why. What it cannot check: the host's own code between its submodule
calls, and calls of B with no partner in A, that feed them; a mistake there is named at them.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from ..trace.model import Node
from .culprits import PASSING


def host(node_b: Node, replayed: Container[int]) -> Node | None:
    """The innermost call around ``node_b`` (by ``id``) that was replayed on A's inputs; None without one."""
    parent = node_b.parent
    while parent is not None:
        if id(parent) in replayed:
            return parent
        parent = parent.parent
    return None


def earlier(node_b: Node, around: Node) -> list[Node]:
    """The calls inside ``around``'s run that ran before ``node_b`` started (its ancestors, still running
    then, left out), in the order they started."""
    running = set()
    parent = node_b.parent
    while parent is not None and parent is not around:
        running.add(id(parent))
        parent = parent.parent
    return [n for n in around.walk()[1:] if n.enter_order < node_b.enter_order and id(n) not in running]


def blocker(node_b: Node, around: Node, partnered: Container[int], verdicts: Mapping[int, str]) -> str:
    """Why ``node_b``'s inputs in ``around``'s run may not be A's ("" when they are, by the rule above):
    the first call before it there that has a partner in A (``partnered``, by ``id``) and whose verdict
    (``verdicts``, by ``id``) is not the same math."""
    for node in earlier(node_b, around):
        if id(node) not in partnered:
            continue
        verdict = verdicts.get(id(node))
        if verdict is None:
            return f"{node.module_path} (call {node.call_index}) ran before it there and was not judged"
        if verdict not in PASSING:
            return f"{node.module_path} (call {node.call_index}) ran before it there: {verdict}"
    return ""
