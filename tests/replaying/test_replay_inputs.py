"""Rebuilding a call's inputs from A's trace, and what cannot be rebuilt (skipped, with the reason)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import tracediff
from tests.replaying import ports
from tracediff.errors import TraceFormatError


def test_kwargs_tuples_none_and_typed_scalars_are_rebuilt(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("kwargs", ports.kwargs_net, ports.toy_input())
    result = tracediff.replay(ports.kwargs_net(), ref)
    assert result.passed and result.skipped == ()
    scaler = next(c for c in result.modules if c.module_path_b == "KwargsNet.scaler")
    assert scaler.verdict == "same math" and scaler.local_max_abs_err == 0.0
    assert [t.shape_b for t in scaler.tensors] == [(2, 2, 4)]  # sizes=(2, 2, 4) came back as a tuple


def test_a_repr_only_input_is_the_object_b_passes(tmp_path: Path) -> None:
    model = ports.kwargs_net(extra=ports.Opaque())
    with torch.no_grad(), tracediff.capture(model, tmp_path / "ref"):
        model(ports.toy_input())
    # A's trace keeps only "Opaque()": the scaler runs alone with the object B's own forward passed it
    result = tracediff.replay(ports.kwargs_net(extra=ports.Opaque()), tmp_path / "ref", modules="scaler.**")
    assert result.skipped == () and result.passed
    assert [c.module_path_b for c in result.modules] == ["KwargsNet.scaler", "KwargsNet.scaler.proj"]
    assert result.modules[0].verdict == "same math" and result.modules[0].reason == ""
    # where B passes a tensor instead, it is not the same argument: skipped with the reason
    result = tracediff.replay(ports.kwargs_net(extra=torch.zeros(1)), tmp_path / "ref", modules="scaler.**")
    (skipped,) = result.skipped
    assert (skipped.module_path_b, skipped.call_index) == ("KwargsNet.scaler", 0)
    assert skipped.reason == "inputs.kwargs.extra is known only by its repr (Opaque()), and B passes a Tensor there"
    assert [c.module_path_b for c in result.modules] == ["KwargsNet.scaler.proj"]


def test_position_embeddings_tuple_reaches_attention(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("llama-fp32-eager", ports.llama, input_ids=ports.IDS)
    result = tracediff.replay(ports.llama(), ref, modules="**.self_attn", oracle=False)
    assert [c.module_path_b.rsplit(".", 2)[-2] for c in result.modules] == ["0", "1", "2"]
    assert all(c.local_max_abs_err == 0.0 for c in result.modules)


def test_sdpa_reference_against_eager_port_is_not_comparable_with_the_remedy(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("llama-fp32-sdpa", lambda: ports.llama(attn="sdpa"), input_ids=ports.IDS)
    result = tracediff.replay(ports.llama(attn="eager"), ref)
    assert result.passed  # the clean port is not blamed
    attention = [c for c in result.modules if c.module_path_b.endswith("self_attn")]
    assert len(attention) == 3
    for call in attention:
        assert call.verdict == "not comparable"
        assert "attention_mask=None" in call.reason and 'attn_implementation="eager"' in call.reason
    root = result.modules[0]
    assert root.verdict == "same math"  # the root builds its own mask from A's input_ids


def test_the_standard_trace_replays_leaves_and_skips_parents_without_outputs(tmp_path: Path) -> None:
    from transformers import model_addition_debugger_context

    model = ports.net()
    with torch.no_grad(), model_addition_debugger_context(model, debug_path=str(tmp_path), use_repr=False):
        model(ports.toy_input())
    result = tracediff.replay(ports.net(), tmp_path)
    assert result.passed
    assert {c.module_path_b for c in result.modules} == {"Net.embed", "Net.head", "Net.blocks.0.norm",
                                                         "Net.blocks.0.fc", "Net.blocks.2.norm", "Net.blocks.2.fc"}
    skipped = {s.module_path_b: s.reason for s in result.skipped}
    assert all("holds no outputs" in skipped[p] for p in ("Net", "Net.blocks.0", "Net.blocks.2"))
    # transformers' debugger prunes the middle layer block by default
    assert all("did not record" in skipped[p] for p in ("Net.blocks.1", "Net.blocks.1.norm", "Net.blocks.1.fc"))


def test_a_summary_only_trace_is_refused(capture_ref, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ref = capture_ref("net", ports.net, ports.toy_input())
    (summary,) = Path(ref).glob("*_SUMMARY.json")
    with pytest.raises(TraceFormatError, match="statistics only"):
        tracediff.replay(ports.net(), summary)


def test_a_missing_payload_skips_that_call(capture_ref, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ref = tmp_path / "ref"
    shutil.copytree(capture_ref("net", ports.net, ports.toy_input()), ref)
    tree = json.loads(next(ref.glob("*_FULL_TENSORS.json")).read_text())
    head = next(child for child in tree["children"] if child["module_path"] == "Net.head")
    (ref / head["inputs"]["args"][0]["value"][2:]).unlink()
    result = tracediff.replay(ports.net(), ref)
    skipped = {(s.module_path_b, s.call_index): s.reason for s in result.skipped}
    assert "inputs.args.0" in skipped[("Net.head", 0)]
    assert result.passed


def test_rename_rules_match_a_port_with_other_module_names(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("net", ports.net, ports.toy_input())
    port = ports.net()
    port.add_module("layers", port.blocks)
    del port.blocks
    port.forward = lambda x: port.head(port.layers[2](port.layers[1](port.layers[0](port.embed(x)))))  # type: ignore[method-assign]
    result = tracediff.replay(port, ref, map=[(r"^blocks\.", "layers.")])
    assert result.passed and not result.skipped
    assert "Net.layers.1.fc" in {c.module_path_b for c in result.modules}


def test_the_model_keeps_its_training_mode(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("net", ports.net, ports.toy_input())
    model = ports.net().train()
    tracediff.replay(model, ref, oracle=False)
    assert all(m.training for m in model.modules())


def test_later_top_level_calls_are_reported(tmp_path: Path) -> None:
    model = ports.net()
    with torch.no_grad(), tracediff.capture(model, tmp_path / "ref"):
        model(ports.toy_input())
        model(ports.toy_input())
    result = tracediff.replay(ports.net(), tmp_path / "ref")
    assert result.passed and len(result.modules) == 12
    assert result.warnings == ("A's trace holds 1 later top-level call(s) of the model; only the first is replayed",)
