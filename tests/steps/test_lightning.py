"""The Lightning callback records the same steps a plain loop would, and identical fits agree."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tracediff.steps.lightning as td_lightning
from tracediff.steps import compare_steps


def test_without_lightning_the_callback_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(td_lightning, "_CLASS", None)
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    with pytest.raises(ImportError, match=r"^tracediff.steps.lightning needs Lightning: "
                                          r"pip install 'tracediff\[lightning\]'$"):
        td_lightning.StepRecorderCallback  # noqa: B018


def fit(pl: Any, out: Path, *, lr: float = 1e-2) -> None:
    class Regressor(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.ReLU(), nn.Linear(8, 1))

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=lr)

    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(12, 4, generator=generator),
                                          torch.randn(12, 1, generator=generator))
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[td_lightning.StepRecorderCallback(out, stats="all")])
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=4))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")  # inside Lightning, not ours
def test_lightning_fits_are_recorded_and_compared(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch", reason="Lightning is not installed "
                                                         "(pip install 'tracediff[lightning]')")
    fit(pl, tmp_path / "a")
    fit(pl, tmp_path / "b")
    fit(pl, tmp_path / "c", lr=2e-2)
    assert sorted(p.name for p in (tmp_path / "a").glob("step=*")) == ["step=0", "step=1", "step=2"]
    record = json.loads((tmp_path / "a" / "step=1" / "rank0.json").read_text())
    assert record["complete"] is True
    assert list(record["groups"]["grads"]) == ["net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias"]
    assert record["taken_at"]["params"] == "optimizer_pre_step"
    assert record["groups"]["optimizer"]["type"]["py_value"] == "torch.optim.adamw.AdamW"
    assert list(record["groups"]["batch"]) == ["batch.0", "batch.1"]
    assert compare_steps(tmp_path / "a", tmp_path / "b").passed
    d = compare_steps(tmp_path / "a", tmp_path / "c").first_divergence
    assert d is not None and (d.step, d.group, d.name) == (0, "optimizer", "defaults.lr")
