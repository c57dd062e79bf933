"""Which of B's calls replays which of A's: B's whole forward on A's top-level inputs gives B's call tree
(:mod:`.shadow`), whose calls are matched to A's nodes as ``align`` matches two traces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..alignment.pairing.calls import match_nodes
from ..alignment.pairing.slots import inputs_set_aside
from ..maps.rules import apply_rename
from ..trace.model import Node
from .end_to_end import end_to_end_error
from .inputs import NotRebuildable, Target, fresh_caches, rebuild_inputs
from .job import Ledger, Setting
from .layout import bound_to
from .result import SkippedCall
from .shadow import ShadowRun, shadow_run

_OUTPUTS_ONLY = ("paired with A's call on its outputs only: its inputs are not the inputs A's call recorded "
                 "(they differ by design, or the map sets them aside)")


@dataclass
class BOnA:
    """B's whole forward on A's top-level inputs: its call tree, the inputs it ran on, its end-to-end error."""

    shadow: ShadowRun = field(default_factory=lambda: ShadowRun(trace=None))
    root_inputs: tuple[tuple[Any, ...], dict[str, Any]] | None = None
    end_to_end: dict[str, Any] | None = None


def run_b_on_a(setting: Setting, ledger: Ledger) -> BOnA:
    """Rebuild A's top-level inputs and run B's whole forward on them (warnings say why when that fails)."""
    found = BOnA()
    trace, model = setting.trace, setting.model
    root_a = trace.roots[0]
    try:
        found.root_inputs = rebuild_inputs(trace, root_a, Target(setting.device, setting.model_dtype),
                                           own=fresh_caches(trace, root_a))
    except NotRebuildable as e:
        ledger.warnings.append(f"A's top-level inputs cannot be rebuilt ({e}): calls are matched by name only, "
                               "and there is no end-to-end error")
        return found
    with setting.b.call_tree():  # the call tree's hooks read statistics: eager
        found.shadow = shadow_run(model, *found.root_inputs, seed=setting.seed)
        rebound = bound_to(model.forward, *found.root_inputs) if found.shadow.error else None
        retried = shadow_run(model, *rebound, seed=setting.seed) if rebound is not None else None
    if rebound is not None and retried is not None and retried.error is None:
        # B's forward names its inputs otherwise: A's keywords passed by position
        found.shadow, found.root_inputs = retried, rebound
        ledger.warnings.append("B's forward does not take A's top-level keywords: they were passed by position")
    if found.shadow.error is not None:
        ledger.warnings.append(f"B's forward on A's top-level inputs raised {found.shadow.error}: calls are "
                               "matched by name only")
        return found
    output = setting.b.final_output(found.shadow.output, found.root_inputs, setting.seed, ledger.warnings)
    found.end_to_end = end_to_end_error(trace, output)
    return found


def paired_calls(setting: Setting, shadow: ShadowRun, ledger: Ledger) -> list[tuple[Node, Node]]:
    """``(A's node, B's node)`` of every forward call to replay; the calls left out are in ``ledger``."""
    if shadow.trace is None:
        return _paired_by_name(setting, ledger)
    matching = match_nodes(setting.trace, shadow.trace, setting.rules, setting.match)
    if matching.structural:
        ledger.warnings.append("module paths did not line up by name: calls were matched by structure; "
                               "pass rename rules (--map) to match them by name")
    _warn_unmatched_a(setting, matching.unmatched_a, ledger)
    unmatched = {id(node) for node in matching.unmatched_b}
    paired = {id(b) for _, b in matching.pairs}
    for node in shadow.trace.nodes():
        if id(node) in unmatched:
            reason = "no call in A's trace matches it"
        elif id(node) not in paired:
            reason = ("A's trace did not record it (a layer block the standard trace pruned; capture A "
                      "with tracediff.capture, which keeps every layer)")
        else:
            continue
        ledger.skipped.append(SkippedCall(module_path_b=node.module_path, call_index=node.call_index,
                                          reason=reason))
    pairs = []
    for a, b in matching.pairs:
        if a.phase != "forward":
            continue
        ledger.partnered.add(id(b))
        if (id(a), id(b)) in matching.outputs_only or inputs_set_aside(a, b, setting.slots):
            ledger.skip(a, b, _OUTPUTS_ONLY, unjudged=True)
            continue
        pairs.append((a, b))
    return pairs


def _paired_by_name(setting: Setting, ledger: Ledger) -> list[tuple[Node, Node]]:
    """Without B's call tree: each of A's forward calls paired with B's module at its renamed path."""
    pairs = []
    for node in (n for n in setting.trace.nodes() if n.phase == "forward"):
        relative = apply_rename(node.relative_path, setting.rules)
        path_b = f"{setting.root_name}.{relative}" if relative else setting.root_name
        if relative not in setting.modules:
            ledger.skipped.append(SkippedCall(module_path_b=path_b, call_index=node.call_index,
                                              module_path_a=node.module_path, reason="B has no such module"))
            continue
        node_b = Node(module_path=path_b, relative_path=relative, call_index=node.call_index,
                      module_type=type(setting.modules[relative]).__name__, depth=node.depth,
                      enter_order=node.enter_order)
        if inputs_set_aside(node, node_b, setting.slots):
            ledger.skip(node, node_b, _OUTPUTS_ONLY, unjudged=True)
            continue
        pairs.append((node, node_b))
    return pairs


def _warn_unmatched_a(setting: Setting, nodes: tuple[Node, ...], ledger: Ledger) -> None:
    later = len(setting.trace.roots) - 1
    if later:
        ledger.warnings.append(f"A's trace holds {later} later top-level call(s) of the model; only the first "
                               "is replayed")
    in_later = {id(n) for root in setting.trace.roots[1:] for n in root.walk()}
    own = [n for n in nodes if n.phase == "forward" and id(n) not in in_later]
    named = [n.module_path for n in own][:3]
    if named:
        ledger.warnings.append(f"{len(own)} call(s) of A match no call of B (e.g. {', '.join(named)}); pass "
                               "rename rules (--map) if B names them differently")
