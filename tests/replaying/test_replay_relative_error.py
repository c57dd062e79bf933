"""Replay's relative errors follow the one rule of ``tracediff.compare.relative``: a position where either side
is NaN is left out, so one NaN in A's recorded output neither hides nor inflates the error elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff


class Scaled(nn.Module):
    """``x * scale``, with NaN at the first position (a masked score, say)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale
        y[0, 0] = torch.nan
        return y


class Model(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scaled = Scaled(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scaled(x) + 1.0


def test_a_nan_in_a_leaves_its_position_out_of_the_relative_error(tmp_path: Path) -> None:
    x = torch.rand(4, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.5
    model_a = Model(1.0)
    with torch.no_grad(), tracediff.capture(model_a, tmp_path / "a"):
        model_a(x)
    result = tracediff.replay(Model(1.25), tmp_path / "a", oracle=False)
    call = next(c for c in result.modules if c.module_path_b == "Model.scaled")
    # B is 1.25x A at every finite position: rms(b - a) / rms(a) = 0.25 exactly; the NaN both sides hold is
    # left out (the old rule divided by the RMS of all of A's values, NaN included, and gave inf)
    assert call.tensors[0].local_rel_rms_err == pytest.approx(0.25, rel=1e-12)
    assert result.end_to_end is not None
    finite = x.reshape(-1)[1:]
    expected = float((0.25 * finite).square().sum().sqrt() / (finite + 1.0).square().sum().sqrt())
    assert result.end_to_end["rel_rms_err"] == pytest.approx(expected, rel=1e-12)
