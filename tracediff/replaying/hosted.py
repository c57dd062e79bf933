"""The calls that could not run alone, judged inside the run of the innermost replayed call around them,
when every paired call before them there was judged the same math (the rule is :mod:`.inside`'s)."""

from __future__ import annotations

from dataclasses import replace

from ..trace.model import Node
from .calls import CallRuns, Done, rerun_index
from .inside import blocker, host, judged_in_run
from .job import Ledger
from .runner import CallOutcome, CallSetup, inputs_not_equivalent


def judge_unrun(runs: CallRuns, done: list[Done], orders: dict[int, int]) -> None:
    """Judge each of ``runs.ledger.unrun`` inside its host's run; the ones judged join ``done`` and leave the
    skipped calls, the others say why they were not."""
    ledger, setting = runs.ledger, runs.setting
    if runs.shadow.trace is None or not ledger.unrun:
        return
    replayed = {id(d.node_b): d for d in done if d.outcome.rows}  # the ones whose module ran
    verdicts = {id(d.node_b): d.outcome.verdict for d in done}
    settled: dict[int, str] = {}  # B's call (by id) -> "" once judged, else why it stays skipped
    hosted: dict[int, dict[tuple[str, int], CallSetup]] = {}
    todo: list[tuple[Node, Node, str, Node]] = []  # the hosted calls, with their host
    known = ledger.partnered - {id(b) for _, b, _ in ledger.unrun}  # no verdict yet for the others
    for node_a, node_b, reason in ledger.unrun:
        around = host(node_b, replayed)
        if around is None or not node_a.outputs() or node_b.relative_path not in setting.modules:
            continue
        why = inputs_not_equivalent(replayed[id(around)].setup) or blocker(node_b, around, known, verdicts)
        if why:  # settled before any rerun
            settled[id(node_b)] = f"{reason}; not judged inside {around.module_path}'s run either: {why}"
            continue
        setup = runs.setup(node_a, node_b)
        assert setup is not None  # its module exists and A recorded its outputs (checked above)
        hosted.setdefault(id(around), {})[(node_b.relative_path, node_b.call_index)] = setup
        todo.append((node_a, node_b, reason, around))
    outcomes: dict[tuple[str, int], CallOutcome] = {}
    for key, calls in hosted.items():
        outcomes.update(judged_in_run(replayed[key].setup, calls, model=setting.model, twin=lambda: runs.twin,
                                      index=rerun_index(replayed[key].node_b), oracle=setting.oracle))
    for node_a, node_b, reason, around in sorted(todo, key=lambda item: item[1].enter_order):
        at = (node_b.relative_path, node_b.call_index)
        why = blocker(node_b, around, ledger.partnered, verdicts) or \
            ("" if at in outcomes else "it did not run in that rerun (the run raised, or took another path)")
        if why:
            settled[id(node_b)] = f"{reason}; not judged inside {around.module_path}'s run either: {why}"
            continue
        setup = hosted[id(around)][at]
        outcome = outcomes[at]
        verdicts[id(node_b)] = outcome.verdict
        where = f"judged inside {around.module_path}'s run on A's inputs (it cannot run alone: {reason})"
        outcome.reason = f"{where}; {outcome.reason}" if outcome.reason else where
        done.append(Done(node_a, node_b, setup, outcome, orders[id(node_b)], replayed[id(around)]))
        settled[id(node_b)] = ""
    _settle_unrun(ledger, settled)


def _settle_unrun(ledger: Ledger, judged: dict[int, str]) -> None:
    """Calls judged inside their parent's run leave the skipped ones; the others say why they were not."""
    by_path = {(b.module_path, b.call_index): judged[id(b)] for _, b, _ in ledger.unrun if id(b) in judged}
    ledger.unrun = [(a, b, judged.get(id(b)) or reason) for a, b, reason in ledger.unrun if judged.get(id(b)) != ""]
    skipped = []
    for call in ledger.skipped:
        why = by_path.get((call.module_path_b, call.call_index))
        if why is None:
            skipped.append(call)
        elif why:
            skipped.append(replace(call, reason=why))
    ledger.skipped = skipped
