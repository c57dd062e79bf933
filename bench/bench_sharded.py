"""Align a sharded run against its one-process reference: time, GB/s and peak RSS.

    python bench/bench_sharded.py --ranks 4 --layers 4 --hidden 512 --ffn 2048 --seq 256 --repeats 3
    python bench/bench_sharded.py --ranks 4 --distributed   # adds the row of align --distributed

A stack of MLP blocks (``up`` column-parallel, ``down`` row-parallel, torch's ``parallelize_module``, so the
layouts come from DTensors: zero options) is captured once in one process and once under
``torchrun --nproc-per-node RANKS`` (gloo, CPU); then, side by side in one run, each case is aligned in a fresh
process per repeat:

* ``ref-vs-ref``: the reference against itself (every pair bitwise equal on disk: the floor);
* ``ref-vs-noisy``: against a one-process run whose weights are one float32 rounding away (every pair
  close, none equal: the one-process cost of the same verdicts, Pearson correlations included);
* ``ref-vs-sharded``: the reference against the multi-rank folder (every global tensor rebuilt from its
  shards, replicas checked across ranks).

* ``--distributed``: also ``distributed``: the same pair aligned with ``align(..., distributed=True)`` under
  ``torchrun --nproc-per-node RANKS`` (each rank measures the shards of its own rank folder, rank 0 merges);
  the time is rank 0's, from a barrier before ``align`` to its return (the launch and imports are left out).

GB/s counts the payload bytes of both sides (every rank's files for the sharded side) over the median time;
peak RSS is the aligning process's ``ru_maxrss`` (``--distributed``: the largest of the ranks').
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]


class Block(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(x)))


def _model(args: argparse.Namespace) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[Block(args.hidden, args.ffn) for _ in range(args.layers)]).eval()


def _input(args: argparse.Namespace) -> torch.Tensor:
    return torch.randn(1, args.seq, args.hidden, generator=torch.Generator().manual_seed(1))


def capture_rank(args: argparse.Namespace) -> None:
    """Under torchrun: the sharded capture."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import tracediff

    torch.distributed.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),), mesh_dim_names=("tp",))
    model = _model(args)
    for block in model:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    with torch.no_grad(), tracediff.capture(model, args.out / "sharded", ranks="all"):
        model(_input(args))
    torch.distributed.destroy_process_group()


def _payload_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.safetensors"))


_ALIGN = """
import json, resource, sys, time
import tracediff
start = time.perf_counter()
result = tracediff.align(sys.argv[1], sys.argv[2])
took = time.perf_counter() - start
print(json.dumps({"seconds": took, "passed": result.passed, "rows": len(result.rows),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


_ALIGN_DISTRIBUTED = """
import json, resource, sys, time
import torch.distributed as dist
import tracediff
dist.init_process_group("gloo")
dist.barrier()
start = time.perf_counter()
result = tracediff.align(sys.argv[1], sys.argv[2], distributed=True)
took = time.perf_counter() - start
rss = [None] * dist.get_world_size()
dist.all_gather_object(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
if dist.get_rank() == 0:
    print(json.dumps({"seconds": took, "passed": result.passed, "rows": len(result.rows), "rss_mb": max(rss)}))
dist.destroy_process_group()
"""


def _align_once(a: Path, b: Path, ranks: int = 0) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if ranks:
        script = a.parent / "align_distributed.py"
        script.write_text(_ALIGN_DISTRIBUTED)
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                   str(script), str(a), str(b)]
    else:
        command = [sys.executable, "-c", _ALIGN, str(a), str(b)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--ffn", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="where the traces go (default: a temporary folder)")
    parser.add_argument("--distributed", action="store_true",
                        help="also align the sharded pair with align(..., distributed=True) under torchrun")
    args = parser.parse_args()
    if "RANK" in os.environ:
        capture_rank(args)
        return
    import tracediff

    args.out = args.out or Path(tempfile.mkdtemp(prefix="bench-sharded-"))
    model = _model(args)
    with torch.no_grad(), tracediff.capture(model, args.out / "ref"):
        model(_input(args))
    with torch.no_grad():  # the one-process run of another kernel: every value a rounding away, none equal
        for param in model.parameters():
            param.mul_(1 + 2 ** -23)
    with torch.no_grad(), tracediff.capture(model, args.out / "noisy"):
        model(_input(args))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                    str(args.ranks), __file__, *[a for a in sys.argv[1:] if a != "--distributed"], "--out",
                    str(args.out)], env=env, check=True, capture_output=True)
    ref, sharded = args.out / "ref", args.out / "sharded"
    cases = {"ref-vs-ref": (ref, ref), "ref-vs-noisy": (ref, args.out / "noisy"), "ref-vs-sharded": (ref, sharded)}
    if args.distributed:
        cases["distributed"] = (ref, sharded)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    for _ in range(args.repeats):  # side by side: one run of each case per round
        for name, (a, b) in cases.items():
            runs[name].append(_align_once(a, b, args.ranks if name == "distributed" else 0))
    print(f"{args.ranks} ranks, {args.layers} blocks, hidden {args.hidden}, ffn {args.ffn}, seq {args.seq}; "
          f"payloads: reference {_payload_bytes(ref) / 1e6:.1f} MB, sharded {_payload_bytes(sharded) / 1e6:.1f} MB "
          f"over {args.ranks} rank folders; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"{'case':<16} {'rows':>5} {'passed':>7} {'median s':>9} {'GB/s':>7} {'peak RSS MB':>12}")
    for name, (a, b) in cases.items():
        seconds = statistics.median(r["seconds"] for r in runs[name])
        gbs = (_payload_bytes(a) + _payload_bytes(b)) / seconds / 1e9
        rss = statistics.median(r["rss_mb"] for r in runs[name])
        print(f"{name:<16} {int(runs[name][0]['rows']):>5} {bool(runs[name][0]['passed'])!s:>7} {seconds:>9.3f} "
              f"{gbs:>7.2f} {rss:>12.0f}")


if __name__ == "__main__":
    main()
