"""Sharded runs end to end: real torchrun runs with 2 processes on CPU (gloo), aligned against one process.

Three engines: transformers' ``tp_plan="auto"`` (plain local shards, layouts from its styles), torch's
``parallelize_module`` (DTensors inside the styled modules) and a plain-tensor engine in Megatron's way (layouts
declared with ``--shards``). Each torchrun captures several runs in one launch (``tp_run.py``, ``plain_tp.py``),
once for the module; the clean runs must pass with tensors compared, and each planted mistake must be named at
its module and rank. Float32 values are compared under the default tolerance: TP splits the matmuls, so the
sums are reordered and differ from one process by a few ulps, never by the planted mistakes' errors (> 1e-3).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tracediff
from tests.alignment.helpers import run_cli
from tests.distributed.launch import torchrun
from tracediff import format as fmt
from tracediff.errors import TraceFormatError, UsageError
from tracediff.sharding import load_sharded, parse_rules
from tracediff.sharding.layout import Layout, rebuild
from tracediff.trace.payload import Payload

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import fsdp_run  # noqa: E402
import plain_tp  # noqa: E402
import tp_run  # noqa: E402

HF_MISTAKES = ("none", "no_allreduce", "replica_differs", "swapped_shards", "qwen2:none", "qwen2:shard_differs")
TORCH_MISTAKES = ("none", "no_allreduce", "shard_differs")
PLAIN_MISTAKES = ("none", "embedding_no_mask", "no_allreduce", "sp_no_gather", "ops", "summary")


def _torchrun(script: str, *args: str) -> str:
    target = ["-m", "tracediff"] if script == "tracediff" else [str(HERE / script)]
    done = torchrun(*target, *args)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sharded")
    ckpt = root / "ckpt"
    tp_run.save(ckpt)
    tp_run.save(ckpt / "qwen2", "qwen2")
    tp_run.reference(ckpt, root / "ref")
    tp_run.reference(ckpt / "qwen2", root / "ref_qwen2")
    plain_tp.run(root / "plain_ref", "none")
    (root / "rules.txt").write_text(plain_tp.SHARDS_RULES)
    runs = [f"hf:{m}" for m in HF_MISTAKES] + [f"torch:{m}" for m in TORCH_MISTAKES]
    _torchrun("tp_run.py", "hf", str(ckpt), str(root), ",".join(runs))  # one launch: start-up paid once
    _torchrun("plain_tp.py", "tp", str(root), ",".join(PLAIN_MISTAKES))
    (root / "cli.txt").write_text(_torchrun("tracediff", "capture", f"{HERE / 'plain_tp.py'}:build", "--ranks",
                                            "all", "--out", str(root / "plain_cli")))
    return root


def _align(runs: Path, name: str) -> tracediff.Alignment:
    if "qwen2" in name:
        return tracediff.align(runs / "ref_qwen2", runs / name)
    if name.startswith("plain_"):
        return tracediff.align(runs / "plain_ref", runs / name, shards=runs / "rules.txt")
    return tracediff.align(runs / "ref", runs / name)


def _compared(result: tracediff.Alignment) -> int:
    return sum(row.status in ("identical", "close") and not row.approximate for row in result.rows)


@pytest.mark.parametrize("name", ["hf_none", "hf_qwen2_none", "torch_none", "plain_none"])
def test_a_clean_tp_run_passes_against_one_process_with_tensors_compared(runs: Path, name: str) -> None:
    result = _align(runs, name)
    assert result.passed, result.first_divergence or result.shard_findings
    assert _compared(result) >= (12 if name == "plain_none" else 70)
    assert not [f for f in result.shard_findings if f.failing]
    # colwise outputs really were rebuilt from two shards: the global width, not a rank's half
    if name != "plain_none":
        row = next(r for r in result.rows if r.module_path_b.endswith("layers.0.mlp.gate_proj")
                   and r.tensor == "outputs")
        assert row.shape_b == (1, 12, 128) and row.status in ("identical", "close")


def test_the_capture_command_writes_a_multi_rank_folder_with_ranks_all(runs: Path, capsys: Any) -> None:
    folder = runs / "plain_cli"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0", "rank1", fmt.RANKS_FILE]
    assert f"captured 7 module calls into {folder / 'rank1'} (9 payload files" in (runs / "cli.txt").read_text()
    code, out, _ = run_cli(["align", str(runs / "plain_ref"), str(folder), "--shards", str(runs / "rules.txt")],
                           capsys)
    assert code == 0 and "PASSED" in out


def test_op_nodes_of_a_sharded_run_are_left_out_not_judged(runs: Path) -> None:
    """Op nodes hold each rank's own work (its vocabulary offset, its mask): no global tensor to rebuild."""
    result = _align(runs, "plain_ops")
    assert result.passed and _compared(result) >= 12 and not result.shard_findings
    assert {u.module_path for u in result.unmatched_b} == set()
    assert all(row.op is None for row in result.rows)


