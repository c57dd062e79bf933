"""``tracediff align REF SHARDED --distributed``: each rank compares the shards of its own rank folder, rank 0
merges the rows. Real torchrun runs with 2 processes on CPU (gloo) against the one-process align of the same
folders: the same rows, the same first divergence and rank, the same findings and exit code.

Allowed differences, each documented in docs/distributed.md ("Compare where the data lives"): ``mean_abs_err``,
``rms_err`` and ``cosine`` add their sums in another order (float32 sums of each chunk: within 1e-5
relative, far below any tolerance); ``pcc`` of a sliced row merges float64 moments (within 1e-12); a replica's
finding says "its bytes differ" instead of how far. Positions and the position strip are compared exactly.
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
from tests.distributed.same_report import assert_same_report
from tests.rounding import U32, cosine_error, kappa, mean_error, pcc_error
from tracediff.compare.metrics import compare_tensors
from tracediff.compare.parts import measure_part, merge_parts
from tracediff.errors import UsageError

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import plain_tp  # noqa: E402

MISTAKES = ("none", "embedding_no_mask", "no_allreduce", "sp_no_gather")


#: planted after the run in a copy of plain_none: rank 1's copy of a replicated tensor (the embedding's output),
#: rank 1's slice of a column-parallel output
CHANGED = {"replica_differs": "PlainTP.embed_outputs", "shard_differs": "PlainTP.mlp.up_outputs"}


def _changed(root: Path, name: str) -> Path:
    """plain_none with one of rank 1's payloads shifted by 0.5."""
    from safetensors.numpy import load_file, save_file

    folder = Path(shutil.copytree(root / "plain_none", root / f"plain_{name}"))
    path = folder / "rank1" / f"{CHANGED[name]}.safetensors"
    tensors = load_file(str(path))
    save_file({key: value + np.float32(0.5) for key, value in tensors.items()}, str(path))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("distalign")
    plain_tp.run(root / "plain_ref", "none")
    (root / "rules.txt").write_text(plain_tp.SHARDS_RULES)
    done = torchrun(str(HERE / "plain_tp.py"), "tp", str(root), ",".join(MISTAKES))
    assert done.returncode == 0, done.stderr[-4000:]
    for name in CHANGED:
        _changed(root, name)
    (root / "out").mkdir()
    cases = [f"{name}={root / f'plain_{name}'}" for name in (*MISTAKES, *CHANGED)]
    done = torchrun(str(HERE / "align_run.py"), str(root / "out"), str(root / "plain_ref"), str(root / "rules.txt"),
                     *cases)
    assert done.returncode == 0, done.stderr[-4000:]
    return root


def _one_process(runs: Path, name: str, capsys: Any) -> tuple[int, dict[str, Any]]:
    code, out, err = run_cli(["align", str(runs / "plain_ref"), str(runs / f"plain_{name}"), "--shards",
                              str(runs / "rules.txt"), "--format", "json"], capsys)
    assert code in (0, 1), err
    return code, json.loads(out)


@pytest.mark.parametrize("name", [*MISTAKES, *CHANGED])
def test_the_distributed_report_is_the_one_process_report(runs: Path, name: str, capsys: Any) -> None:
    code, one = _one_process(runs, name, capsys)
    apart = json.loads((runs / "out" / f"{name}.json").read_text())
    assert_same_report(one, apart)
    assert [(runs / "out" / f"{name}.rank{r}.code").read_text() for r in (0, 1)] == [str(code)] * 2
    if name == "none":
        assert code == 0 and one["passed"]
        assert sum(row["status"] in ("identical", "close") for row in one["rows"]) >= 12
    else:
        assert code == 1 and not one["passed"]
    if name == "shard_differs":  # the rank whose shard first goes out of tolerance, merged from the ranks' parts
        first = apart["first_divergence"]
        assert (first["module_path_b"], first["tensor"], first["rank"]) == ("PlainTP.mlp.up", "outputs", 1)
    if name == "replica_differs":
        found = [(f["kind"], f["module_path"], f["rank"]) for f in apart["shard_findings"]]
        # the changed copy, and the next call's input (a copy recorded without a layout) that holds it too
        assert found == [("replica_differs", "PlainTP.embed", 1), ("ranks_disagree", "PlainTP.norm", 1)]


def test_ranks_that_disagree_with_every_row_in_tolerance_are_said_so_in_text_and_html(runs: Path) -> None:
    """Rank 0's copy is the reference's: no row is out of tolerance, the verdict comes from the ranks alone."""
    result = tracediff.align(runs / "plain_ref", runs / "plain_replica_differs", shards=runs / "rules.txt")
    assert result.verdict == "diverged" and result.first_divergence is None
    from tracediff.render.alignment import headline

    assert "NOT PASSED: the ranks disagree on 2 replicated tensor(s)" in headline(result)
    html = result.to_html()
    assert 'class="first">The ranks disagree on 2 replicated tensor(s)' in html and "Undecided" not in html


