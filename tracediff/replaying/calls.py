"""Each paired call of B run alone, on the inputs A's trace recorded for it (:mod:`.runner`), with its
float64 twin for the oracle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..alignment.pairing.slots import Parameters
from ..trace.model import Node
from .inputs import NotRebuildable, Target
from .job import Ledger, Setting
from .oracle import float64_copy, oracle_device
from .placement import module_device, param_dtype
from .runner import CallOutcome, CallSetup, replay_call
from .shadow import ShadowRun


@dataclass
class Done:
    """A paired call that was judged: its setup, and what its run found."""

    node_a: Node
    node_b: Node
    setup: CallSetup
    outcome: CallOutcome
    order: int
    host: Done | None = None  # the call whose run judged it, for a call that cannot run alone (.inside)


class CallRuns:
    """Sets up and runs B's calls alone; holds the float64 copy of B, made on first use."""

    def __init__(self, setting: Setting, shadow: ShadowRun, ledger: Ledger) -> None:
        self.setting, self.shadow, self.ledger = setting, shadow, ledger
        self.twin: nn.Module | None = None
        self._twin_modules: dict[str, nn.Module] = {}

    def twin_module(self, path: str) -> nn.Module | None:
        """The float64 copy of B's module at ``path``; the copy of the whole model is made on first use."""
        if self.twin is None:
            self.twin = float64_copy(self.setting.model, oracle_device(self.setting.device))
            self._twin_modules = dict(self.twin.named_modules(remove_duplicate=False))
        return self._twin_modules.get(path)

    def setup(self, node_a: Node, node_b: Node) -> CallSetup | None:
        """What running ``node_b``'s module on ``node_a``'s inputs needs; None (and the call skipped) when it
        cannot run."""
        setting = self.setting
        module = setting.modules.get(node_b.relative_path)
        if module is None:
            self.ledger.skip(node_a, node_b, "not a submodule of B")
            return None
        if not node_a.outputs():
            self.ledger.skip(node_a, node_b, "A's trace holds no outputs for this call (the standard trace keeps "
                                             "only the leaves' outputs; capture A with tracediff.capture)")
            return None
        slot_dtypes = self.shadow.slot_dtypes.get((node_b.relative_path, node_b.call_index), {})
        dtype = param_dtype(module) or next(iter(slot_dtypes.values()), None) or setting.model_dtype
        device = module_device(module, setting.device)

        def twin() -> tuple[nn.Module, Target] | None:
            copy = self.twin_module(node_b.relative_path)
            if copy is None:
                return None
            return copy, Target(module_device(copy, oracle_device(setting.device)), torch.float64)
        return CallSetup(trace=setting.trace, node_a=node_a, node_b=node_b if self.shadow.trace else None,
                         module=setting.b.runnable(module), twin=twin,
                         target=Target(device, dtype, dict(slot_dtypes)), seed=setting.seed,
                         b_inputs=self.shadow.inputs.get((node_b.relative_path, node_b.call_index)),
                         atol=setting.atol, rtol=setting.rtol, parameters=self._parameters(node_a, node_b))

    def _parameters(self, node_a: Node, node_b: Node) -> Parameters:
        shadow = self.shadow.trace
        return (self.setting.trace.forward_parameters(node_a), shadow.forward_parameters(node_b) if shadow else None)

    def run(self, order: int, node_a: Node, node_b: Node) -> Done | None:
        """Run one call alone and judge its outputs; None (and the call skipped) when it cannot run."""
        setup = self.setup(node_a, node_b)
        if setup is None:
            return None
        try:
            outcome = replay_call(setup, oracle=self.setting.oracle)
        except NotRebuildable as e:
            self.ledger.skip(node_a, node_b, str(e), unjudged=True)
            return None
        finally:
            setup.tensors.clear()  # payloads are read again only for culprits
        return Done(node_a, node_b, setup, outcome, order)


def rerun_index(node: Node) -> Callable[[str, int], int | None]:
    """For a rerun of ``node``'s call: the k-th call of a path in that run -> its call index in B's forward."""
    order: dict[str, list[int]] = {}
    for item in node.walk():
        order.setdefault(item.relative_path, []).append(item.call_index)

    def index(path: str, k: int) -> int | None:
        calls = order.get(path, [])
        return calls[k] if k < len(calls) else None
    return index
