"""Attribution of traces captured as users capture them: ``model(input_ids=ids)``, transformers' cache on.

Each decoder layer then receives a ``DynamicCache`` that the trace knows only by its repr; the layer run alone
on A's inputs gets the cache B's own forward built (empty in a prefill, as A's was), so every layer is ranked.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from tracediff.attribution import attribute, sensitivity_scan

from . import stock
from .conftest import captured, quantized
from .test_ranking import spearman


@pytest.mark.parametrize("family", list(stock.FAMILIES))
def test_every_layer_of_a_default_capture_is_ranked(family: str, tmp_path: Path) -> None:
    model = stock.FAMILIES[family]()
    trace = captured(tmp_path, model, {"input_ids": stock.token_ids()})
    result = attribute(copy.deepcopy(model).to(torch.bfloat16), trace)

    layers = len(model.model.layers)
    assert [c.module_path.split(".", 1)[1] for c in sorted(result.ranking, key=lambda c: c.module_path)] == \
        [f"model.layers.{i}" for i in range(layers)]
    assert result.skipped == () and result.warnings == ()
    assert result.forward_passes == layers + 2


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_an_unchanged_copy_has_no_local_error(family: str, tmp_path: Path) -> None:
    # the same float32 module on the same inputs, with the cache B's forward built: A's output bit for bit; a
    # cache holding other keys (B's, left behind by its whole forward) would change every layer's attention
    model = stock.FAMILIES[family]()
    result = attribute(copy.deepcopy(model), captured(tmp_path, model, {"input_ids": stock.token_ids()}))
    assert len(result.ranking) == len(model.model.layers)
    assert all(c.local_max_abs_err == 0 and c.share == 0 for c in result.ranking)


def test_default_capture_ranking_agrees_with_the_one_at_a_time_scan(tmp_path: Path, torchao_or_skip) -> None:
    model, kwargs = stock.llama(layers=6), {"input_ids": stock.token_ids()}
    quantize = torchao_or_skip("int8dyn")
    result = attribute(quantized(model, quantize, "model.layers"), captured(tmp_path, model, kwargs))

    paths = [call.module_path.split(".", 1)[1] for call in result.ranking]
    assert len(paths) == 6 and result.skipped == ()
    truth = sensitivity_scan(model, quantize, paths, kwargs).errors
    # the same bound as test_ranking's use_cache=False case: the engine is the same, only the inputs' cache differs
    assert spearman([truth[p] for p in paths], [call.share for call in result.ranking]) >= 0.9
    assert paths[0] == max(truth, key=truth.__getitem__)


def test_a_star_glob_ranks_one_path_segment(tmp_path: Path) -> None:
    # transformers' convention: 'model.layers.*' is the layers themselves, not every call under them
    model = stock.llama()
    trace = captured(tmp_path, model, {"input_ids": stock.token_ids()})
    b = copy.deepcopy(model).to(torch.bfloat16)
    ranked = attribute(b, trace, modules="model.layers.*").ranking
    assert sorted(c.module_path.split(".", 1)[1] for c in ranked) == ["model.layers.0", "model.layers.1",
                                                                      "model.layers.2"]
    mlps = attribute(b, trace, modules=["model.layers.*.mlp", "**.o_proj"]).ranking
    assert sorted(c.module_path.split(".", 1)[1] for c in mlps) == sorted(
        f"model.layers.{i}.{leaf}" for i in range(3) for leaf in ("mlp", "self_attn.o_proj"))


def test_a_cache_passed_in_for_a_prefill_is_left_to_b_and_one_of_earlier_steps_is_refused(tmp_path: Path) -> None:
    from transformers import DynamicCache

    from tracediff.errors import UsageError

    model, ids = stock.llama(), stock.token_ids()
    b = copy.deepcopy(model).to(torch.bfloat16)
    # an empty cache passed in (as generate's first step does): its positions start at 0, B's forward is given
    # none and builds its own, as A's forward filled the empty one
    prefill = captured(tmp_path / "prefill", model, {"input_ids": ids, "cache": DynamicCache(config=model.config)})
    result = attribute(b, prefill)
    assert len(result.ranking) == 3 and result.skipped == ()
    # a decode step: the cache held 16 positions the trace does not have
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, cache=cache)
    decode = captured(tmp_path / "decode", model, {"input_ids": ids[:, :1], "cache": cache})
    with pytest.raises(UsageError, match=r"A's top-level inputs cannot be rebuilt \(inputs\.kwargs\.cache is known "
                                         r"only by its repr \(DynamicCache\("):
        attribute(b, decode)


def test_the_command_line_ranks_a_default_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracediff.cli.main import main

    from . import spec

    trace = captured(tmp_path, *spec.stock_llama())
    assert main(["attribute", str(trace), "tests.attribution.spec:stock_llama_bf16"]) == 0
    out = capsys.readouterr().out
    assert "ranked 3 calls (layers), skipped 0" in out
    assert main(["attribute", str(trace), "tests.attribution.spec:stock_llama_bf16", "--modules", "model.layers.*",
                 "--format", "json", "-o", str(tmp_path / "rank.json")]) == 0
    assert len(json.loads((tmp_path / "rank.json").read_text(encoding="utf-8"))["ranking"]) == 3
