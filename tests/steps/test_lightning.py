"""The Lightning callback records the same steps a plain loop would, and identical fits agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

pl = pytest.importorskip("lightning.pytorch", reason="Lightning is not installed (pip install 'tracediff[lightning]')")

from tracediff.steps import compare_steps  # noqa: E402
from tracediff.steps.lightning import StepRecorderCallback  # noqa: E402


class Regressor(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.ReLU(), nn.Linear(8, 1))
        self.lr = lr

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def fit(out: Path, *, lr: float = 1e-2) -> None:
    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(12, 4, generator=generator), torch.randn(12, 1, generator=generator))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = pl.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[StepRecorderCallback(out, stats="all")])
    trainer.fit(Regressor(lr), loader)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")  # inside Lightning, not ours
def test_lightning_fits_are_recorded_and_compared(tmp_path: Path) -> None:
    fit(tmp_path / "a")
    fit(tmp_path / "b")
    fit(tmp_path / "c", lr=2e-2)
    assert sorted(p.name for p in (tmp_path / "a").glob("step=*")) == ["step=0", "step=1", "step=2"]
    record = json.loads((tmp_path / "a" / "step=1" / "rank0.json").read_text())
    assert record["complete"] is True
    assert list(record["groups"]["grads"]) == ["net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias"]
    assert record["taken_at"]["params"] == "optimizer_pre_step"
    assert record["groups"]["optimizer"]["type"]["value"] == "torch.optim.adamw.AdamW"
    assert list(record["groups"]["batch"]) == ["batch.0", "batch.1"]
    assert compare_steps(tmp_path / "a", tmp_path / "b").passed
    d = compare_steps(tmp_path / "a", tmp_path / "c").first_divergence
    assert d is not None and (d.step, d.group, d.name) == (0, "optimizer", "defaults.lr")
