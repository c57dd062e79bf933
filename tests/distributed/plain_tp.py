"""A tensor-parallel engine without DTensors (Megatron's way: plain local shards and explicit collectives), for
the declared-layout tests (``--shards``), and its one-process reference built from the same weights.

    python tests/distributed/plain_tp.py ref OUT [scalar]
    torchrun --nproc-per-node 2 tests/distributed/plain_tp.py tp OUTROOT [MISTAKE,...]   # or a VARIANT

Modules: a vocabulary-parallel embedding (rows of the table split over ranks, out-of-range tokens masked, the
partial lookups all-reduced), a sequence-parallel norm (each rank normalises its slice of the sequence, then
the slices are gathered), a mixer across positions, a column-parallel then a row-parallel linear (all-reduced);
the ``scalar`` variant ends with a module that returns a 0-d tensor (a loss-like score).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

MISTAKES = ("none", "embedding_no_mask", "no_allreduce", "sp_no_gather")
#: Clean runs captured another way: ``ops`` with op-level capture, ``summary`` with statistics only, ``scalar``
#: with a last module that returns a 0-d tensor.
VARIANTS = ("ops", "summary", "scalar")
VOCAB, HIDDEN, FFN, SEQ = 32, 16, 32, 8
SHARDS_RULES = """\
# module path (without the root)   tensor slot: layout
embed                               outputs: replicated
norm                                outputs: dim 1 over tp
mixer                               inputs: replicated
mlp.up                              outputs: dim -1 over tp
mlp.down                            inputs.args.0: dim -1 over tp
mlp.down                            outputs: partial over tp
"""


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"embed": torch.randn(VOCAB, HIDDEN, generator=g), "up": torch.randn(FFN, HIDDEN, generator=g) / 4,
            "down": torch.randn(HIDDEN, FFN, generator=g) / 4}


class _World:
    def __init__(self, mistake: str) -> None:
        self.mistake = mistake
        self.sharded = torch.distributed.is_initialized()
        self.rank = torch.distributed.get_rank() if self.sharded else 0
        self.size = torch.distributed.get_world_size() if self.sharded else 1

    def part(self, n: int) -> slice:
        step = n // self.size
        return slice(self.rank * step, (self.rank + 1) * step)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.sharded:
            torch.distributed.all_reduce(x)
        return x


class Embedding(nn.Module):
    def __init__(self, world: _World, table: torch.Tensor) -> None:
        super().__init__()
        self.world, rows = world, world.part(VOCAB)
        self.start, self.end = rows.start, rows.stop
        self.weight = nn.Parameter(table[rows].clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.end)
        local = (ids - self.start).masked_fill(outside, 0)
        out = nn.functional.embedding(local, self.weight)
        if self.world.mistake != "embedding_no_mask":
            out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return self.world.all_reduce(out)


class Norm(nn.Module):  # the sequence-parallel region: this rank's positions only
    def __init__(self, world: _World) -> None:
        super().__init__()
        self.world = world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.layer_norm(x[:, self.world.part(SEQ)], (HIDDEN,))


class Mixer(nn.Module):  # mixes positions: needs the whole sequence
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x.mean(dim=1, keepdim=True)


class Mlp(nn.Module):
    def __init__(self, world: _World, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.world = world
        self.up = nn.Linear(HIDDEN, FFN // world.size, bias=False)
        self.down = nn.Linear(FFN // world.size, HIDDEN, bias=False)
        with torch.no_grad():
            self.up.weight.copy_(weights["up"][world.part(FFN)])
            self.down.weight.copy_(weights["down"][:, world.part(FFN)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down(nn.functional.gelu(self.up(x)))
        return out if self.world.mistake == "no_allreduce" else self.world.all_reduce(out)


class Score(nn.Module):  # a 0-d output, alike on every rank (its input is all-reduced)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.square().mean()


class PlainTP(nn.Module):
    def __init__(self, mistake: str = "none", *, scalar: bool = False) -> None:
        super().__init__()
        world = _World(mistake)
        self.world = world
        weights = _weights()
        self.embed, self.norm, self.mixer, self.mlp = Embedding(world, weights["embed"]), Norm(world), Mixer(), \
            Mlp(world, weights)
        self.score = Score() if scalar else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(ids))
        if self.world.sharded and self.world.mistake != "sp_no_gather":
            parts = [torch.empty_like(x) for _ in range(self.world.size)]
            torch.distributed.all_gather(parts, x.contiguous())
            x = torch.cat(parts, dim=1)
        out = self.mlp(self.mixer(x))
        return self.score(out) if self.score is not None else out


def build() -> tuple[PlainTP, dict[str, torch.Tensor]]:
    """The SPEC of ``tracediff capture tests/distributed/plain_tp.py:build`` (under torchrun: the sharded model)."""
    if "RANK" in __import__("os").environ and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    return PlainTP(), {"ids": (torch.arange(SEQ).reshape(1, SEQ) * 5) % VOCAB}


def run(out: Path, mistake: str) -> None:
    import tracediff

    ops = mistake == "ops"
    model = PlainTP("none" if mistake in VARIANTS else mistake, scalar=mistake == "scalar")
    ids = (torch.arange(SEQ).reshape(1, SEQ) * 5) % VOCAB
    tensors = "summary" if mistake == "summary" else "full"
    with torch.no_grad(), tracediff.capture(model, out, ranks="all", ops=ops, tensors=tensors):
        model(ids)


def main(argv: list[str]) -> None:
    command, out = argv[0], Path(argv[1])
    if command == "ref":
        run(out, argv[2] if len(argv) > 2 else "none")
        return
    torch.distributed.init_process_group("gloo")
    for mistake in argv[2].split(",") if len(argv) > 2 else ["none"]:
        if mistake not in MISTAKES + VARIANTS:
            raise SystemExit(f"unknown mistake {mistake!r}: expected one of {', '.join(MISTAKES + VARIANTS)}")
        run(out / f"plain_{mistake}", mistake)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
