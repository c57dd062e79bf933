#!/usr/bin/env python
"""Save every layer's output of a small PyTorch model as one file per call: a ``tensors`` dump.

    python docs/examples/save_layer_outputs.py dumps/reference
    python docs/examples/save_layer_outputs.py dumps/port --plant-bug    # layers.1.fc's weight x 1.05
    tracediff align dumps/reference dumps/port                           # names Model.layers.1.fc

This is the "I saved every layer's output" script many people already have,
written with plain PyTorch: a forward hook on each submodule saves its output
with ``torch.save`` as ``{order:03d}_{module path}.pt`` (``000_layers.0.fc.pt``,
``001_layers.0.act.pt``, ...). The order prefix records the order the calls
finished in, which tracediff takes as the execution order; without it,
tracediff falls back to the files' modification times, then to their names.
``--format npy`` writes ``.npy`` files instead (``numpy.save``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x)) + x


class TinyNet(nn.Module):
    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def save_layer_outputs(out: Path, *, plant_bug: bool = False, file_format: str = "pt") -> list[Path]:
    """Run ``TinyNet`` (seed 0) on a fixed input and save each submodule call's output into ``out``."""
    torch.manual_seed(0)
    model = TinyNet()
    x = torch.randn(2, 5, 16)
    if plant_bug:
        with torch.no_grad():
            model.layers[1].fc.weight.mul_(1.05)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def hook(name: str):  # noqa: ANN202 - a forward hook
        def save(module: nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            path = out / f"{len(written):03d}_{name}.{file_format}"
            if file_format == "npy":
                import numpy as np

                np.save(path, output.detach().numpy())
            else:
                torch.save(output.detach(), path)
            written.append(path)
        return save

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules() if name]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--plant-bug", action="store_true")
    parser.add_argument("--format", choices=["pt", "npy"], default="pt")
    args = parser.parse_args(argv)
    written = save_layer_outputs(args.out, plant_bug=args.plant_bug, file_format=args.format)
    print(f"wrote {len(written)} files into {args.out}")


if __name__ == "__main__":
    main()
