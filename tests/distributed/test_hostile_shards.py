"""Hostile variants of genuine 2-rank captures: each is refused in one line (exit 2) or judged (exit 0 or 1,
never a pass over a shard left uncompared), never an internal error (exit 3).

The captures are real torchrun runs on CPU (gloo, 2 processes): the plain-tensor engine of ``plain_tp.py``
(layouts declared with ``--shards``, and its ``scalar`` variant whose last module returns a 0-d tensor) and
torch's ``parallelize_module`` on a tiny Llama (``tp_run.py``: DTensors). Each test copies one, breaks one
thing the way a crashed writer, a bad copy or a hostile author would, and runs ``tracediff align``.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.alignment.helpers import run_cli
from tests.distributed.launch import torchrun
from tracediff import format as fmt

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import plain_tp  # noqa: E402
import tp_run  # noqa: E402

HUGE = "9" * 5000  # over Python's 4,300-digit limit for int()


def _launch(script: str, *args: str) -> None:
    done = torchrun(str(HERE / script), *args)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile_shards")
    plain_tp.run(root / "plain_ref", "none")
    plain_tp.run(root / "plain_scalar_ref", "scalar")
    (root / "rules.txt").write_text(plain_tp.SHARDS_RULES)
    _launch("plain_tp.py", "tp", str(root), "none,scalar")
    tp_run.save(root / "ckpt")
    tp_run.reference(root / "ckpt", root / "ref")
    _launch("tp_run.py", "torch", str(root / "ckpt"), str(root), "none")
    return root


def _copy(runs: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(runs / name, tmp_path / name))


def _entry(folder: Path, rank: int, module_path: str, slot: str) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """The tree file of ``rank``, its content and the tensor entry of ``module_path`` at ``slot``
    (``outputs`` or ``inputs.args.0``)."""
    tree_path = next((folder / f"rank{rank}").glob(f"*{fmt.FULL_SUFFIX}"))
    tree = json.loads(tree_path.read_text())
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.get("module_path") == module_path:
            entry: Any = node
            for key in slot.split("."):
                entry = entry[int(key)] if key.isdigit() else entry[key]
            return tree_path, tree, entry
        stack.extend(node.get("children", []))
    raise AssertionError(f"no call {module_path} in {tree_path}")


def _rewrite_payload(folder: Path, rank: int, module_path: str, slot: str,
                     change: Callable[[Any], Any]) -> None:
    """Replace the payload of one tensor of ``rank`` by ``change(its tensor)`` (any shape), through the
    project's own safetensors writer."""
    from tracediff.files.payloads import read_tensor_file, write_tensor_file

    _, _, entry = _entry(folder, rank, module_path, slot)
    path = folder / f"rank{rank}" / entry[fmt.VALUE]
    write_tensor_file(path, change(read_tensor_file(path, payload=True).clone()))


def _refused(capsys: Any, *argv: str) -> str:
    code, out, err = run_cli(["align", *argv], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, err[-2000:])
    return err


