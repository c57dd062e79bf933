"""Three training steps of a small MLP recorded by ``StepRecorder``: on one device, or sharded with FSDP2.

    python tests/distributed/fsdp_run.py OUT                                   # one device
    torchrun --nproc-per-node 2 tests/distributed/fsdp_run.py OUTROOT fsdp [MISTAKE,...]   # or "tp"

Each MISTAKE (``none``, ``no_grad_average``: gradients summed over the ranks, not divided by the world
size, as a hand-written reduction that forgets the division leaves them) is a fresh run into
``OUTROOT/fsdp_{MISTAKE}``. Every rank sees the whole batch, so the sharded run's averaged gradients equal
the one-device run's.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

MISTAKES = ("none", "no_grad_average")
#: Clean runs sharded another way: ``tp`` with torch's ``parallelize_module`` instead of FSDP2.
VARIANTS = ("tp",)


def run(out: Path, sharded: bool, mistake: str = "none") -> None:
    import tracediff

    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    if sharded and mistake == "tp":  # tensor parallelism instead: the first linear by columns, the second by rows
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    elif sharded:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(4, 8, generator=g) for _ in range(3)]
    with tracediff.StepRecorder(model, out, optimizer=optimizer, every=1) as recorder:
        for x in batches:
            with recorder.step({"x": x}):
                model(x).pow(2).mean().backward()
                if mistake == "no_grad_average":  # summed over the ranks, never divided by the world size
                    with torch.no_grad():
                        for param in model.parameters():
                            param.grad.mul_(torch.distributed.get_world_size())
                optimizer.step()
                optimizer.zero_grad()


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    if len(argv) == 1:
        run(out, sharded=False)
        return
    torch.distributed.init_process_group("gloo")
    for mistake in argv[2].split(",") if len(argv) > 2 else ["none"]:
        if mistake not in MISTAKES + VARIANTS:
            raise SystemExit(f"unknown mistake {mistake!r}: expected one of {', '.join(MISTAKES + VARIANTS)}")
        run(out / f"fsdp_{mistake}", sharded=True, mistake=mistake)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
