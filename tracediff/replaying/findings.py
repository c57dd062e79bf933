"""What the judged calls add up to: the culprits (:mod:`.culprits`, with patched reruns to tell a cause from
its effects), each culprit's share of the end-to-end error (``patch=True``), and the rows ``Replay`` reports."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from ..alignment.pairing.slots import pair_tensors
from .calls import CallRuns, Done, rerun_index
from .culprits import Candidate, Decision, decide, open_calls
from .end_to_end import end_to_end_error
from .inputs import NotRebuildable
from .inside import judged_in_run
from .matching import BOnA
from .patching import Replacements, patched
from .result import NOT_COMPARABLE, ReplayedCall
from .runner import replay_call
from .shadow import seed_rng


class Findings:
    """The culprits among ``done``, their patch effects, and the replay's rows."""

    def __init__(self, runs: CallRuns, done: list[Done]) -> None:
        self.runs, self.done = runs, done
        self.decisions: dict[int, Decision] = {}
        self.undecided: list[str] = []
        self.patch_effects: dict[int, float] = {}

    def decide(self) -> None:
        ledger = self.runs.ledger
        candidates = [Candidate(key=i, node_a=d.node_a, module_path_b=d.node_b.module_path, verdict=d.outcome.verdict,
                                reason=d.outcome.reason) for i, d in enumerate(self.done)]
        unrun = [Candidate(key=-1 - i, node_a=node_a, module_path_b=node_b.module_path, verdict=NOT_COMPARABLE,
                           reason=f"not replayed: {reason}") for i, (node_a, node_b, reason) in enumerate(ledger.unrun)]
        decide(candidates + unrun, self._rerun_patched if self.runs.shadow.trace is not None else None)
        self.decisions = {c.key: c.decision for c in candidates}
        # a verdict needs evidence: a call that differs with an unjudged call inside it, or an unjudged call that
        # nothing around it vouches for, leaves the replay undecided
        self.undecided = [f"{c.module_path_b} (call {self.done[c.key].node_b.call_index}) differs, but "
                          f"{c.decision.undecided}" for c in candidates if c.decision.undecided]
        named = {c.decision.unjudged for c in candidates if c.decision.unjudged}
        self.undecided += [f"{c.module_path_b} (call {self.done[c.key].node_b.call_index}) could not be judged "
                           f"({c.reason or 'not comparable'}) and no call around it was judged the same math"
                           for c in open_calls(candidates) if c.module_path_b not in named]

    def _recorded_outputs(self, done: Done) -> dict[str, torch.Tensor]:
        """A's recorded outputs of a call, under B's output slots (``outputs`` in A may be ``outputs.0`` in B)."""
        recorded = done.setup.recorded_outputs()
        if done.setup.node_b is None:
            return recorded
        pairs, _, _ = pair_tensors(done.node_a, done.setup.node_b)
        partner = {a.slot: b for a, b in pairs if a.slot.startswith("outputs")}
        out = {}
        for slot, tensor in recorded.items():
            b = partner.get(slot)
            if b is not None and b.shape is not None and tuple(tensor.shape) != b.shape and \
                    [d for d in tensor.shape if d != 1] == [d for d in b.shape if d != 1]:
                tensor = tensor.reshape(b.shape)  # ``[T, 1, C]`` as ``[1, T, C]``: the same values in order
            out[b.slot if b is not None else slot] = tensor
        return out

    def _rerun_patched(self, parent: Candidate, children: list[Candidate]) -> str:
        done = self.done[parent.key]
        replacements: Replacements = {}
        for child in children:
            child_done = self.done[child.key]
            replacements[(child_done.node_b.relative_path, child_done.node_b.call_index)] = \
                self._recorded_outputs(child_done)
        if done.host is not None:
            return self._rerun_inside(done, done.host, replacements)
        index = rerun_index(done.node_b)
        setup = done.setup
        model, runs = self.runs.setting.model, self.runs

        def twin_patch() -> Any:  # called only once the float64 copy exists
            assert runs.twin is not None
            return patched(runs.twin, replacements, index)

        try:
            outcome = replay_call(setup, oracle=runs.setting.oracle, patch=lambda: patched(model, replacements, index),
                                  twin_patch=twin_patch)
        except NotRebuildable:
            return done.outcome.verdict
        finally:
            setup.tensors.clear()
        return outcome.verdict

    def _rerun_inside(self, done: Done, host_done: Done, replacements: Replacements) -> str:
        """The patched verdict of a call judged inside its host's run: the host rerun with ``replacements``."""
        key = (done.node_b.relative_path, done.node_b.call_index)
        runs = self.runs
        outcomes = judged_in_run(host_done.setup, {key: done.setup}, model=runs.setting.model, twin=lambda: runs.twin,
                                 index=rerun_index(host_done.node_b), oracle=runs.setting.oracle,
                                 replacements=replacements)
        return outcomes[key].verdict if key in outcomes else done.outcome.verdict

    def measure_patches(self, b_on_a: BOnA) -> None:
        """For each culprit: the share of the final-output error that disappears with A's output in its place."""
        setting, warnings = self.runs.setting, self.runs.ledger.warnings
        base = b_on_a.end_to_end
        if base is None or b_on_a.root_inputs is None:
            warnings.append("--patch: B's final output cannot be compared with A's (see the other warnings); "
                            "no patch effects")
            return
        args, kwargs = b_on_a.root_inputs
        for key, decision in self.decisions.items():
            if not decision.culprit:
                continue
            done = self.done[key]
            replacements = {(done.node_b.relative_path, done.node_b.call_index): self._recorded_outputs(done)}
            with torch.no_grad(), patched(setting.model, replacements):
                seed_rng(setting.seed)
                try:
                    output = setting.b.whole()(*args, **kwargs)
                except Exception as e:  # noqa: BLE001
                    warnings.append(f"--patch {done.node_b.module_path}: B's forward raised {type(e).__name__}")
                    continue
            after = end_to_end_error(setting.trace, output)
            if after is None:
                continue
            before = base["rms_err"]
            effect = 100.0 * (before - after["rms_err"]) / before if before > 0 else 0.0
            self.patch_effects[key] = min(100.0, max(0.0, effect))

    def results(self) -> tuple[ReplayedCall, ...]:
        calls = []
        for key, done in enumerate(self.done):
            decision = self.decisions[key]
            reason = done.outcome.reason
            if decision.note:
                reason = f"{reason}; {decision.note}" if reason else decision.note
            if decision.undecided:
                reason = f"{reason}; undecided: {decision.undecided}" if reason else f"undecided: {decision.undecided}"
            if decision.explained_by:
                reason = f"{reason}; explained by {', '.join(decision.explained_by)}" if reason else \
                    f"explained by {', '.join(decision.explained_by)}"
            calls.append(ReplayedCall(
                module_path_a=done.node_a.module_path, module_path_b=done.node_b.module_path,
                call_index=done.node_b.call_index, module_type=done.node_b.module_type, order=done.order,
                tensors=tuple(done.outcome.rows), verdict=done.outcome.verdict, reason=reason,
                culprit=decision.culprit, explained_by=decision.explained_by,
                patch_effect=self.patch_effects.get(key), seconds=done.outcome.seconds))
        return _ranked(sorted(calls, key=lambda call: call.order))  # self.done ends with calls judged inside


def _ranked(calls: list[ReplayedCall]) -> tuple[ReplayedCall, ...]:
    """Rank culprits: by patch effect when measured, then by relative local error (1 = most important)."""
    culprits = [c for c in calls if c.culprit]

    def importance(call: ReplayedCall) -> tuple[float, float]:
        rel = call.local_rel_rms_err
        return (call.patch_effect if call.patch_effect is not None else -1.0, -1.0 if math.isnan(rel) else rel)

    ranks = {id(c): i + 1 for i, c in enumerate(sorted(culprits, key=importance, reverse=True))}
    return tuple(replace(c, rank=ranks[id(c)]) if c.culprit else c for c in calls)