def test_a_sharded_capture_of_statistics_only_is_compared_on_the_slices_combined_statistics(runs: Path) -> None:
    result = _align(runs, "plain_summary")
    assert result.passed
    up = next(r for r in result.rows if r.module_path_b == "PlainTP.mlp.up" and r.tensor == "outputs")
    assert up.approximate and up.status in ("identical", "close") and up.shape_b == (1, plain_tp.SEQ, plain_tp.FFN)
    partial = next(r for r in result.rows if r.module_path_b == "PlainTP.mlp.down" and r.tensor == "outputs")
    assert partial.status == "no_data"  # a partial sum's statistics are not those of its parts


@pytest.mark.parametrize("name", ["hf_none", "hf_swapped_shards", "torch_shard_differs"])
def test_align_distributed_gives_the_one_process_report_with_recorded_layouts(runs: Path, name: str,
                                                                               capsys: Any) -> None:
    """Layouts from transformers' styles and from DTensors (the plain engine's declared ones: see
    test_distributed_align.py); the logits are replicated, so their verdicts are computed on rank 0 too."""
    from tests.distributed.same_report import assert_same_report

    out = runs / "distributed"
    if not out.exists():  # one launch for every case
        out.mkdir()
        cases = [f"{case}={runs / case}" for case in ("hf_none", "hf_swapped_shards", "torch_shard_differs")]
        _torchrun("align_run.py", str(out), str(runs / "ref"), "-", *cases)
    code, one, err = run_cli(["align", str(runs / "ref"), str(runs / name), "--format", "json"], capsys)
    assert code in (0, 1), err
    assert_same_report(json.loads(one), json.loads((out / f"{name}.json").read_text()))
    assert [(out / f"{name}.rank{r}.code").read_text() for r in (0, 1)] == [str(code)] * 2
    assert json.loads(one)["logits"]  # the logits verdicts were compared, not left out


def test_two_sharded_runs_align_with_each_other(runs: Path) -> None:
    result = tracediff.align(runs / "hf_none", runs / "torch_none")
    assert result.passed and _compared(result) >= 70


def test_a_row_parallel_layer_without_its_all_reduce_is_named_at_its_module(runs: Path) -> None:
    hf = _align(runs, "hf_no_allreduce")
    first = hf.first_divergence
    assert not hf.passed and first is not None
    assert first.module_path_b.endswith("layers.0.mlp.down_proj") and first.tensor == "outputs"
    finding = hf.shard_findings[0]
    assert (finding.kind, finding.rank, finding.module_path) == \
        ("replica_differs", 1, "LlamaForCausalLM.model.layers.0.mlp.down_proj")
    # torch's style keeps the partial sums (a DTensor inside the layer, rebuilt by summing, so the layer is
    # right): the mistake shows where its caller returns them unreduced
    torch_run = _align(runs, "torch_no_allreduce")
    first = torch_run.first_divergence
    assert first is not None and first.module_path_b.endswith("layers.0.mlp") and first.tensor == "outputs"
    assert ("ranks_disagree", 1) == (torch_run.shard_findings[0].kind, torch_run.shard_findings[0].rank)


def test_weights_not_alike_on_every_rank_are_a_finding_naming_the_rank(runs: Path, capsys: Any) -> None:
    result = _align(runs, "hf_replica_differs")
    finding = result.shard_findings[0]
    assert (finding.kind, finding.rank, finding.module_path, finding.tensor) == \
        ("replica_differs", 1, "LlamaForCausalLM.model.layers.0.post_attention_layernorm", "outputs")
    code, out, _ = run_cli(["align", str(runs / "ref"), str(runs / "hf_replica_differs")], capsys)
    assert code == 1
    assert "RANKS DISAGREE (replica_differs) in B: LlamaForCausalLM.model.layers.0.post_attention_layernorm " \
           "outputs: a replicated tensor, it differs on rank 1 from rank 0" in out


def test_shards_in_the_wrong_rank_order_name_the_first_rank_out_of_tolerance(runs: Path) -> None:
    first = _align(runs, "hf_swapped_shards").first_divergence
    assert first is not None and first.module_path_b.endswith("layers.0.mlp.gate_proj")
    assert first.rank == 0


