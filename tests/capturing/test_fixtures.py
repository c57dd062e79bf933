"""The committed example traces: regenerated identically, small, documented, and showing what they claim."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tests.capturing.helpers import files, nodes, payload, payload_fingerprint, tensor_entries, trace_json

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _script():
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _json_without_created(path: Path) -> object:
    data = json.loads(path.read_text())
    if path.name == "tracediff_metadata.json":
        data.pop("created")
    return data


@pytest.mark.slow
def test_fixtures_are_regenerated_identically(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    names = ["llama_tiny/ref", "llama_tiny/native"]
    _script().make_fixtures(tmp_path, only=names)
    for name in names:
        fresh, committed = tmp_path / name, FIXTURES / name
        assert files(fresh) == files(committed), name
        for file in sorted(files(committed)):
            if file.endswith(".json"):
                assert _json_without_created(fresh / file) == _json_without_created(committed / file), file
            else:
                assert payload_fingerprint(fresh / file) == payload_fingerprint(committed / file), file
                assert (fresh / file).read_bytes() == (committed / file).read_bytes(), file


def test_every_fixture_exists_is_documented_and_small() -> None:
    names = list(_script().FIXTURES)
    readme = (FIXTURES / "README.md").read_text()
    for name in names:
        assert (FIXTURES / name).is_dir() and f"`{name}`" in readme, name
        assert trace_json(FIXTURES / name)["module_path"]
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < 2_000_000


def test_port_bug_departs_from_ref_exactly_at_the_documented_module() -> None:
    script = _script()
    ref, bug = FIXTURES / "llama_tiny" / "ref", FIXTURES / "llama_tiny" / "port_bug"
    assert f"`{script.PORT_BUG_MODULE}`" in (FIXTURES / "README.md").read_text()
    ref_tree, bug_tree = trace_json(ref), trace_json(bug)
    assert [n["module_path"] for n in nodes(ref_tree)] == [n["module_path"] for n in nodes(bug_tree)]

    def same(a: dict, b: dict) -> bool:
        return torch.equal(payload(ref, a).view(-1).view(torch.uint8), payload(bug, b).view(-1).view(torch.uint8))

    # transformers' trees list calls in order; leaves carry outputs, every node carries inputs.
    first_departure = None
    for a, b in zip(nodes(ref_tree), nodes(bug_tree)):
        if not all(same(x, y) for x, y in zip(tensor_entries(a.get("inputs")), tensor_entries(b.get("inputs")))):
            first_departure = first_departure or (a["module_path"], "inputs")
        if not all(same(x, y) for x, y in zip(tensor_entries(a.get("outputs")), tensor_entries(b.get("outputs")))):
            first_departure = first_departure or (a["module_path"], "outputs")
    assert first_departure == (script.PORT_BUG_MODULE, "outputs")
    # transformers keeps outputs on leaves only: the logits are lm_head's.
    head = "LlamaForCausalLM.lm_head"
    ref_head, bug_head = (next(n for n in nodes(t) if n["module_path"] == head) for t in (ref_tree, bug_tree))
    assert not same(ref_head["outputs"], bug_head["outputs"])


def test_native_fixture_is_the_same_run_as_ref() -> None:
    ref, native = FIXTURES / "llama_tiny" / "ref", FIXTURES / "llama_tiny" / "native"
    ref_leaves = {n["module_path"]: n for n in nodes(trace_json(ref)) if "outputs" in n}
    native_nodes = {n["module_path"]: n for n in nodes(trace_json(native))}
    assert len(ref_leaves) > 20
    for path, node in ref_leaves.items():
        for a, b in zip(tensor_entries(node["outputs"]), tensor_entries(native_nodes[path]["outputs"])):
            assert torch.equal(payload(ref, a), payload(native, b)), path
    meta = json.loads((native / "tracediff_metadata.json").read_text())
    assert meta["complete"] is True and meta["model_name"] == "LlamaForCausalLM"
