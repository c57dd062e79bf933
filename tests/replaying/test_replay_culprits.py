"""Which of B's modules is wrong: culprits, parents explained by them, and the float64 oracle."""

from __future__ import annotations

import pytest
import torch

import tracediff
from tests.replaying import ports

LLAMA = "LlamaForCausalLM"


@pytest.fixture(scope="module")
def llama_ref(capture_ref):  # type: ignore[no-untyped-def]
    return capture_ref("llama-fp32-eager", ports.llama, input_ids=ports.IDS)


def _culprits(result: tracediff.Replay) -> list[str]:
    return [call.module_path_b.removeprefix(f"{LLAMA}.") for call in result.culprits]


def test_exact_fp32_port_has_no_culprit_and_zero_local_error(llama_ref):  # type: ignore[no-untyped-def]
    result = tracediff.replay(ports.llama(), llama_ref)
    assert result.passed and bool(result) and result.culprits == ()
    assert result.skipped == ()
    assert len(result.modules) == 45  # every call of the 3-layer model, the root included
    assert all(call.verdict == "same math" and call.local_max_abs_err == 0.0 for call in result.modules)
    assert result.end_to_end is not None and result.end_to_end["max_abs_err"] == 0.0


def test_two_bugs_are_both_culprits_and_their_parents_are_explained(llama_ref):  # type: ignore[no-untyped-def]
    result = tracediff.replay(ports.two_bugs_llama(), llama_ref, patch=True)
    assert not result.passed
    assert _culprits(result) == ["model.layers.0.input_layernorm", "model.layers.2.mlp.down_proj"]
    by_path = {call.module_path_b.removeprefix(f"{LLAMA}."): call for call in result.modules}
    for parent in ("model.layers.0", "model.layers.2", "model.layers.2.mlp", "model"):
        call = by_path[parent]
        assert call.verdict == "B differs" and not call.culprit and call.explained_by, parent
    assert set(by_path[LLAMA].explained_by) == {c.module_path_b for c in result.culprits}
    assert by_path["model.layers.1"].verdict == "same math"
    effects = {c.module_path_b: c.patch_effect for c in result.culprits}
    assert all(e is not None and 0.0 <= e <= 100.0 for e in effects.values())
    assert sorted(c.rank for c in result.culprits) == [1, 2]


def test_bf16_port_with_another_attention_kernel_has_no_culprit(llama_ref):  # type: ignore[no-untyped-def]
    result = tracediff.replay(ports.llama(attn="sdpa", dtype=torch.bfloat16), llama_ref)
    assert result.passed, [c.describe() for c in result.culprits]
    # its end-to-end error is well above float32's tolerance: only the oracle tells rounding from a bug
    assert result.end_to_end is not None and result.end_to_end["rel_rms_err"] > 1e-3
    root = result.modules[0]
    assert root.module_path_b == LLAMA and root.verdict == "same math"


