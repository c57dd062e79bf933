"""Small traces to attack: a plain-PyTorch model captured by ``tracediff.capture``, copied per test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tracediff
from tracediff.cli.main import main


class Small(nn.Module):
    """Two blocks of Linear + ReLU with a non-tensor argument, a kwarg and a tuple output."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        for block in self.blocks:
            x = block(x) * scale
        return self.head(x), x.sum(dim=-1)


def small(seed: int = 0) -> Small:
    torch.manual_seed(seed)
    return Small().eval()


def capture_small(out: Path, *, seed: int = 0, **options: Any) -> Path:
    model = small(seed)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), tracediff.capture(model, out, **options):
        model(x, scale=0.5)
    return out


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def tree_file(folder: Path) -> Path:
    return next(folder.glob("*_debug_tree_FULL_TENSORS.json"))


def edit_tree(folder: Path, edit: Any) -> None:
    path = tree_file(folder)
    tree = json.loads(path.read_text())
    edit(tree)
    path.write_text(json.dumps(tree))


def cli(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err
