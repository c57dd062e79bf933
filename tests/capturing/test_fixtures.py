"""The committed example traces: regenerated identically, small, documented, and showing what they claim."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from tests.capturing.helpers import files, nodes, payload, payload_fingerprint, tensor_entries, trace_json

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PROVENANCE = "provenance.json"


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


def regeneration_problems(fresh: Path, committed: Path) -> list[str]:
    """How the regenerated fixture ``fresh`` differs from ``committed`` in what the format promises.

    The same files; the same JSON (the capture time aside); the same payload
    bytes. ``provenance.json`` is left out: it names the versions, compared apart.
    """
    names_fresh, names_committed = files(fresh) - {PROVENANCE}, files(committed) - {PROVENANCE}
    problems = [f"{name}: not written any more" for name in sorted(names_committed - names_fresh)]
    problems += [f"{name}: new" for name in sorted(names_fresh - names_committed)]
    for name in sorted(names_fresh & names_committed):
        if name.endswith(".json"):
            if _json_without_created(fresh / name) != _json_without_created(committed / name):
                problems.append(f"{name}: other JSON")
        elif (fresh / name).read_bytes() != (committed / name).read_bytes():
            same_tensor = payload_fingerprint(fresh / name) == payload_fingerprint(committed / name)
            problems.append(f"{name}: {'other bytes' if same_tensor else 'other tensor'}")
    return problems


def version_changes(committed: Path, now: dict[str, str | None]) -> list[str]:
    """``"transformers 5.23.0 -> 5.24.0"`` for each version that differs from the fixture's ``provenance.json``."""
    recorded = json.loads((committed / PROVENANCE).read_text())["versions"]
    return [f"{name} {recorded.get(name)} -> {version}" for name, version in now.items()
            if recorded.get(name) != version]


def regeneration_verdict(name: str, fresh: Path, committed: Path, now: dict[str, str | None]) -> str | None:
    """None when ``fresh`` is what ``committed`` promises; else one message naming the versions that changed."""
    problems = regeneration_problems(fresh, committed)
    if not problems:
        return None
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    changes = version_changes(committed, now)
    cause = (f"it was written with other versions ({', '.join(changes)}): if the change is expected, regenerate "
             "with `python fixtures/make_fixtures.py` and commit" if changes else
             "it was written with the same versions, so tracediff or the fixture script changed")
    return f"{name}: the regenerated fixture differs ({shown}); {cause}"


@pytest.mark.slow
def test_fixtures_are_regenerated_identically(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    script = _script()
    names = list(script.FIXTURES)
    script.make_fixtures(tmp_path, only=names)
    verdicts = [regeneration_verdict(name, tmp_path / name, FIXTURES / name, script.versions()) for name in names]
    assert not any(verdicts), "\n".join(filter(None, verdicts))


def test_a_changed_fixture_names_the_version_that_changed(tmp_path: Path) -> None:
    script = _script()
    committed, fresh = tmp_path / "committed", tmp_path / "fresh"
    shutil.copytree(FIXTURES / "llama_tiny" / "ref", committed)
    shutil.copytree(FIXTURES / "llama_tiny" / "ref", fresh)
    now = json.loads((committed / PROVENANCE).read_text())["versions"]
    assert regeneration_verdict("llama_tiny/ref", fresh, committed, now) is None

    head = fresh / "LlamaForCausalLM.lm_head_inputs_args_0.safetensors"
    tensor = payload(fresh, "./" + head.name)
    save_file({"data": tensor + 1e-7}, str(head))
    assert regeneration_verdict("llama_tiny/ref", fresh, committed, now) == (
        "llama_tiny/ref: the regenerated fixture differs (LlamaForCausalLM.lm_head_inputs_args_0.safetensors: "
        "other tensor); it was written with the same versions, so tracediff or the fixture script changed")

    newer = {**now, "transformers": "99.0.0"}
    verdict = regeneration_verdict("llama_tiny/ref", fresh, committed, newer)
    assert verdict is not None and verdict.endswith(
        f"it was written with other versions (transformers {now['transformers']} -> 99.0.0): if the change is "
        "expected, regenerate with `python fixtures/make_fixtures.py` and commit")
    assert set(script.versions()) == set(now) == {"python", "cpu_capability", *script.PRODUCERS}


def test_every_fixture_exists_is_documented_and_small() -> None:
    names = list(_script().FIXTURES)
    readme = (FIXTURES / "README.md").read_text()
    for name in names:
        assert (FIXTURES / name).is_dir() and f"`{name}`" in readme, name
        assert trace_json(FIXTURES / name)["module_path"]
        provenance = json.loads((FIXTURES / name / PROVENANCE).read_text())
        assert provenance["fixture"] == name and provenance["versions"]["torch"], name
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


def names_changes(committed: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What a transformers release renamed, per model: modules and ``forward`` parameters gone and new."""
    changes = []
    for key in sorted(set(committed["models"]) | set(now["models"])):
        before, after = committed["models"].get(key), now["models"].get(key)
        if before is None or after is None:
            changes.append(f"{key}: {'new' if before is None else 'no longer built'}")
            continue
        for part in ("modules", "forward"):
            gone = [n for n in before[part] if n not in after[part]]
            new = [n for n in after[part] if n not in before[part]]
            if gone or new:
                changes.append(f"{before['class']} {part}: {', '.join(gone[:4]) or '-'} -> {', '.join(new[:4]) or '-'}")
    return changes


def test_transformers_names_the_tests_rely_on_are_unchanged() -> None:
    """A transformers release that renames modules or ``forward`` arguments of common models is named here."""
    pytest.importorskip("transformers")
    script = _script()
    committed = json.loads((FIXTURES / script.NAMES_FILE).read_text())
    now = script.transformers_names()
    changes = names_changes(committed, now)
    assert not changes, (f"transformers {committed['transformers']} -> {now['transformers']} renamed: "
                         + "; ".join(changes) + ". Check the rename maps and docs that use these names, then "
                         "regenerate with `python fixtures/make_fixtures.py`")


def test_a_rename_is_named_model_part_and_names() -> None:
    committed = json.loads((FIXTURES / _script().NAMES_FILE).read_text())
    renamed = json.loads(json.dumps(committed))
    llama = renamed["models"]["llama"]
    llama["forward"] = [("past_key_values" if name == "cache" else name) for name in llama["forward"]]
    llama["modules"] = [name.replace("self_attn", "attention") for name in llama["modules"]]
    assert names_changes(committed, committed) == []
    assert names_changes(committed, renamed) == [
        "LlamaForCausalLM modules: model.layers.0.self_attn, model.layers.0.self_attn.q_proj, "
        "model.layers.0.self_attn.k_proj, model.layers.0.self_attn.v_proj -> model.layers.0.attention, "
        "model.layers.0.attention.q_proj, model.layers.0.attention.k_proj, model.layers.0.attention.v_proj",
        "LlamaForCausalLM forward: cache -> past_key_values",
    ]
