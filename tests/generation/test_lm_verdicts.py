"""Logits verdicts (KL, top-k agreement, argmax flips, PCC) and positions beyond tolerance."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import tracediff
from tracediff.compare.logits import logits_metrics, pearson
from tracediff.compare.positions import positions_beyond_tolerance, sequence_dim

from . import ports

Traces = Callable[[str], Path]


def test_kl_topk_and_flips_follow_their_definitions() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 20))
    b = a.copy()
    b[1, [int(np.argsort(-a[1])[1])]] += 10.0  # position 1: the reference's runner-up wins by far
    found = logits_metrics(a, b)
    pa = np.exp(a) / np.exp(a).sum(-1, keepdims=True)
    pb = np.exp(b) / np.exp(b).sum(-1, keepdims=True)
    expected = (pa * np.log(pa / pb)).sum(-1)
    assert np.allclose(found.kl, expected, atol=1e-12) and found.kl[0] == 0.0 and found.kl[1] > 0
    assert len(found.flips) == 1
    flip = found.flips[0]
    top = np.sort(a[1])[::-1]
    assert (flip.position, flip.token_a, flip.token_b) == (1, int(np.argmax(a[1])), int(np.argmax(b[1])))
    assert flip.margin == pytest.approx(top[0] - top[1])
    assert found.topk_agreement[1] == pytest.approx(2 / 3)
    assert found.topk_agreement[5] == pytest.approx(1.0)  # the same five tokens, in another order


def test_pearson_matches_numpy_and_is_nan_for_a_constant_side() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=50), rng.normal(size=50)
    assert pearson(a, b) == pytest.approx(np.corrcoef(a, b)[0, 1])
    assert pearson(a, 3 * a + 1) == pytest.approx(1.0)
    assert math.isnan(pearson(np.ones(5), a[:5]))


def test_positions_name_the_first_position_beyond_tolerance_and_count_them() -> None:
    a = np.zeros((1, 10, 4))
    b = a.copy()
    b[0, 7:, 2] = 1e-3
    b[0, 3, 0] = 1e-7  # within atol
    found = positions_beyond_tolerance(a, b, atol=1e-5, rtol=0.0, dim=sequence_dim(a.shape, 10))
    assert (found.dim, found.first, found.count, found.length) == (1, 7, 3, 10)
    assert sequence_dim((1, 4, 10, 8), 10) == 2 and sequence_dim((2, 10), 10) == 1
    assert sequence_dim((1, 5, 3), 10) is None


def test_a_window_bug_in_a_long_prompt_is_named_at_the_first_position_past_the_window(tmp_path: Path) -> None:
    ids = torch.randint(0, ports.VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    for name, model in (("ref", ports.mistral()), ("port", ports.sliding_window_late())):
        with torch.no_grad(), tracediff.capture(model, tmp_path / name):
            model(ids)
    result = tracediff.align(tmp_path / "ref", tmp_path / "port")
    assert result.steps is None
    diverged = [row for row in result.diverged if row.shape_b == (1, 12, 32)]
    assert diverged and diverged[0].module_path_b == "MistralForCausalLM.model.layers.0.self_attn.o_proj"
    # window 8 against 9: the query at position 8 is the first that sees one key more; 8..11 all do
    assert (diverged[0].position, diverged[0].positions_beyond) == (ports.WINDOW, 12 - ports.WINDOW)
    assert all(row.positions_beyond == 0 for row in result.rows if row.status == "close")


def test_logits_rows_carry_kl_topk_and_flips_and_a_baseline_says_which_flips_are_benign(tmp_path: Path) -> None:
    def run(name: str, noise: float, seed: int) -> Path:
        model = ports.gpt2()
        with torch.no_grad():
            generator = torch.Generator().manual_seed(seed)
            model.lm_head.weight.add_(noise * torch.randn(model.lm_head.weight.shape, generator=generator))
            with tracediff.capture(model, tmp_path / name):
                model(ports.prompt())
        return tmp_path / name

    ref, port = run("ref", 0.0, 0), run("port", 0.02, 1)
    result = tracediff.align(ref, port, logits=["lm_head"])
    logits_rows = [row for row in result.rows if row.kl_max is not None]
    assert {row.module_path_b for row in logits_rows} == {"GPT2LMHeadModel", "GPT2LMHeadModel.lm_head"}
    root = next(row for row in logits_rows if row.module_path_b == "GPT2LMHeadModel")
    verdict = next(v for v in result.logits if v.order == root.order)
    assert len(verdict.kl) == ports.PROMPT and root.kl_max == max(verdict.kl) > 0
    assert root.argmax_flips == len(verdict.flips) > 0
    assert root.top1_agreement == 1.0 - root.argmax_flips / ports.PROMPT
    assert root.flip_margin == verdict.flips[0].margin > 0
    a, b = (tracediff.load_trace(folder) for folder in (ref, port))
    logits_a, logits_b = (trace.load(next(r for r in trace.roots[0].tensors if r.slot == "outputs.logits"))
                          for trace in (a, b))
    assert root.pcc == pytest.approx(np.corrcoef(logits_a.ravel().double(), logits_b.ravel().double())[0, 1])
    assert all(flip.benign is None for flip in verdict.flips)  # no baseline: not judged
    noisy = tracediff.align(ref, port, baseline=run("baseline", 0.02, 2))
    judged = [(flip, noisy.rows[v.order].noise_floor) for v in noisy.logits for flip in v.flips]
    assert judged and all(flip.benign is (flip.margin <= 2 * floor) for flip, floor in judged)