@pytest.mark.parametrize("name", ["torch_shard_differs", "hf_qwen2_shard_differs"])
def test_a_shard_initialised_apart_names_its_rank(runs: Path, name: str) -> None:
    first = _align(runs, name).first_divergence
    assert first is not None and first.module_path_b.endswith("layers.0.self_attn.k_proj")
    assert first.tensor == "outputs" and first.rank == 1


def test_a_vocabulary_parallel_embedding_without_its_mask_is_named(runs: Path) -> None:
    first = _align(runs, "plain_embedding_no_mask").first_divergence
    assert first is not None and first.module_path_b == "PlainTP.embed" and first.tensor == "outputs"


def test_an_unreduced_row_parallel_output_in_a_plain_engine_is_named(runs: Path) -> None:
    result = _align(runs, "plain_no_allreduce")
    first = result.first_divergence
    assert first is not None and first.module_path_b == "PlainTP.mlp"
    assert (result.shard_findings[0].module_path, result.shard_findings[0].rank) == ("PlainTP.mlp", 1)


def test_a_sequence_parallel_region_that_forgets_to_gather_is_named(runs: Path) -> None:
    result = _align(runs, "plain_sp_no_gather")
    assert not result.passed
    finding = next(f for f in result.shard_findings if f.failing)
    assert (finding.kind, finding.module_path, finding.tensor, finding.rank) == \
        ("replica_differs", "PlainTP.mixer", "inputs.args.0", 1)


def test_without_declared_layouts_a_plain_engine_is_placed_by_value_or_listed(runs: Path) -> None:
    # no --shards: the column-parallel output is placed on the reference's values (concatenated along -1)
    result = tracediff.align(runs / "plain_ref", runs / "plain_none")
    up = next(r for r in result.rows if r.module_path_b == "PlainTP.mlp.up" and r.tensor == "outputs")
    assert up.shape_b == (1, plain_tp.SEQ, plain_tp.FFN) and up.status in ("identical", "close")
    # the row-parallel partial sums have the reference's shape: nothing says they are partial, and the ranks
    # hold different values, so the alignment does not pass
    assert not result.passed
    assert any(f.module_path == "PlainTP.mlp.down" and f.kind == "ranks_disagree" for f in result.shard_findings)


def test_the_json_report_carries_the_rank_and_the_findings(runs: Path, capsys: Any) -> None:
    code, out, _ = run_cli(["align", str(runs / "ref"), str(runs / "torch_shard_differs"), "--format", "json"],
                           capsys)
    report = json.loads(out)
    assert code == 1 and report["first_divergence"]["rank"] == 1
    assert report["shard_findings"] == [f.to_dict() for f in _align(runs, "torch_shard_differs").shard_findings]


def test_the_html_report_lists_the_shard_findings(runs: Path) -> None:
    html = _align(runs, "hf_replica_differs").to_html()
    assert '<section id="shards"><h2>Shards</h2>' in html and '<a href="#shards">Shards</a>' in html
    assert "LlamaForCausalLM.model.layers.0.post_attention_layernorm" in html


def test_a_multi_rank_folder_is_not_taken_for_a_dump(runs: Path) -> None:
    from tracediff.importers import detect_kind, opened

    assert detect_kind(runs / "hf_none") is None
    with opened(runs / "hf_none") as source:
        assert source.imported is None and source.trace == str(runs / "hf_none")


def test_the_manifest_and_rank_metadata_conform_to_the_schema(runs: Path) -> None:
    from tests.format.conformance import problems

    folder = runs / "torch_none"
    manifest = json.loads((folder / fmt.RANKS_FILE).read_text())
    assert problems(manifest, "ranks_manifest") == []
    assert manifest["ranks"] == ["rank0", "rank1"] and manifest["mesh"] == {"shape": [2], "dim_names": ["tp"]}
    for rank in (0, 1):
        meta = json.loads((folder / f"rank{rank}" / fmt.METADATA_FILE).read_text())
        assert problems(meta, "metadata") == []
        assert meta["mesh"]["coordinates"] == [rank] and meta["run_started"] == manifest["run_started"]
        tree = json.loads(next((folder / f"rank{rank}").glob(f"*{fmt.FULL_SUFFIX}")).read_text())
        assert problems(tree, "trace") == []


# --- bad input: exit 2, one line naming the problem -------------------------------------------------------


def _copy(runs: Path, name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(runs / name, tmp_path / name))


