"""Capture under a real two-process gloo group on CPU: which ranks write, and DTensor shards."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.capturing.helpers import files, find, metadata, payload, trace_json

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("dist_worker.py")
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("dist")
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=90)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the two ranks did not finish within 90 s (a collective mismatch hangs)")
    for rank, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"
    return out


def _session(out: Path, scenario: str, rank: int) -> dict:
    return json.loads((out / f"session_{scenario}_rank{rank}.json").read_text())


def test_default_records_rank_0_only(two_ranks: Path) -> None:
    folder = two_ranks / "default"
    assert _session(two_ranks, "default", 0)["recording"] is True
    assert _session(two_ranks, "default", 1)["recording"] is False
    assert not any(name.startswith("rank") for name in files(folder))
    meta = metadata(folder)
    assert (meta["rank"], meta["world_size"], meta["complete"]) == (0, 2, True)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(payload(folder, trace_json(folder)["inputs"]["args"][0]), x)  # rank 0's input (x + 0)


def test_ranks_all_writes_one_folder_per_rank(two_ranks: Path) -> None:
    folder = two_ranks / "all"
    assert {p.name for p in folder.iterdir()} == {"rank0", "rank1", "tracediff_ranks.json"}
    manifest = json.loads((folder / "tracediff_ranks.json").read_text())
    assert (manifest["world_size"], manifest["ranks"]) == (2, ["rank0", "rank1"])
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    for rank in (0, 1):
        meta = metadata(folder / f"rank{rank}")
        assert (meta["rank"], meta["world_size"], meta["complete"]) == (rank, 2, True)
        assert meta["run_started"] == manifest["run_started"]
        assert meta["options"]["ranks"] == "all"
        recorded = payload(folder / f"rank{rank}", trace_json(folder / f"rank{rank}")["inputs"]["args"][0])
        assert torch.equal(recorded, x + rank)


FULL = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3)


def _expected_b_output() -> torch.Tensor:
    return (FULL * 2.0 + 1.0) * -1.0 + 0.5


def test_dtensor_records_the_local_shard_by_default(two_ranks: Path) -> None:
    folder = two_ranks / "dtensor_local"
    assert _session(two_ranks, "dtensor_local", 1)["recording"] is False
    tree = trace_json(folder)
    entry = find(tree, "ShardedModel.b")[0]["outputs"]
    assert entry["dtensor"] == {"global_shape": [8, 3], "placements": ["Shard(dim=0)"], "recorded": "local"}
    assert entry["shape"] == "torch.Size([4, 3])"
    assert torch.equal(payload(folder, entry), _expected_b_output()[:4])
    gathered = find(tree, "ShardedModel.gather")[0]["outputs"]
    assert gathered["dtensor"]["placements"] == ["Replicate()"]
    assert torch.equal(payload(folder, gathered), _expected_b_output())


def test_dtensor_full_records_the_gathered_tensor(two_ranks: Path) -> None:
    folder = two_ranks / "dtensor_full"
    tree = trace_json(folder)
    a, b = find(tree, "ShardedModel.a")[0], find(tree, "ShardedModel.b")[0]
    assert b["inputs"]["args"][0] == a["outputs"]  # the same DTensor, gathered once on every rank
    entry = b["outputs"]
    assert entry["dtensor"] == {"global_shape": [8, 3], "placements": ["Shard(dim=0)"], "recorded": "full"}
    assert entry["shape"] == "torch.Size([8, 3])"
    assert torch.equal(payload(folder, entry), _expected_b_output())
    assert torch.equal(payload(folder, tree["inputs"]["args"][0]), FULL)
    assert metadata(folder)["complete"] is True


def test_verify_reruns_on_every_rank(two_ranks: Path) -> None:
    """The rerun has collectives (``gather``): only possible because rank 1 reruns too."""
    for rank in (0, 1):
        verification = _session(two_ranks, "dtensor_verify", rank)["verification"]
        assert verification == {"identical": True, "compared": 2, "differences": []}


SPEC_STARTING_A_GROUP = """
import torch

def build():
    torch.distributed.init_process_group("gloo")
    return torch.nn.Linear(2, 2), torch.ones(1, 2)
"""


def test_the_command_line_tears_down_the_group_its_spec_started(tmp_path: Path) -> None:
    """Left to interpreter shutdown, gloo's threads can still be joinable and a rank aborts (SIGABRT) after a
    complete trace: ``tracediff capture`` under torchrun is a whole process, so it ends the group itself."""
    (tmp_path / "spec.py").write_text(SPEC_STARTING_A_GROUP)
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    script = ("import torch.distributed as dist; from tracediff.cli.main import main; "
              f"code = main(['capture', {str(tmp_path / 'spec.py')!r} + ':build', '--ranks', 'all', '--out', "
              f"{str(tmp_path / 'out')!r}]); print('exit', code, 'group', dist.is_initialized())")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "exit 0 group False"
    assert (tmp_path / "out" / "tracediff_metadata.json").is_file()  # one rank: a plain trace folder
