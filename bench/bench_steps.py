"""Overhead of ``tracediff.StepRecorder`` on a training step, measured side by side.

Two copies of the same ~4.2 M-parameter transformer (embedding, 4 encoder
layers of width 256 with dropout, LM head) train with AdamW on the same
batches; steps alternate between the plain copy and the recorded copy, so
both see the same machine load. Recording covers every group (rngs, batch,
params, buffers, grads, optimizer) at every step; ``--stats none`` (the
default) is hashes only. The timed region of a recorded step includes the
``with recorder.step(batch)`` block, hashing and the JSON writes.

Target: recorded / plain median <= 1.5 with ``--stats none``. On a shared
machine the load changes from one second to the next, so the script also
prints the median of the per-pair ratios (each recorded step against the
plain step just before it), CPU-time medians, the minimum (least disturbed)
times, the time spent in the recorder's own code (hooks, entry, exit) per
step, and the speed of hashing alone; quote them together.

    python bench/bench_steps.py                 # hashes only
    python bench/bench_steps.py --stats default # plus the default statistics
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from typing import Any

import torch
from torch import nn

from tracediff import steps as td_steps
from tracediff.steps.hashing import tensor_hash

VOCAB, WIDTH, LAYERS, HEADS, FF = 2048, 256, 4, 4, 1024


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, FF, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(ids)))


class _TimedRecorder(td_steps.StepRecorder):
    """The recorder, with the time spent in its own code (hooks, entry, exit) added up per step."""

    inside = 0.0

    def _timed(self, method: Any, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args)
        finally:
            self.inside += time.perf_counter() - start

    def begin_step(self, batch: Any = None) -> None:
        self._timed(super().begin_step, batch)

    def end_step(self, error: BaseException | None = None) -> None:
        self._timed(super().end_step, error)

    def _on_grad(self, name: str, param: torch.Tensor) -> None:
        self._timed(super()._on_grad, name, param)

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._timed(super()._on_optimizer_step, optimizer, args, kwargs)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    logits = model(batch["input_ids"])
    nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten()).backward()
    opt.step()
    opt.zero_grad()


def _hash_cost(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[float, int]:
    """Least time to hash what one step records (params twice: they stand for the grads, same sizes)."""
    tensors = [p.detach() for p in model.parameters()] * 2
    tensors += [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    size = sum(t.numel() * t.element_size() for t in tensors)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for t in tensors:
            tensor_hash(t)
        best = min(best, time.perf_counter() - start)
    return best, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="timed steps per variant (default 12)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first (default 3)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--stats", choices=["none", "default", "all"], default="none")
    args = parser.parse_args()
    stats = {"none": None, "default": td_steps.DEFAULT_STATS, "all": "all"}[args.stats]

    torch.manual_seed(0)
    plain = TinyLM()
    recorded = TinyLM()
    recorded.load_state_dict(plain.state_dict())
    opt_plain = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    opt_rec = torch.optim.AdamW(recorded.parameters(), lr=1e-3)
    n_params = sum(p.numel() for p in plain.parameters())
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(args.warmup + args.steps):
        ids = torch.randint(0, VOCAB, (args.batch, args.seq), generator=gen)
        batches.append({"input_ids": ids, "labels": ids.roll(-1, dims=1)})

    t_plain: list[float] = []
    t_rec: list[float] = []
    cpu_plain: list[float] = []
    cpu_rec: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        inside: list[float] = []
        with _TimedRecorder(recorded, tmp, optimizer=opt_rec, stats=stats, every=1) as recorder:
            for i, batch in enumerate(batches):
                torch.manual_seed(100 + i)  # the same dropout masks for both copies
                start, cpu_start = time.perf_counter(), time.process_time()
                _train_step(plain, opt_plain, batch)
                middle, cpu_middle = time.perf_counter(), time.process_time()
                torch.manual_seed(100 + i)
                recorder.inside = 0.0
                with recorder.step(batch):
                    _train_step(recorded, opt_rec, batch)
                end, cpu_end = time.perf_counter(), time.process_time()
                if i >= args.warmup:
                    t_plain.append(middle - start)
                    t_rec.append(end - middle)
                    cpu_plain.append(cpu_middle - cpu_start)
                    cpu_rec.append(cpu_end - cpu_middle)
                    inside.append(recorder.inside)
        same = all(torch.equal(p, q) for p, q in zip(plain.parameters(), recorded.parameters()))
    hash_cost = _hash_cost(recorded, opt_rec)

    med_plain, med_rec = statistics.median(t_plain), statistics.median(t_rec)
    print(f"model: {n_params / 1e6:.2f} M parameters, AdamW, batch {args.batch}x{args.seq}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"recording: every step, all groups, stats={args.stats}, hash=sha256")
    print(f"plain step    median {med_plain * 1e3:8.1f} ms  (min {min(t_plain) * 1e3:.1f}, n={len(t_plain)})")
    print(f"recorded step median {med_rec * 1e3:8.1f} ms  (min {min(t_rec) * 1e3:.1f}, n={len(t_rec)})")
    print(f"ratio recorded/plain: {med_rec / med_plain:.2f}x (target <= 1.5x)")
    paired = statistics.median(r / p for r, p in zip(t_rec, t_plain))
    print(f"median of per-pair ratios: {paired:.2f}x; ratio of minimums: {min(t_rec) / min(t_plain):.2f}x")
    cpu_p, cpu_r = statistics.median(cpu_plain), statistics.median(cpu_rec)
    print(f"CPU time median: plain {cpu_p * 1e3:.1f} ms, recorded {cpu_r * 1e3:.1f} ms, ratio {cpu_r / cpu_p:.2f}x")
    med_inside = statistics.median(inside)
    print(f"time inside the recorder per step: median {med_inside * 1e3:.1f} ms (min {min(inside) * 1e3:.1f}); "
          f"(plain + that) / plain: {(med_plain + med_inside) / med_plain:.2f}x")
    seconds, size = hash_cost
    print(f"hashing alone: {size / 1e6:.1f} MB per step in {seconds * 1e3:.1f} ms "
          f"({size / seconds / 1e9:.2f} GB/s, best of 5, one thread)")
    print(f"parameters bit-identical after {len(batches)} steps: {same}")


if __name__ == "__main__":
    main()
