"""Attention masks compared as masks (issue 35, contract 2): the same masked positions in another
convention are benign and said so; other positions are a mask difference, never a 1e38-sized error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tracediff.compare.masks import as_masks
from tracediff.trace.payload import payload_of

T = 6
KEEP = torch.ones(T, T, dtype=torch.bool).tril()  # causal: True where a position may attend


def additive(keep: torch.Tensor, dtype: torch.dtype, value: float | None = None) -> torch.Tensor:
    fill = torch.finfo(dtype).min if value is None else value
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, fill)


CONVENTIONS = {
    "boolean keep": KEEP[None, None],
    "boolean drop": ~KEEP[None, None],
    "additive float32 min": additive(KEEP, torch.float32)[None, None],
    "additive bfloat16 min": additive(KEEP, torch.bfloat16)[None, None],
    "additive float16 -inf": additive(KEEP, torch.float16, -math.inf)[None, None],
    "additive -1e4, 2-D": additive(KEEP, torch.float32, -1e4),
    "0/1 float keep": KEEP.float()[None, None],
    "boolean keep expanded to 4-D": KEEP.expand(2, 4, T, T),
}


@pytest.mark.parametrize("name", [n for n in CONVENTIONS if n != "additive float32 min"])
def test_the_same_mask_in_another_convention_is_benign(name: str) -> None:
    pair = as_masks(payload_of(CONVENTIONS[name]), payload_of(CONVENTIONS["additive float32 min"]))
    assert pair is not None and pair.same, name
    assert pair.note.startswith("the same mask in other conventions")
    masked = T * (T - 1) // 2 * (8 if name.endswith("4-D") else 1)  # counted on the broadcast shape
    assert f"{masked} masked positions on both sides" in pair.note


def test_a_mask_masking_other_positions_is_a_mask_difference() -> None:
    padded = KEEP.clone()
    padded[:, 0] = False  # the first position masked too
    pair = as_masks(payload_of(padded[None, None]), payload_of(CONVENTIONS["additive float32 min"]))
    assert pair is not None and not pair.same
    assert pair.note == ("mask difference (A boolean keep [1, 1, 6, 6], B additive [1, 1, 6, 6]): 6 position(s) "
                         "masked in A only, 0 in B only")


def test_numbers_are_not_masks() -> None:
    values = torch.randn(1, 1, T, T, generator=torch.Generator().manual_seed(0))
    assert as_masks(payload_of(values), payload_of(values.double())) is None
    assert as_masks(payload_of(KEEP), payload_of(KEEP)) is None  # two booleans: compared as they are
    assert as_masks(payload_of(torch.zeros(3)), payload_of(torch.zeros(3, dtype=torch.float64))) is None


class MaskedBlock(nn.Module):
    """One attention, its mask passed in by the caller (``attention_mask=``) in the caller's convention."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)


class Caller(nn.Module):
    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.block = MaskedBlock()
        self.mask = mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, attention_mask=self.mask)


def captured(folder: Path, mask: torch.Tensor) -> Path:
    torch.manual_seed(0)
    model = Caller(mask).eval()
    x = torch.randn(1, 1, T, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), tracediff.capture(model, folder):
        model(x)
    return folder


def test_align_says_a_mask_in_another_convention_is_the_same_mask(tmp_path: Path) -> None:
    a = captured(tmp_path / "a", CONVENTIONS["boolean keep"])
    b = captured(tmp_path / "b", CONVENTIONS["additive float32 min"])
    result = tracediff.align(a, b)
    assert result.passed
    row = next(r for r in result.rows if r.tensor == "inputs.kwargs.attention_mask")
    assert row.status == "identical" and row.max_abs_err == 0
    assert row.reason.startswith("the same mask in other conventions (A boolean keep [1, 1, 6, 6], B additive")


def test_align_names_a_mask_difference_without_huge_errors(tmp_path: Path) -> None:
    padded = KEEP.clone()
    padded[:, 0] = False
    a = captured(tmp_path / "a", padded[None, None])
    b = captured(tmp_path / "b", CONVENTIONS["additive float32 min"])
    result = tracediff.align(a, b)
    first = result.first_divergence
    assert first is not None and first.tensor == "inputs.kwargs.attention_mask"
    assert "mask difference" in first.reason and "6 position(s) masked in A only" in first.reason
    assert max(r.max_abs_err for r in result.rows if r.max_abs_err == r.max_abs_err) < 1e3


def test_a_masked_score_against_an_older_ports_minus_1e4_is_masked_on_both_sides() -> None:
    from tracediff.compare.benign import prepare_pair

    f32_min = torch.finfo(torch.float32).min
    a, b, notes, _ = prepare_pair(torch.tensor([f32_min, 0.5, -3.0]), torch.tensor([-1e4, 0.5, -3.0]))
    assert notes == ["1 masked values (at one side's finite extreme, at most -5e3 on the other) treated as equal"]
    assert b.values.tolist()[1:] == [0.5, -3.0]


def test_recorded_extremes_skip_the_scan_only_when_nothing_can_be_masked() -> None:
    """A's recorded (min, max) lets the comparison skip the saturation scan, except where A masks as older ports
    do (-1e4; B may hold its dtype's extreme there): A's statistics say nothing of B."""
    from tracediff.compare.benign import prepare_pair

    f32_min = torch.finfo(torch.float32).min
    a, b = torch.tensor([-1e4, 0.5, -3.0]), torch.tensor([f32_min, 0.5, -3.0])
    _, settled, notes, _ = prepare_pair(a, b, recorded_a=(-1e4, 0.5))
    assert notes == ["1 masked values (at one side's finite extreme, at most -5e3 on the other) treated as equal"]
    assert settled.values.tolist() == [-1e4, 0.5, -3.0]
    _, untouched, notes, _ = prepare_pair(a + 1e4 - 3.0, b, recorded_a=(-3.0, 0.5))  # nothing masked in A
    assert notes == [] and untouched.values.tolist()[0] == f32_min


class Scores(nn.Module):
    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        return scores.clone()


def test_a_score_masked_in_a_bf16_port_only_is_a_mask_difference_next_to_a_float32_reference(tmp_path: Path
                                                                                           ) -> None:
    """Both sides mask at their own dtype's extreme; bfloat16's (-3.39e38) is above float32's (-3.40e38), and the
    positions masked on both sides are settled first: the position masked in B only must still be found."""
    values = torch.randn(1, 1, T, T, generator=torch.Generator().manual_seed(1))
    leaky = KEEP.clone()
    leaky[3, 0] = False  # B masks one more position
    sides = {"a": values.masked_fill(~KEEP, torch.finfo(torch.float32).min),
             "b": values.bfloat16().masked_fill(~leaky, torch.finfo(torch.bfloat16).min)}
    for name, scores in sides.items():
        model = Scores()
        with tracediff.capture(model, tmp_path / name):
            model(scores)
    result = tracediff.align(tmp_path / "a", tmp_path / "b")
    out = next(row for row in result.rows if row.tensor == "outputs")
    assert out.within_tolerance is False and "0 position(s) masked in A only, 1 in B only" in out.reason
    assert max(r.max_abs_err for r in result.rows) < 1e3  # no 3.4e38 anywhere
