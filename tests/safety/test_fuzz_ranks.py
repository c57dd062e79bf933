"""Mutation fuzzing of multi-rank folders, their layouts and ``--shards`` rules files.

Each example copies a genuine 2-rank capture (``tests/distributed/plain_tp.py`` under torchrun, gloo on CPU:
plain local shards, layouts declared by a rules file) and applies one to three mutations: the ranks manifest
or a rank's JSON mutated as in ``test_fuzz.py``, a tensor entry's ``layout`` replaced by a hostile one, a
shard's payload replaced by a valid safetensors file of another shape or dtype (or by a directory, a FIFO, a
link...), a rank folder removed, duplicated or linked elsewhere, a rules file line replaced by a hostile one.
It then aligns the one-process reference against it with ``--shards``, the folder against the reference, and
the genuine folder against it (two sharded traces). Asserted, besides ``test_fuzz.check_run``'s promises (exit
0, 1 or 2, no traceback, one line for exit 2, strict JSON, ``passed`` agreeing with the exit code, at most
20 s): a passing report has no row left without data or unreadable, and no tensor left unplaced.

``FUZZ_RANK_EXAMPLES`` examples (100 by default, derandomized in CI); by hand::

    FUZZ_RANK_EXAMPLES=2000 HYPOTHESIS_PROFILE=explore FUZZ_VERBOSE=1 \
        python -m pytest -s tests/safety/test_fuzz_ranks.py
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.distributed.launch import torchrun
from tests.safety.helpers import cli, copy
from tests.safety.test_fuzz import HUGE_INT, RUN_SECONDS, mutate_file_kind, mutate_json, time_limit
from tracediff import format as fmt

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

DISTRIBUTED = Path(__file__).parents[1] / "distributed"
sys.path.insert(0, str(DISTRIBUTED))
import plain_tp  # noqa: E402

FUZZ_RANK_EXAMPLES = int(os.environ.get("FUZZ_RANK_EXAMPLES", "100"))
HOSTILE_LAYOUTS: list[Any] = [
    None, 7, "R", [], {}, {"placements": None}, {"placements": ["S(" + HUGE_INT + ")"]}, {"placements": ["S(9)"]},
    {"placements": ["S(-4)"]}, {"placements": ["P"]}, {"placements": ["R"]}, {"placements": ["R", "R"]},
    {"placements": ["X"]}, {"placements": [3]}, {"placements": ["S(0)"], "global_shape": [7, 8, 16]},
    {"placements": ["S(1)"], "global_shape": "x"}, {"placements": ["S(1)"], "global_shape": [2 ** 70]},
    {"placements": ["S(1)"], "source": {"a": 1}},
]
HOSTILE_RULE_LINES = [
    "", "#", "mlp.up outputs: dim " + HUGE_INT + " over tp", "mlp.up outputs: dim 9 over tp",
    "mlp.up outputs: dim -1 over nowhere", "* outputs: partial over tp", "* inputs: replicated", "**** x: replicated",
    "[ outputs: replicated", "mlp.up outputs: replicated", "norm outputs: dim 0 over tp", "\x1b[2J outputs: replicated",
    "mlp.down outputs: dim 1 over tp", "embed outputs: partial over tp", "mixer inputs: dim 1 over tp",
]


def _payload_of_another_kind(path: Path, data: st.DataObject) -> None:
    """A valid payload file whose tensor is not the one its record states (another shape, dims or dtype)."""
    from tracediff.files.payloads import read_tensor_file, write_tensor_file

    try:
        tensor = read_tensor_file(path, payload=True).clone()
    except Exception:  # an earlier mutation broke it: leave it so
        return
    kind = data.draw(st.sampled_from(["0d", "row", "extra_dim", "float64", "bfloat16", "int64", "scaled", "zeros"]))
    changed = {"0d": lambda t: t.reshape(-1)[:1].reshape(()), "row": lambda t: t.reshape(-1)[: t.shape[-1]].clone(),
               "extra_dim": lambda t: t.unsqueeze(0), "float64": lambda t: t.double(),
               "bfloat16": lambda t: t.bfloat16(), "int64": lambda t: t.long(), "scaled": lambda t: t * 3 + 1,
               "zeros": lambda t: torch.zeros_like(t)}[kind](tensor)
    write_tensor_file(path, changed)


def _mutate_layout(tree_path: Path, data: st.DataObject) -> None:
    from tests.format.conformance import tensor_entries

    try:
        tree = json.loads(tree_path.read_text())
    except (OSError, ValueError, RecursionError):
        return
    entries = list(tensor_entries(tree))
    if not entries:
        return
    entry = entries[data.draw(st.integers(0, len(entries) - 1))]
    entry[fmt.LAYOUT] = data.draw(st.sampled_from(HOSTILE_LAYOUTS))
    tree_path.write_text(json.dumps(tree))


def _mutate_rules(rules: Path, data: st.DataObject) -> None:
    lines = rules.read_text().splitlines()
    kind = data.draw(st.sampled_from(["replace", "add", "delete", "many"]))
    if kind == "many":
        lines += [f"*{i} outputs: replicated" for i in range(data.draw(st.sampled_from([5000, 40_000])))]
    elif kind == "delete" and lines:
        del lines[data.draw(st.integers(0, len(lines) - 1))]
    else:
        line = data.draw(st.sampled_from(HOSTILE_RULE_LINES))
        at = data.draw(st.integers(0, len(lines)))
        lines[at:at + (kind == "replace")] = [line]
    rules.write_text("\n".join(lines) + "\n")


def _mutate_rank_folders(folder: Path, outside: Path, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["remove", "duplicate", "link_other", "link_outside", "file"]))
    rank1 = folder / "rank1"
    if not rank1.is_dir() or rank1.is_symlink():
        return
    shutil.rmtree(rank1)
    if kind == "duplicate":
        shutil.copytree(folder / "rank0", rank1, symlinks=True)
    elif kind == "link_other":
        rank1.symlink_to("rank0")
    elif kind == "link_outside":
        rank1.symlink_to(outside)
    elif kind == "file":
        rank1.write_text("not a folder")


def _check(argv: list[str], capsys: Any) -> None:
    """``test_fuzz.check_run``'s promises, and: a pass leaves no row without data and no tensor unplaced."""
    with time_limit(RUN_SECONDS):
        code, out, err = cli(argv, capsys)
    if os.environ.get("FUZZ_VERBOSE"):
        print(f"fuzz ranks: exit {code}: {err.strip()[:160]}", file=sys.__stderr__)
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("tracediff align: error: "), err
        return

    def refuse(constant: str) -> Any:
        raise AssertionError(f"non-strict JSON constant {constant}")

    report = json.loads(out, parse_constant=refuse)
    assert report["passed"] is (code == 0), (code, report["passed"])
    if code == 0:
        assert not [r for r in report["rows"] if r["status"] in ("no_data", "unreadable")], report["rows"]
        assert not report["shard_findings"], report["shard_findings"]


