"""What the shards of a multi-rank trace say on their own, apart from any comparison with another trace."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: ``replica_differs``: a tensor whose layout says replicated differs between ranks; ``ranks_disagree``: one
#: recorded without a layout, of one shape on every rank, differs between them (a replica that differs, or a
#: shard nothing placed); ``unplaced``: no layout recorded or declared and the values place it nowhere.
FAILING_KINDS = ("replica_differs", "ranks_disagree")


@dataclass(frozen=True)
class ShardFinding:
    """One finding about the shards of one tensor: its kind, call, slot, the rank it names and what was seen."""

    kind: str
    module_path: str
    call_index: int
    tensor: str
    rank: int | None
    detail: str
    side: str = "B"  # the trace it was found in: "A" (the reference) or "B"

    @property
    def failing(self) -> bool:
        """True when the finding fails the alignment (ranks that disagree); an unplaced tensor is listed only."""
        return self.kind in FAILING_KINDS

    def describe(self) -> str:
        call = f" (call {self.call_index})" if self.call_index else ""
        return f"{self.side}: {self.module_path}{call} {self.tensor}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