def _refused(capsys: Any, *argv: str) -> str:
    code, out, err = run_cli(["align", *argv], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    return err


def test_a_missing_rank_folder_is_refused(runs: Path, tmp_path: Path, capsys: Any) -> None:
    folder = _copy(runs, "hf_none", tmp_path)
    shutil.rmtree(folder / "rank1")
    err = _refused(capsys, str(runs / "ref"), str(folder))
    assert f"{folder}: rank folder rank1 is missing (the run had 2 ranks)" in err


def test_ranks_from_different_runs_are_refused(runs: Path, tmp_path: Path, capsys: Any) -> None:
    folder = _copy(runs, "hf_none", tmp_path)
    shutil.rmtree(folder / "rank1")
    shutil.copytree(runs / "torch_none" / "rank1", folder / "rank1")
    err = _refused(capsys, str(runs / "ref"), str(folder))
    assert f"{folder / 'rank1'}: from another run: its run_started" in err


def test_a_layout_that_does_not_fit_the_global_shape_is_refused(runs: Path, tmp_path: Path, capsys: Any) -> None:
    from tests.format.conformance import tensor_entries

    folder = _copy(runs, "torch_none", tmp_path)
    full = next((folder / "rank0").glob(f"*{fmt.FULL_SUFFIX}"))
    tree = json.loads(full.read_text())
    entry = next(e for e in tensor_entries(tree) if fmt.LAYOUT_GLOBAL_SHAPE in e.get(fmt.LAYOUT, {}))
    entry[fmt.LAYOUT][fmt.LAYOUT_GLOBAL_SHAPE][0] += 7
    full.write_text(json.dumps(tree))
    err = _refused(capsys, str(runs / "ref"), str(folder))
    assert "does not fit the global shape [8, " in err and "its shards make [1, " in err


def test_a_declared_rule_that_matches_nothing_is_refused(runs: Path, tmp_path: Path, capsys: Any) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text(plain_tp.SHARDS_RULES + "mlp.gate outputs: dim -1 over tp\n")
    err = _refused(capsys, str(runs / "plain_ref"), str(runs / "plain_none"), "--shards", str(rules))
    assert f"{rules}: line 8: rule 'mlp.gate outputs: dim -1 over tp' matches no tensor" in err
    rules.write_text("mlp.up outputs: dim -1 across tp\n")
    err = _refused(capsys, str(runs / "plain_ref"), str(runs / "plain_none"), "--shards", str(rules))
    assert f"{rules}: line 1: expected 'PATH SLOT: dim D over NAME'" in err
    rules.write_text("mlp.up outputs: dim -1 over tp\n")
    err = _refused(capsys, str(runs / "plain_ref"), str(runs / "plain_ref"), "--shards", str(rules))
    assert "declared layouts need a multi-rank trace; neither trace is one" in err


# --- the rebuild, without torchrun ---------------------------------------------------------------------------


def test_rebuild_nests_mesh_dimensions_as_dtensor_does() -> None:
    """A 2x2 mesh: dim 0 of the mesh shards tensor dim 0, dim 1 shards tensor dim 1 (block layout)."""
    full = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    coordinates = [(0, 0), (0, 1), (1, 0), (1, 1)]
    shards = {rank: full[2 * i:2 * i + 2, 3 * j:3 * j + 3] for rank, (i, j) in enumerate(coordinates)}
    layout = Layout((("S", 0), ("S", 1)), "dtensor")
    payload, diffs = rebuild(layout, lambda r: Payload(np.ascontiguousarray(shards[r]), "float32"), 4, coordinates)
    assert np.array_equal(payload.values, full) and diffs == []


def test_rebuild_sums_partials_and_names_a_replica_that_differs() -> None:
    parts = [np.full((2, 3), 1.5, np.float32), np.full((2, 3), 2.0, np.float32)]
    summed, _ = rebuild(Layout((("P", None),), "declared"), lambda r: Payload(parts[r], "float32"), 2,
                        [(0,), (1,)])
    assert np.array_equal(summed.values, np.full((2, 3), 3.5, np.float32))
    _, diffs = rebuild(Layout((("R", None),), "declared"), lambda r: Payload(parts[r], "float32"), 2,
                       [(0,), (1,)])
    assert [(d.rank, d.reference_rank, d.max_abs_err) for d in diffs] == [(1, 0, 0.5)]


def test_rules_parse_each_kind_of_layout() -> None:
    rules = parse_rules("layers.*.q_proj outputs: dim -1 over tp  # column\nlm_head outputs: replicated\n"
                        "layers.*.o_proj outputs: partial over tp\n", "rules")
    assert rules.layout_for("layers.3.q_proj", "outputs.0", ("tp",)) == Layout((("S", -1),), "declared")
    assert rules.layout_for("layers.3.o_proj", "outputs", ("dp", "tp")) == \
        Layout((("R", None), ("P", None)), "declared")
    assert rules.layout_for("lm_head", "outputs", ("tp",)) == Layout((("R", None),), "declared")
    with pytest.raises(UsageError, match="mesh dimension 'tp' is not one of the run's \\(dp, ep\\)"):
        rules.layout_for("layers.0.q_proj", "outputs", ("dp", "ep"))


def test_a_folder_with_no_rank_that_holds_a_trace_is_not_sharded(tmp_path: Path) -> None:
    (tmp_path / "rank0").mkdir()
    with pytest.raises(TraceFormatError):
        load_sharded(tmp_path)


def test_ranks_whose_call_trees_differ_are_refused(runs: Path, tmp_path: Path, capsys: Any) -> None:
    folder = _copy(runs, "hf_none", tmp_path)
    full = next((folder / "rank1").glob(f"*{fmt.FULL_SUFFIX}"))
    full.write_text(full.read_text().replace('"module_path": "LlamaForCausalLM.model.norm"',
                                             '"module_path": "LlamaForCausalLM.model.final_norm"'))
    err = _refused(capsys, str(runs / "ref"), str(folder))
    assert f"{folder}: rank 1's call LlamaForCausalLM.model.final_norm (call 0) differs from rank 0's " \
           "LlamaForCausalLM.model.norm (call 0): not one run of the same model" in err


# --- training steps under FSDP2 ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsdp")
    fsdp_run.run(root / "one", sharded=False)
    _torchrun("fsdp_run.py", str(root), "fsdp", ",".join(fsdp_run.MISTAKES + fsdp_run.VARIANTS))
    return root


def test_fsdp_steps_compare_against_one_device_with_full_tensors(fsdp_runs: Path) -> None:
    result = tracediff.compare_steps(fsdp_runs / "one", fsdp_runs / "fsdp_none")
    assert result.passed and len(result.step_summaries) == 3
    assert all(summary.compared >= 36 for summary in result.step_summaries)
    record = json.loads((fsdp_runs / "fsdp_none" / "step=0" / "rank1.json").read_text())
    grad = record["groups"]["grads"]["0.weight"]
    assert grad["shape"] == [16, 8] and grad["placements"] == ["Shard(dim=0)"]  # gathered whole, on every rank


def test_fsdp_gradients_not_divided_by_the_world_size_are_named(fsdp_runs: Path) -> None:
    first = tracediff.compare_steps(fsdp_runs / "one", fsdp_runs / "fsdp_no_grad_average").first_divergence
    assert first is not None and (first.step, first.rank, first.group, first.name) == (0, 0, "grads", "0.weight")


def test_tensor_parallel_steps_compare_against_one_device_within_reordered_sums(fsdp_runs: Path) -> None:
    """A row-parallel layer sums partial products across ranks: float32 sums reordered, a few ulps (3e-8 here)."""
    exact = tracediff.compare_steps(fsdp_runs / "one", fsdp_runs / "fsdp_tp")
    assert not exact.passed and exact.needed_atol is not None and exact.needed_atol < 1e-6
    assert tracediff.compare_steps(fsdp_runs / "one", fsdp_runs / "fsdp_tp", atol=1e-6).passed
    record = json.loads((fsdp_runs / "fsdp_tp" / "step=1" / "rank0.json").read_text())
    assert record["groups"]["params"]["2.weight"]["placements"] == ["Shard(dim=1)"]



def test_the_statistics_of_slices_combine_into_the_whole_tensors() -> None:
    """Against tensor_stats of the whole tensor (float64 data: the combination is exact but for rounding)."""
    from tracediff.capturing.stats import tensor_stats
    from tracediff.sharding.stats import combined_stats

    whole = torch.linspace(-3, 5, 7 * 6, dtype=torch.float64).reshape(7, 6)
    whole[2, 3], whole[5, 0], whole[6, 5] = float("nan"), float("inf"), 0.0
    parts = [tensor_stats(part) for part in (whole[:, :1], whole[:, 1:4], whole[:, 4:])]
    combined, expected = combined_stats(parts), tensor_stats(whole)
    assert set(combined) == set(expected)
    for key, value in expected.items():
        assert combined[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