def test_the_command_line_under_torchrun_writes_one_report_and_every_rank_exits_alike(runs: Path) -> None:
    report = runs / "cli_report.json"
    done = torchrun("-m", "tracediff", "align", str(runs / "plain_ref"), str(runs / "plain_no_allreduce"),
                     "--shards", str(runs / "rules.txt"), "--distributed", "--format", "json", "-o", str(report))
    # a rank that exits 1 (diverged) is a failed worker to torchrun: it exits 1 and lists each rank's code
    assert done.returncode == 1
    assert done.stderr.count("exitcode  : 1 ") == 2, done.stderr[-3000:]
    assert json.loads(report.read_text()) == json.loads((runs / "out" / "no_allreduce.json").read_text())


def test_distributed_without_torchrun_is_a_usage_error(runs: Path, capsys: Any, monkeypatch: Any) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run_cli(["align", str(runs / "plain_ref"), str(runs / "plain_none"), "--distributed"], capsys)
    assert (code, out) == (2, "")
    assert err == ("tracediff align: error: --distributed: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set: "
                   "launch with torchrun --nproc-per-node N -m tracediff align REF SHARDED --distributed\n")
    with pytest.raises(UsageError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set"):
        tracediff.align(runs / "plain_ref", runs / "plain_none", shards=runs / "rules.txt", distributed=True)


def test_a_launch_of_another_size_than_the_rank_folders_is_a_usage_error(runs: Path) -> None:
    """Refused on every rank before any collective (so no rank waits for another): checked here in one process."""
    from tracediff.alignment.distributed import Group, measure_where_stored
    from tracediff.alignment.lm_verdicts import TokenSpans
    from tracediff.sharding import load_sharded

    trace_b = load_sharded(runs / "plain_none", shards=tracediff.sharding.read_rules(runs / "rules.txt"))
    ref = tracediff.load_trace(runs / "plain_ref")
    with pytest.raises(UsageError) as caught:
        measure_where_stored(Group(0, 3), [], ref, trace_b, lambda order: (0.0, 0.0), {}, TokenSpans.of(trace_b))
    assert str(caught.value) == (f"{runs / 'plain_none'}: --distributed runs one process per rank folder of B, and "
                                 "B holds 2 rank folders for 3 processes: launch torchrun --nproc-per-node with "
                                 "B's rank count")
    with pytest.raises(UsageError, match="B is not a multi-rank folder for 2 processes"):
        measure_where_stored(Group(0, 2), [], ref, ref, lambda order: (0.0, 0.0), {}, TokenSpans.of(ref))


# --- the parts merged, without torchrun ----------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1])
def test_slices_measured_apart_merge_into_the_metrics_of_the_whole(axis: int) -> None:
    """Counts, maxima and tolerances merge exactly; sums in another order, within float32 rounding of a sum."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = a + rng.standard_normal(a.shape).astype(np.float32) * 1e-6
    b[5, 40] += 0.25
    b[50, 3] = np.nan
    a[7, 7] = b[7, 7] = np.inf
    a[9, 1], b[9, 1] = 0.0, 1e-3
    whole = compare_tensors(a, b, atol=1e-5, rtol=1e-5)
    parts = [measure_part(x, y, atol=1e-5, rtol=1e-5)
             for x, y in zip(np.array_split(a, 3, axis=axis), np.array_split(b, 3, axis=axis))]
    merged, pcc = merge_parts(parts, atol=1e-5, rtol=1e-5)
    for field in ("numel", "identical", "max_abs_err", "max_rel_err", "nan_mismatch", "inf_mismatch", "mismatched",
                  "mismatch_fraction", "required_atol", "required_rtol"):
        assert getattr(merged, field) == getattr(whole, field), field
    # the same float32 products summed in another grouping, each within its bound of the exact value
    n = int(np.count_nonzero(np.isfinite(a) & np.isfinite(b)))
    for field in ("mean_abs_err", "rms_err"):
        assert getattr(merged, field) == pytest.approx(getattr(whole, field), rel=2 * mean_error(n, U32)), field
    assert abs(merged.cosine - whole.cosine) <= 2 * cosine_error(n, U32, whole.cosine)
    keep = np.isfinite(a) & np.isfinite(b)
    x, y = a[keep].astype(np.float64), b[keep].astype(np.float64)
    # float64 moments merged by Chan's formula against numpy's two-pass float64 correlation
    expected = float(np.corrcoef(x, y)[0, 1])
    assert abs(pcc - expected) <= 2 * pcc_error(n, expected, kappa(x, y))


def test_identical_slices_merge_into_an_identical_pair() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    merged, pcc = merge_parts([measure_part(a[:, :2], a[:, :2], atol=0.0, rtol=0.0),
                               measure_part(a[:, 2:], a[:, 2:], atol=0.0, rtol=0.0)], atol=0.0, rtol=0.0)
    assert merged.identical and merged.numel == 12 and pcc == 1.0
