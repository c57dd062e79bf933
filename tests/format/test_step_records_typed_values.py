"""Step records hold typed values under ``py_value`` as traces do; tracediff 0.1 records (``value``) still compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tracediff
from tracediff import format as fmt


def _record(out: Path, lr: float = 0.1) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with tracediff.StepRecorder(model, out, optimizer=opt, every=1) as recorder:
        for i in range(2):
            batch = {"x": torch.ones(4, 3) * i, "n": i}
            with recorder.step(batch):
                model(batch["x"]).sum().backward()
                opt.step()
                opt.zero_grad()


def _rename_key(obj: Any, old: str, new: str) -> Any:
    if isinstance(obj, dict):
        renamed = {new if k == old and fmt.PY_TYPE in obj else k: _rename_key(v, old, new) for k, v in obj.items()}
        return renamed
    if isinstance(obj, list):
        return [_rename_key(v, old, new) for v in obj]
    return obj


def _as_version_1(run: Path) -> None:
    """Rewrite a run as tracediff 0.1 wrote it: format_version 1, typed values under ``value``."""
    run_file = run / "run.json"
    run_file.write_text(json.dumps({**json.loads(run_file.read_text()), "format_version": 1}))
    for record in run.glob("step=*/rank*.json"):
        record.write_text(json.dumps(_rename_key(json.loads(record.read_text()), fmt.PY_VALUE, fmt.LEGACY_PY_VALUE)))


def test_new_records_use_py_value(tmp_path: Path) -> None:
    _record(tmp_path / "run")
    record = json.loads((tmp_path / "run" / "step=0" / "rank0.json").read_text())
    text = json.dumps(record)
    assert '"py_value"' in text and '"value": ' not in text.replace('{"value": "batch', "")
    assert json.loads((tmp_path / "run" / "run.json").read_text())["format_version"] == 2


def test_a_run_recorded_by_tracediff_0_1_compares_with_a_new_one(tmp_path: Path) -> None:
    _record(tmp_path / "old")
    _record(tmp_path / "new")
    _as_version_1(tmp_path / "old")
    assert '"value": 0.1' in (tmp_path / "old" / "step=0" / "rank0.json").read_text()
    assert tracediff.compare_steps(tmp_path / "old", tmp_path / "new").passed
    _record(tmp_path / "faster", lr=0.2)
    result = tracediff.compare_steps(tmp_path / "old", tmp_path / "faster")
    assert not result.passed
    assert result.first_divergence is not None and result.first_divergence.reason == "value 0.1 vs 0.2"
