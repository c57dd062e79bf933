"""``tracediff.model_addition_debugger_context`` writes what transformers' debugger writes, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tracediff
from tests.capturing.helpers import files, nodes, payload_fingerprint, trace_json
from tests.models import HF_BUILDERS, Chain, SharedLoop, seeded, toy_input

transformers = pytest.importorskip("transformers")


def _run_both(build, tmp_path: Path, **options) -> tuple[Path, Path, object, object]:
    ours_dir, theirs_dir = tmp_path / "ours", tmp_path / "theirs"
    # Ours first: it must not rely on print options that transformers' debugger leaves behind.
    model, inputs = build()
    with tracediff.model_addition_debugger_context(model, debug_path=str(ours_dir), **options):
        ours_out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    model, inputs = build()
    with transformers.model_addition_debugger_context(model, debug_path=str(theirs_dir), **options):
        theirs_out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    return ours_dir, theirs_dir, ours_out, theirs_out


def _assert_same_trace(ours: Path, theirs: Path) -> None:
    assert files(ours) == files(theirs)
    json_names = sorted(name for name in files(ours) if name.endswith(".json"))
    assert [n.rsplit("_debug_tree_", 1)[1] for n in json_names] == ["FULL_TENSORS.json", "SUMMARY.json"]
    for name in json_names:
        assert json.loads((ours / name).read_text()) == json.loads((theirs / name).read_text()), name
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    for name in sorted(files(ours) - set(json_names)):
        assert name.endswith(".safetensors")
        assert payload_fingerprint(ours / name) == payload_fingerprint(theirs / name), name
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name


@pytest.mark.parametrize("prune", [False, True], ids=["all-layers", "pruned"])
@pytest.mark.parametrize("use_repr", [False, True], ids=["safetensors", "repr"])
@pytest.mark.parametrize("name", sorted(HF_BUILDERS))
def test_same_files_json_and_tensors_as_transformers(name: str, use_repr: bool, prune: bool, tmp_path: Path) -> None:
    ours, theirs, ours_out, theirs_out = _run_both(HF_BUILDERS[name], tmp_path, do_prune_layers=prune,
                                                   use_repr=use_repr)
    _assert_same_trace(ours, theirs)
    tree = trace_json(ours)
    layer_blocks = {n["module_path"] for n in nodes(tree) if n["module_path"].split(".")[-1].isdigit()}
    assert len(layer_blocks) == (2 if prune else 3)  # the option did something, identically on both sides
    has_payloads = any(n.endswith(".safetensors") for n in files(ours))
    assert has_payloads is not use_repr
    first = next(iter(ours_out.values()))
    assert torch.equal(first, next(iter(theirs_out.values())))


def test_plain_module_repeated_calls_and_positional_inputs(tmp_path: Path) -> None:
    """A shared layer called three times: both overwrite the same payloads and list three children."""
    ours, theirs, _, _ = _run_both(lambda: (seeded(SharedLoop), toy_input()), tmp_path, use_repr=False)
    _assert_same_trace(ours, theirs)
    tree = trace_json(ours)
    assert [c["module_path"] for c in tree["children"]] == ["SharedLoop.shared"] * 3 + ["SharedLoop.head"]


def test_default_options_match(tmp_path: Path) -> None:
    """Defaults (prune, repr) are transformers' defaults."""
    ours, theirs, _, _ = _run_both(lambda: (seeded(Chain), toy_input()), tmp_path)
    _assert_same_trace(ours, theirs)
    assert not any(name.endswith(".safetensors") for name in files(ours))


def test_print_options_are_restored(tmp_path: Path) -> None:
    model = seeded(Chain)
    before = str(torch.tensor([123456.0, 0.001]))
    with tracediff.model_addition_debugger_context(model, debug_path=str(tmp_path)):
        model(toy_input())
    assert str(torch.tensor([123456.0, 0.001])) == before


def test_model_is_restored(tmp_path: Path) -> None:
    model = seeded(SharedLoop)
    before = {name: sorted(m.__dict__) for name, m in model.named_modules()}
    with tracediff.model_addition_debugger_context(model, debug_path=str(tmp_path), use_repr=False):
        assert all("forward" in m.__dict__ for m in model.modules())
        model(toy_input())
    assert {name: sorted(m.__dict__) for name, m in model.named_modules()} == before


def test_submodules_run_without_grad_and_the_root_keeps_it(tmp_path: Path) -> None:
    """As transformers does: children under no_grad, so the output has no graph through them."""
    model = seeded(Chain)
    with tracediff.model_addition_debugger_context(model, debug_path=str(tmp_path), use_repr=False):
        out = model(toy_input())
    assert not out.requires_grad


def test_forward_error_still_writes_tree(tmp_path: Path) -> None:
    from tests.models import FailsInside

    model = seeded(FailsInside)
    with pytest.raises(ValueError, match="boom at call 1"):
        with tracediff.model_addition_debugger_context(model, debug_path=str(tmp_path), use_repr=False):
            model(toy_input())
    tree = trace_json(tmp_path)
    assert tree["error"]["type"] == "ValueError"
    failing = [n for n in nodes(tree) if "error" in n]
    assert [n["module_path"] for n in failing] == ["FailsInside", "FailsInside.blocks.1.boom"]


def test_no_debug_path_writes_into_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, debugger in [("ours", tracediff.model_addition_debugger_context),
                           ("theirs", transformers.model_addition_debugger_context)]:
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        model = seeded(Chain)
        with debugger(model, use_repr=False):
            model(toy_input())
    _assert_same_trace(tmp_path / "ours", tmp_path / "theirs")
    assert "Chain.a_outputs.safetensors" in files(tmp_path / "ours")
