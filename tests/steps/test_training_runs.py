"""Real training runs recorded twice: identical runs agree, and each injected change is found exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tracediff.steps as steps
from tests.steps.training import LR, tiny_llama, train
from tracediff.cli.main import main


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "reference"
    train(out)
    return out


def test_same_seed_twice_is_identical(reference: Path, tmp_path: Path) -> None:
    train(tmp_path / "again")
    result = steps.compare_steps(reference, tmp_path / "again")
    assert result.passed and bool(result)
    assert result.first_divergence is None
    assert list(result.steps["step"]) == [0, 1, 2, 3, 4, 5]
    assert set(result.steps["status"]) == {"identical"}
    assert main(["steps", str(reference), str(tmp_path / "again")]) == 0


def test_recording_leaves_training_bit_identical(tmp_path: Path) -> None:
    recorded = train(tmp_path / "run", stats="all")
    plain = train(None)
    for (name, p), (_, q) in zip(recorded.named_parameters(), plain.named_parameters()):
        assert torch.equal(p, q), name


def test_learning_rate_changed_at_step_3_is_found_in_step_3_optimizer_group(reference: Path, tmp_path: Path) -> None:
    # Params, buffers and optimizer state are taken in the optimizer's step pre-hook, before the
    # update: step 3's params, grads and Adam moments still come from steps 0-2 and match. The new
    # learning rate is already in the param group the update is about to read, so the first entry
    # that differs is the hyperparameter itself, at step 3; the params only differ from step 4 on.
    train(tmp_path / "lr", lr_from=(3, LR * 2))
    result = steps.compare_steps(reference, tmp_path / "lr")
    d = result.first_divergence
    assert d is not None
    assert (d.step, d.rank, d.group, d.name) == (3, 0, "optimizer", "param_groups.0.lr")
    assert d.reason == f"value {LR} vs {LR * 2}"
    table = result.steps.set_index("step")
    assert list(table.loc[[0, 1, 2], "status"]) == ["identical"] * 3
    assert table.loc[3, "diverged"] == 1  # only the learning rate: params, grads, moments agree
    assert table.loc[4, "first_group"] == "params"


def test_reseeded_dropout_rng_is_found_in_the_rngs_group(reference: Path, tmp_path: Path) -> None:
    train(tmp_path / "rng", reseed_at=(2, 7))
    d = steps.compare_steps(reference, tmp_path / "rng").first_divergence
    assert d is not None
    assert (d.step, d.group, d.name) == (2, "rngs", "torch.cpu")
    assert d.a is not None and d.b is not None and d.a["seed"] == 42 and d.b["seed"] == 7


def test_perturbed_batch_is_found_in_the_batch_group(reference: Path, tmp_path: Path) -> None:
    train(tmp_path / "batch", perturb_token_at=4)
    result = steps.compare_steps(reference, tmp_path / "batch")
    d = result.first_divergence
    assert d is not None
    assert (d.step, d.group, d.name) == (4, "batch", "batch.input_ids")
    rows = {row.name: row for row in d.stats}
    assert rows["shape"].a == rows["shape"].b == [2, 8]
    assert rows["hash"].a != rows["hash"].b
    assert rows["mean"].diff == pytest.approx(1 / 16)  # one token id moved up by one among 16


def test_one_ulp_in_a_weight_passes_with_the_suggested_tolerance_and_fails_without(
    reference: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_llama()
    with torch.no_grad():
        w = model.model.layers[0].mlp.up_proj.weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(1.0))
    train(tmp_path / "ulp", model=model)
    exact = steps.compare_steps(reference, tmp_path / "ulp")
    d = exact.first_divergence
    assert d is not None and (d.step, d.group, d.name) == (0, "params", "model.layers.0.mlp.up_proj.weight")
    assert exact.needed_atol is not None and 0 < exact.needed_atol < 1e-4
    assert main(["steps", str(reference), str(tmp_path / "ulp")]) == 1
    hint = capsys.readouterr().out.splitlines()[-1]
    assert hint.startswith("every difference would pass with --atol ")
    suggested = hint.rsplit(" ", 1)[1]
    assert main(["steps", str(reference), str(tmp_path / "ulp"), "--atol", suggested]) == 0
    loose = steps.compare_steps(reference, tmp_path / "ulp", atol=float(suggested))
    assert loose.passed and "within_tolerance" in set(loose.steps["status"])
    assert not steps.compare_steps(reference, tmp_path / "ulp", atol=exact.needed_atol / 2).passed


def test_record_layout_and_contents(reference: Path) -> None:
    run = json.loads((reference / "run.json").read_text())
    assert run["format"] == "tracediff-steps" and run["closed"] is True
    assert run["steps_recorded"] == [0, 1, 2, 3, 4, 5]
    record = json.loads((reference / "step=3" / "rank0.json").read_text())
    assert record["complete"] is True and record["step"] == 3
    assert list(record["groups"]) == ["rngs", "batch", "params", "buffers", "grads", "optimizer"]
    assert record["taken_at"]["params"] == "optimizer_pre_step"
    names = [name for name, _ in tiny_llama().named_parameters()]
    assert list(record["groups"]["params"]) == names
    assert list(record["groups"]["grads"]) == names  # hooks fire in reverse; records keep model order
    assert list(record["groups"]["buffers"]) == ["model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"]
    state = record["groups"]["optimizer"]["state"]
    assert list(state) == names
    assert set(state["lm_head.weight"]) == {"step", "exp_avg", "exp_avg_sq"}
    assert record["groups"]["optimizer"]["param_groups"][0]["params"]["py_value"] == names
    for group in record["groups"]:
        assert len(record[f"__all_{group}__"]) == 64


def test_schedules_compare_on_shared_steps(reference: Path, tmp_path: Path) -> None:
    train(tmp_path / "sparse", every=2)
    assert sorted(p.name for p in (tmp_path / "sparse").glob("step=*")) == ["step=0", "step=2", "step=4"]
    result = steps.compare_steps(reference, tmp_path / "sparse")
    assert result.passed
    assert list(result.steps["step"]) == [0, 2, 4]
    assert (result.only_in_a, result.only_in_b) == ((1, 3, 5), ())