@pytest.fixture(scope="module")
def fuzz_ranks_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz_ranks")
    plain_tp.run(root / "plain_ref", "none")
    done = torchrun(str(DISTRIBUTED / "plain_tp.py"), "tp", str(root), "none")
    assert done.returncode == 0, done.stderr[-4000:]
    (root / "rules.txt").write_text(plain_tp.SHARDS_RULES)
    (root / "outside").mkdir()
    return root


@settings(max_examples=FUZZ_RANK_EXAMPLES, suppress_health_check=list(HealthCheck), deadline=None)
@given(data=st.data())
def test_mutated_multi_rank_folders_layouts_and_rules_keep_every_promise(
        data: st.DataObject, fuzz_ranks_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fuzz_ranks_root
    work = root / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    b = copy(root / "plain_none", work / "b")
    rules = Path(shutil.copy(root / "rules.txt", work / "rules.txt"))
    for _ in range(data.draw(st.integers(1, 3))):
        rank = b / f"rank{data.draw(st.integers(0, 1))}"
        target = data.draw(st.sampled_from(["manifest", "tree", "metadata", "layout", "payload", "payload",
                                            "payload_file", "folders", "rules"]))
        tree = next(rank.glob(f"*{fmt.FULL_SUFFIX}"), None) if rank.is_dir() and not rank.is_symlink() else None
        payloads = sorted(rank.glob("*.safetensors")) if tree is not None else []
        if target == "manifest" and (b / fmt.RANKS_FILE).is_file():
            mutate_json(b / fmt.RANKS_FILE, data)
        elif target == "tree" and tree is not None and tree.is_file():
            mutate_json(tree, data)
        elif target == "metadata" and (rank / fmt.METADATA_FILE).is_file():
            mutate_json(rank / fmt.METADATA_FILE, data)
        elif target == "layout" and tree is not None and tree.is_file():
            _mutate_layout(tree, data)
        elif target == "payload" and payloads:
            _payload_of_another_kind(data.draw(st.sampled_from(payloads)), data)
        elif target == "payload_file" and payloads:
            mutate_file_kind(data.draw(st.sampled_from(payloads)), root / "outside" / "x.safetensors", data)
        elif target == "folders":
            _mutate_rank_folders(b, root / "outside", data)
        elif target == "rules":
            _mutate_rules(rules, data)
    _check(["align", str(root / "plain_ref"), str(b), "--shards", str(rules), "--format", "json"], capsys)
    _check(["align", str(b), str(root / "plain_ref"), "--format", "json"], capsys)
    _check(["align", str(root / "plain_none"), str(b), "--format", "json"], capsys)


def test_the_rank_fuzzer_mutates_for_real(fuzz_ranks_root: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The harness itself: the genuine folder passes, and a shard of another shape is an unreadable row."""
    root = fuzz_ranks_root
    rules = str(root / "rules.txt")
    code, out, _ = cli(["align", str(root / "plain_ref"), str(root / "plain_none"), "--shards", rules,
                        "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["summary"]["compared"] == 14
    b = copy(root / "plain_none", tmp_path / "b")
    up = b / "rank1" / "PlainTP.mlp.up_outputs.safetensors"
    assert up.is_file()
    from tracediff.files.payloads import read_tensor_file, write_tensor_file

    write_tensor_file(up, read_tensor_file(up, payload=True).unsqueeze(0).clone())
    code, out, _ = cli(["align", str(root / "plain_ref"), str(b), "--shards", rules, "--format", "json"], capsys)
    rows = json.loads(out)["rows"]
    up_rows = [r for r in rows if (r["module_path_b"], r["tensor"]) == ("PlainTP.mlp.up", "outputs")]
    assert code == 1 and [r["status"] for r in up_rows] == ["unreadable"]
