"""The recorder's contract: options, folder safety, partial records, hooks, batches, environment."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import tracediff.steps.recorder as recorder_module
from tracediff.errors import OutputDirError, UsageError
from tracediff.steps import StepRecorder
from tracediff.steps.hashing import tensor_hash


def toy() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def step(model: nn.Module, opt: torch.optim.Optimizer | None, x: torch.Tensor) -> None:
    model(x).square().mean().backward()
    if opt is not None:
        opt.step()
        opt.zero_grad()


def record(path: Path, k: int) -> dict:
    return json.loads((path / f"step={k}" / "rank0.json").read_text())


X = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))


def test_unknown_group_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    model, opt = toy()
    with pytest.raises(UsageError) as e:
        StepRecorder(model, tmp_path / "r", optimizer=opt, checksums={"param"})
    assert str(e.value) == ("checksums: unknown name 'param' (expected some of rngs, batch, params, buffers, "
                            "grads, optimizer); did you mean 'params'?")
    assert not (tmp_path / "r").exists()


def test_every_and_steps_together_are_refused(tmp_path: Path) -> None:
    model, opt = toy()
    with pytest.raises(UsageError, match=r"^every=2 and steps=\[\.\.\.\] both given; pass one of them$"):
        StepRecorder(model, tmp_path, every=2, steps=[1])
    with pytest.raises(UsageError, match=r"^every=0: expected a whole number >= 1$"):
        StepRecorder(model, tmp_path, every=0)


def test_folder_holding_a_run_is_refused_unless_overwrite(tmp_path: Path) -> None:
    model, opt = toy()
    with StepRecorder(model, tmp_path, optimizer=opt, stats=None) as rec:
        for _ in range(2):
            with rec.step(X):
                step(model, opt, X)
    with pytest.raises(OutputDirError) as e:
        StepRecorder(model, tmp_path, optimizer=opt)
    assert str(e.value) == (f"{tmp_path}: already holds a training record (run.json, step=*/); refusing to "
                            "overwrite it (pass overwrite=True or choose another folder)")
    with StepRecorder(model, tmp_path, optimizer=opt, overwrite=True) as rec:
        with rec.step(X):
            step(model, opt, X)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "step=0"]


def test_a_step_that_raises_leaves_an_incomplete_record_and_the_counter_advances(tmp_path: Path) -> None:
    model, opt = toy()
    with StepRecorder(model, tmp_path, optimizer=opt) as rec:
        with pytest.raises(FloatingPointError):
            with rec.step({"x": X}):
                model(X).sum().backward()
                raise FloatingPointError("loss is nan\nsecond line")
        assert rec.step_index == 1
        with rec.step({"x": X}) as k:
            assert k == 1
            step(model, opt, X)
    broken = record(tmp_path, 0)
    assert broken["complete"] is False
    assert broken["error"] == {"type": "FloatingPointError", "message": "loss is nan"}
    assert set(broken["groups"]["grads"]) == {"0.weight", "0.bias", "1.weight", "1.bias", "4.weight", "4.bias"}
    assert broken["taken_at"]["params"] == "exit"  # the optimizer never stepped
    assert record(tmp_path, 1)["complete"] is True


def test_record_written_at_entry_survives_a_killed_process(tmp_path: Path) -> None:
    model, opt = toy()
    rec = StepRecorder(model, tmp_path, optimizer=opt)
    rec.begin_step({"x": X})  # the process dies here: no end_step, no close
    partial = record(tmp_path, 0)
    assert partial["complete"] is False and partial["error"] is None
    assert list(partial["groups"]) == ["rngs", "batch"]
    rec.end_step()
    rec.close()


def test_hooks_are_removed_on_close_and_training_is_untouched(tmp_path: Path) -> None:
    model, opt = toy()
    with StepRecorder(model, tmp_path, optimizer=opt, stats="all") as rec:
        with rec.step(X):
            step(model, opt, X)
    assert all(not getattr(p, "_post_accumulate_grad_hooks", None) for p in model.parameters())
    assert not opt._optimizer_step_pre_hooks
    with pytest.raises(UsageError, match="the recorder is closed"):
        with rec.step(X):
            pass


def test_params_are_taken_before_the_update_and_grads_as_produced(tmp_path: Path) -> None:
    model, opt = toy()
    before = {n: tensor_hash(p) for n, p in model.named_parameters()}
    with StepRecorder(model, tmp_path, optimizer=opt, stats=None) as rec:
        with rec.step(X):
            model(X).square().mean().backward()
            grads = {n: tensor_hash(p.grad) for n, p in model.named_parameters()}
            opt.step()
            opt.zero_grad()
    rec0 = record(tmp_path, 0)
    assert {n: e["hash"] for n, e in rec0["groups"]["params"].items()} == before
    assert {n: e["hash"] for n, e in rec0["groups"]["grads"].items()} == grads
    assert before != {n: tensor_hash(p) for n, p in model.named_parameters()}


def test_without_an_optimizer_state_is_taken_at_exit_and_there_is_no_optimizer_group(tmp_path: Path) -> None:
    model, _ = toy()
    with StepRecorder(model, tmp_path) as rec:
        with rec.step(X):
            step(model, None, X)
    rec0 = record(tmp_path, 0)
    assert "optimizer" not in rec0["groups"]
    assert rec0["taken_at"]["params"] == rec0["taken_at"]["buffers"] == "exit"
    assert json.loads((tmp_path / "run.json").read_text())["options"]["checksums"] == [
        "rngs", "batch", "params", "buffers", "grads"]


def test_only_scheduled_steps_are_written(tmp_path: Path) -> None:
    model, opt = toy()
    with StepRecorder(model, tmp_path, optimizer=opt, steps=[1, 3], checksums={"params"}) as rec:
        for _ in range(5):
            with rec.step():
                step(model, opt, X)
    assert sorted(p.name for p in tmp_path.glob("step=*")) == ["step=1", "step=3"]
    assert list(record(tmp_path, 3)["groups"]) == ["params"]
    assert rec.recorded_steps == [1, 3]


def test_nested_batch_keeps_its_structure(tmp_path: Path) -> None:
    model, opt = toy()
    batch = {"x": X, "extra": [np.arange(3, dtype=np.int32), ("tag", 2.5, None)], "n": 7}
    with StepRecorder(model, tmp_path, optimizer=opt, checksums={"batch"}) as rec:
        with rec.step(batch):
            step(model, opt, X)
    rec0 = record(tmp_path, 0)
    assert rec0["batch_structure"] == {"type": "dict", "items": {
        "x": {"tensor": "batch.x"},
        "extra": {"type": "list", "items": [
            {"ndarray": "batch.extra.0"},
            {"type": "tuple", "items": [{"value": "batch.extra.1.0"}, {"value": "batch.extra.1.1"},
                                        {"value": "batch.extra.1.2"}]}]},
        "n": {"value": "batch.n"}}}
    entries = rec0["groups"]["batch"]
    assert entries["batch.extra.0"]["hash"] == tensor_hash(torch.arange(3, dtype=torch.int32))
    assert entries["batch.extra.1.1"] == {"py_type": "float", "py_value": 2.5}
    assert entries["batch.n"] == {"py_type": "int", "py_value": 7}
    assert entries["batch.x"]["stats"]["max"] == pytest.approx(float(X.max()))


def test_secrets_are_redacted_and_packages_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefSECRETVALUE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-SECRETVALUE")
    monkeypatch.setenv("DB_PASSWORD", "pw-SECRETVALUE")
    monkeypatch.setenv("HTTPS_PROXY", "http://alice:pw-SECRETVALUE@proxy:3128")
    monkeypatch.setenv("TRACEDIFF_TEST_PLAIN", "visible")
    model, opt = toy()
    StepRecorder(model, tmp_path, optimizer=opt, env_vars=True, pip_freeze=True).close()
    text = (tmp_path / "run.json").read_text()
    assert "SECRETVALUE" not in text
    run = json.loads(text)
    env = run["environment"]
    assert env["HF_TOKEN"] == env["AWS_SECRET_ACCESS_KEY"] == env["DB_PASSWORD"] == "<redacted>"
    assert env["HTTPS_PROXY"] == "http://<redacted>@proxy:3128"
    assert env["TRACEDIFF_TEST_PLAIN"] == "visible"
    assert run["packages"]["torch"] == torch.__version__
    assert run["system"]["torch_version"] == torch.__version__


def test_environment_is_not_recorded_unless_asked(tmp_path: Path) -> None:
    model, opt = toy()
    StepRecorder(model, tmp_path, optimizer=opt).close()
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["environment"] is None and run["packages"] is None


def test_a_failed_write_stops_recording_with_a_warning_and_close_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt = toy()
    rec = StepRecorder(model, tmp_path, optimizer=opt)
    real = recorder_module.write_json

    def disk_full(path: Path, obj: object, **kw: object) -> None:
        if "step=1" in str(path):
            raise OutputDirError(f"{path}: could not write: No space left on device")
        real(path, obj, **kw)

    monkeypatch.setattr(recorder_module, "write_json", disk_full)
    with pytest.warns(RuntimeWarning, match="step recording stopped: .*No space left on device"):
        for _ in range(3):
            with rec.step(X):
                step(model, opt, X)
    assert rec.step_index == 3 and rec.recorded_steps == [0]
    assert not (tmp_path / "step=2").exists()
    with pytest.raises(OutputDirError, match="No space left on device"):
        rec.close()