def test_bf16_port_with_scaled_down_proj_names_exactly_that_module(llama_ref):  # type: ignore[no-untyped-def]
    model = ports.llama(attn="sdpa", dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(1.1)
    result = tracediff.replay(model, llama_ref)
    assert _culprits(result) == ["model.layers.1.mlp.down_proj"]


def test_bf16_port_with_wrong_attention_scale_names_self_attn(llama_ref):  # type: ignore[no-untyped-def]
    model = ports.llama(dtype=torch.bfloat16)
    model.model.layers[1].self_attn.scaling *= 1.25
    result = tracediff.replay(model, llama_ref)
    assert _culprits(result) == ["model.layers.1.self_attn"]


def test_without_the_oracle_the_tolerance_decides(llama_ref):  # type: ignore[no-untyped-def]
    clean = tracediff.replay(ports.llama(), llama_ref, oracle=False)
    assert clean.passed and {c.verdict for c in clean.modules} == {"within tolerance"}
    assert all(t.factor is None for c in clean.modules for t in c.tensors)
    buggy = tracediff.replay(ports.two_bugs_llama(), llama_ref, oracle=False, modules="model.layers.2.**")
    assert _culprits(buggy) == ["model.layers.2.mlp.down_proj"]
    assert all("layers.2" in c.module_path_b for c in buggy.modules)


def test_a_bug_between_submodule_calls_names_the_parent(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("net", ports.net, ports.toy_input())
    result = tracediff.replay(ports.net(ports.LeakyResidualBlock), ref, patch=True)
    assert [c.module_path_b for c in result.culprits] == ["Net.blocks.1"]
    assert result.culprits[0].patch_effect == pytest.approx(100.0)  # the only bug: all the final error
    children = [c for c in result.modules if c.module_path_b.startswith("Net.blocks.1.")]
    assert children and all(c.verdict == "same math" for c in children)
    assert [c.module_path_b for c in result.modules if c.explained_by] == ["Net"]
    assert repr(result) == "<Replay 1 culprit(s): 12 calls replayed, 0 skipped, oracle on>"
    assert "DIVERGED" in result._repr_html_() and "Net.blocks.1 call 0: B differs" in result._repr_html_()
    table = result.table
    assert len(table) == 12 and table.loc[table.culprit, "module_path_b"].tolist() == ["Net.blocks.1"]


def test_gpt2_port_with_a_scaled_conv1d_names_it(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("gpt2", ports.gpt2, input_ids=ports.IDS)
    assert tracediff.replay(ports.gpt2(), ref).passed
    model = ports.gpt2()
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.mul_(1.1)
    result = tracediff.replay(model, ref)
    assert [c.module_path_b for c in result.culprits] == ["GPT2LMHeadModel.transformer.h.1.mlp.c_fc"]


def test_bert_exact_port_with_padding_mask_has_no_culprit(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("bert", ports.bert, input_ids=ports.IDS, attention_mask=ports.BERT_MASK)
    result = tracediff.replay(ports.bert(), ref)
    assert result.passed and not result.skipped
    assert all(call.local_max_abs_err == 0.0 for call in result.modules)


def test_a_replay_that_compares_nothing_never_passes(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("net", ports.net, ports.toy_input())
    result = tracediff.replay(ports.elsewhere(), ref)
    assert result.compared == 0 and not result.passed and not result.culprits
    assert result.nothing_compared is not None and result.nothing_compared.startswith("nothing comparable")


def test_a_replay_that_compares_nothing_is_rendered_as_such(capture_ref):  # type: ignore[no-untyped-def]
    from tracediff.render.replay import headline, render_html

    result = tracediff.replay(ports.elsewhere(), capture_ref("net", ports.net, ports.toy_input()))
    lines = headline(result)
    assert f"NOTHING COMPARED: {result.nothing_compared}" in lines and not any("PASSED" in x for x in lines)
    page = render_html(result)
    assert "NOTHING COMPARED: nothing comparable" in page and "PASSED" not in page and "UNDECIDED" not in page
    assert "NOTHING COMPARED" in result._repr_html_() and "DIVERGED" not in result._repr_html_()


def test_match_has_aligns_meaning_in_replay(capture_ref):  # type: ignore[no-untyped-def]
    ref = capture_ref("net", ports.net, ports.toy_input())
    found = tracediff.replay(ports.renamed_leaky_net(), ref)  # match="auto": pairs layers.N with blocks.N
    assert [c.module_path_b for c in found.culprits] == ["RenamedNet.layers.1"]
    strict = tracediff.replay(ports.renamed_leaky_net(), ref, match="name")  # no map: no child pairs by name
    assert not any(".layers." in call.module_path_b for call in strict.modules)
    with pytest.raises(tracediff.UsageError, match="match: 'names' is not one of auto, name, structure"):
        tracediff.replay(ports.renamed_leaky_net(), ref, match="names")
