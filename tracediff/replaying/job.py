"""One replay's shared parts: what every step reads (:class:`Setting`) and what it reports as it goes
(:class:`Ledger`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..maps.rules import SlotRules
from ..trace.load import Trace
from ..trace.model import Node
from .compiled import EagerB
from .placement import param_dtype
from .result import SkippedCall


@dataclass
class Setting:
    """A's trace, B and how it runs, and the options of ``replay``, as every step of one replay reads them."""

    trace: Trace
    model: nn.Module
    b: EagerB                       # how B runs (eager, or compiled: .compiled)
    rules: list[tuple[str, str]]    # the map's rename rules
    match: str
    slots: SlotRules                # the map's slot rules: a call whose inputs they set aside is not replayed
    seed: int
    device: torch.device
    atol: float | None
    rtol: float | None
    oracle: bool
    modules: dict[str, nn.Module] = field(init=False)  # B's own modules by relative path
    model_dtype: torch.dtype | None = field(init=False)

    def __post_init__(self) -> None:
        self.modules = self.b.module_table()
        self.model_dtype = param_dtype(self.model)

    @property
    def root_name(self) -> str:
        return type(self.model).__name__


@dataclass
class Ledger:
    """What one replay reports as it goes: warnings, the calls it skipped, and the paired calls not run alone."""

    warnings: list[str] = field(default_factory=list)
    skipped: list[SkippedCall] = field(default_factory=list)
    unrun: list[tuple[Node, Node, str]] = field(default_factory=list)  # skipped calls that may hold a mistake
    partnered: set[int] = field(default_factory=set)  # B's calls (by id) that pair with one of A's

    def skip(self, node_a: Node, node_b: Node, reason: str, *, unjudged: bool = False) -> None:
        """List a paired call that is not replayed; ``unjudged``: one that may hold a mistake no row saw (paired
        on its outputs only, or inputs that cannot be rebuilt), which a difference around it cannot be
        blamed past (see ``culprits``)."""
        self.skipped.append(SkippedCall(module_path_b=node_b.module_path, call_index=node_b.call_index,
                                        module_path_a=node_a.module_path, reason=reason))
        if unjudged:
            self.unrun.append((node_a, node_b, reason))
