"""One rank of the two-process capture test (run by ``test_distributed.py``, as torchrun would).

Usage: ``RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python dist_worker.py OUT``

Every scenario writes under ``OUT/<scenario>``; each rank writes what its
``CaptureSession`` said to ``OUT/session_<scenario>_rank<r>.json``.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import tracediff


class Affine(nn.Module):
    """Elementwise, so a sharded DTensor stays sharded."""

    def __init__(self, scale: float, shift: float) -> None:
        super().__init__()
        self.scale, self.shift = scale, shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class Gather(nn.Module):
    """All-gathers its input: a collective inside the forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.redistribute(x.device_mesh, [Replicate()])


class ShardedModel(nn.Module):
    """``a`` feeds ``b`` (the same DTensor object twice), ``gather`` runs a collective."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Affine(2.0, 1.0)
        self.b = Affine(-1.0, 0.5)
        self.gather = Gather()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.b(self.a(x))
        return y, self.gather(y)


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def _report(out: Path, scenario: str, rank: int, session: tracediff.CaptureSession) -> None:
    summary = {"recording": session.recording, "trace_dir": str(session.trace_dir), "complete": session.complete,
               "verification": session.verification.to_dict() if session.verification is not None else None}
    (out / f"session_{scenario}_rank{rank}.json").write_text(json.dumps(summary))


def main(out: Path) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    torch.manual_seed(0)
    plain, x = Plain(), torch.randn(2, 4, generator=torch.Generator().manual_seed(1))

    with tracediff.capture(plain, out / "default") as session:
        plain(x + rank)
    _report(out, "default", rank, session)

    with tracediff.capture(plain, out / "all", ranks="all") as session:
        plain(x + rank)
    _report(out, "all", rank, session)

    mesh = init_device_mesh("cpu", (2,))
    full = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    model = ShardedModel()
    for scenario, options in [("dtensor_local", {}), ("dtensor_full", {"full_dtensor": True}),
                              ("dtensor_verify", {"verify": True, "full_dtensor": True})]:
        with tracediff.capture(model, out / scenario, **options) as session:
            model(sharded)
        _report(out, scenario, rank, session)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
