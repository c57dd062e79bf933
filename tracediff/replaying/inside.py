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

from collections.abc import Callable, Container, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

from torch import nn

from ..trace.model import Node
from .culprits import PASSING
from .inputs import NotRebuildable
from .patching import Replacements, kept, patched
from .runner import CallOutcome, CallSetup, judged_outputs, replay_call

#: ``(relative path, call index)`` of a call of B
CallKey = tuple[str, int]


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


def judged_in_run(host_setup: CallSetup, calls: dict[CallKey, CallSetup], *, model: nn.Module,
                  twin: Callable[[], nn.Module | None], index: Callable[[str, int], int | None],
                  oracle: bool, replacements: Replacements | None = None) -> dict[CallKey, CallOutcome]:
    """Rerun the host's call on A's inputs and judge what ``calls`` produced inside it against A's outputs,
    with the float64 twin's output when the twin ran (it runs when one of them is out of tolerance). ``twin``
    gives the whole float64 copy of ``model`` once it exists; ``index`` maps the k-th call of a path in the
    rerun to its call index in B's forward; ``replacements``: calls whose outputs are A's in that run (culprits
    inside a call judged there, to see whether they explain it). A call that did not run there is left out."""
    kept_b: dict[CallKey, Any] = {}
    kept_64: dict[CallKey, Any] = {}

    @contextmanager
    def hooked(whole: nn.Module, into: dict[CallKey, Any]) -> Iterator[None]:
        with ExitStack() as stack:
            if replacements:
                stack.enter_context(patched(whole, replacements, index))
            stack.enter_context(kept(whole, set(calls), index, into))
            yield

    judged: dict[CallKey, CallOutcome] = {}  # without the float64 output: kept unless the twin runs

    def out_of_tolerance() -> bool:
        judged.update({key: judged_outputs(setup, kept_b[key], oracle=oracle) for key, setup in calls.items()
                       if key in kept_b})
        return any(row.within_tolerance is False for outcome in judged.values() for row in outcome.rows)

    def twin_kept() -> Any:  # called only once the float64 copy exists
        whole = twin()
        assert whole is not None
        return hooked(whole, kept_64)

    try:
        replay_call(host_setup, oracle=oracle, patch=lambda: hooked(model, kept_b),
                    twin_patch=twin_kept, twin_wanted=out_of_tolerance)
        return {key: judged[key] if key in judged and key not in kept_64
                else judged_outputs(calls[key], output, kept_64.get(key), oracle=oracle)
                for key, output in kept_b.items()}
    except NotRebuildable:
        return {}
    finally:
        for setup in (host_setup, *calls.values()):
            setup.tensors.clear()