def _judged(capsys: Any, *argv: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run_cli(["align", *argv, "--format", "json"], capsys)
    assert code in (0, 1), (code, err[-2000:])
    report = json.loads(out)
    assert report["passed"] is (code == 0)
    return code, report


def _row(report: dict[str, Any], module_path: str, tensor: str) -> dict[str, Any]:
    return next(r for r in report["rows"] if r["module_path_b"] == module_path and r["tensor"] == tensor)


def test_a_genuine_capture_whose_module_returns_a_0d_tensor_gives_its_verdict(runs: Path, capsys: Any) -> None:
    code, report = _judged(capsys, str(runs / "plain_scalar_ref"), str(runs / "plain_scalar"), "--shards",
                           str(runs / "rules.txt"))
    score = _row(report, "PlainTP.score", "outputs")
    assert code == 0 and score["shape_b"] == [] and score["status"] in ("identical", "close")


def test_a_manifest_of_world_size_0_and_no_ranks_is_refused(runs: Path, tmp_path: Path, capsys: Any) -> None:
    folder = _copy(runs, "plain_none", tmp_path)
    manifest = json.loads((folder / fmt.RANKS_FILE).read_text())
    manifest.update(world_size=0, ranks=[])
    (folder / fmt.RANKS_FILE).write_text(json.dumps(manifest))
    err = _refused(capsys, str(runs / "plain_ref"), str(folder), "--shards", str(runs / "rules.txt"))
    assert f"{folder / fmt.RANKS_FILE}: 'world_size' must be a positive integer, got 0" in err


def test_a_placement_of_5000_digits_is_refused(runs: Path, tmp_path: Path, capsys: Any) -> None:
    folder = _copy(runs, "torch_none", tmp_path)
    tree_path, tree, _ = _entry(folder, 0, "LlamaForCausalLM", "outputs")
    text = json.dumps(tree)
    recorded = '"layout": {"placements": ["R"]'
    assert recorded in text
    tree_path.write_text(text.replace(recorded, f'"layout": {{"placements": ["S({HUGE})"]', 1))
    err = _refused(capsys, str(runs / "ref"), str(folder))
    assert f"{folder / 'rank0'}: " in err and "is not one placement per dimension of the 1-D mesh" in err
    assert len(err) < 500  # the 5,000 digits are not echoed


def test_a_shards_rule_of_5000_digits_is_refused(runs: Path, tmp_path: Path, capsys: Any) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text(f"mlp.up outputs: dim {HUGE} over tp\n")
    err = _refused(capsys, str(runs / "plain_ref"), str(runs / "plain_none"), "--shards", str(rules))
    assert f"{rules}: line 1: expected 'PATH SLOT: dim D over NAME'" in err and len(err) < 500


def test_a_shard_payload_with_another_number_of_dims_is_an_unreadable_row(runs: Path, tmp_path: Path,
                                                                          capsys: Any) -> None:
    folder = _copy(runs, "plain_none", tmp_path)
    _rewrite_payload(folder, 1, "PlainTP.mlp.up", "outputs", lambda t: t.reshape(1, 4, 2, 16))
    code, report = _judged(capsys, str(runs / "plain_ref"), str(folder), "--shards", str(runs / "rules.txt"))
    row = _row(report, "PlainTP.mlp.up", "outputs")
    assert code == 1 and row["status"] == "unreadable"
    assert "holds float32 [1, 4, 2, 16] but rank 1's trace says torch.float32 [1, 8, 16]" in row["reason"]


def test_a_partial_sum_shard_that_does_not_broadcast_is_an_unreadable_row(runs: Path, tmp_path: Path,
                                                                         capsys: Any) -> None:
    folder = _copy(runs, "plain_none", tmp_path)
    _rewrite_payload(folder, 1, "PlainTP.mlp.down", "outputs", lambda t: t.reshape(-1)[:3].clone())
    code, report = _judged(capsys, str(runs / "plain_ref"), str(folder), "--shards", str(runs / "rules.txt"))
    row = _row(report, "PlainTP.mlp.down", "outputs")
    assert code == 1 and row["status"] == "unreadable" and "holds float32 [3] but rank 1's trace says" in row["reason"]


def test_a_partial_sum_shard_of_another_shape_is_never_broadcast_into_a_pass(runs: Path, tmp_path: Path,
                                                                             capsys: Any) -> None:
    """Rank 0's partial made the whole sum and rank 1's a row of zeros ``[16]`` for its ``[1, 8, 16]``: numpy
    would broadcast the row and the sum would be right, so only the check of each payload against its record
    sees that rank 1's shard is not what its trace says."""
    folder = _copy(runs, "plain_none", tmp_path)
    reduced = {}
    _rewrite_payload(folder, 0, "PlainTP.mlp", "outputs", lambda t: reduced.setdefault("sum", t))
    _rewrite_payload(folder, 0, "PlainTP.mlp.down", "outputs", lambda t: reduced["sum"])
    _rewrite_payload(folder, 1, "PlainTP.mlp.down", "outputs", lambda t: torch.zeros(t.shape[-1]))
    code, report = _judged(capsys, str(runs / "plain_ref"), str(folder), "--shards", str(runs / "rules.txt"))
    row = _row(report, "PlainTP.mlp.down", "outputs")
    assert code == 1 and row["status"] == "unreadable"
    assert "holds float32 [16] but rank 1's trace says torch.float32 [1, 8, 16]" in row["reason"]


def test_an_activation_no_value_places_never_passes(runs: Path, tmp_path: Path, capsys: Any) -> None:
    """The DTensor run's ``act_fn`` output has no layout (a plain local tensor) and is placed by value; rank 1's
    tripled shard places nowhere: listed, not compared, and the verdict is undecided, never passed."""
    folder = _copy(runs, "torch_none", tmp_path)
    _rewrite_payload(folder, 1, "LlamaForCausalLM.model.layers.0.mlp.act_fn", "outputs", lambda t: t * 3)
    code, report = _judged(capsys, str(runs / "ref"), str(folder))
    assert code == 1 and report["verdict"] == "undecided"
    assert "1 tensor(s) of a multi-rank trace were not placed, so not compared" in report["reason"]
    assert [(f["kind"], f["module_path"]) for f in report["shard_findings"]] == \
        [("unplaced", "LlamaForCausalLM.model.layers.0.mlp.act_fn")]


def test_two_sharded_runs_compare_every_tensor_rank_by_rank(runs: Path, capsys: Any) -> None:
    """No layout declared on either side: the shards that neither places are compared rank by rank."""
    code, report = _judged(capsys, str(runs / "plain_none"), str(runs / "plain_none"))
    assert code == 0 and report["summary"]["statuses"] == {"identical": 14} and not report["shard_findings"]
    up = _row(report, "PlainTP.mlp.up", "outputs")
    assert up["shape_b"] == [2, 1, plain_tp.SEQ, plain_tp.FFN // 2]  # the two ranks' shards, stacked


def test_a_shard_out_of_tolerance_between_two_sharded_runs_is_named(runs: Path, tmp_path: Path,
                                                                    capsys: Any) -> None:
    folder = _copy(runs, "plain_none", tmp_path)
    _rewrite_payload(folder, 1, "PlainTP.mlp.up", "outputs", lambda t: t * 100)
    code, report = _judged(capsys, str(runs / "plain_none"), str(folder))
    first = report["first_divergence"]
    assert code == 1 and (first["module_path_b"], first["tensor"], first["rank"]) == ("PlainTP.mlp.up", "outputs", 1)


def test_a_corrupted_norm_shard_is_not_accepted_as_cut_at_another_point(runs: Path, tmp_path: Path,
                                                                         capsys: Any) -> None:
    """Rank 1's ``norm`` output x3+1: the gather after it gives the next input a new payload, which says
    nothing of code that changed the value (as one process's trace would)."""
    folder = _copy(runs, "plain_none", tmp_path)
    _rewrite_payload(folder, 1, "PlainTP.norm", "outputs", lambda t: t * 3 + 1)
    code, report = _judged(capsys, str(runs / "plain_ref"), str(folder), "--shards", str(runs / "rules.txt"))
    first = report["first_divergence"]
    assert code == 1 and (first["module_path_b"], first["tensor"], first["rank"]) == ("PlainTP.norm", "outputs", 1)


def test_a_rules_file_of_36000_globs_is_refused_at_once(runs: Path, tmp_path: Path, capsys: Any) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("".join(f"*{i} outputs: replicated\n" for i in range(36_000)))
    assert 0.8e6 < rules.stat().st_size < (1 << 20)  # under the 1 MiB bound on the file itself
    start = time.perf_counter()
    err = _refused(capsys, str(runs / "ref"), str(runs / "torch_none"), "--shards", str(rules))
    assert time.perf_counter() - start < 10  # was over 20 s: every tensor tried against every glob
    assert f"{rules}: holds more than 1024 rules; refused" in err
