"""The small pieces of matching: suggested rules, folded path lists, slot rules, layout transforms."""

from __future__ import annotations

import re

import pytest
import torch

from tracediff import UsageError
from tracediff.alignment.pairing.layout import Transform, _candidates
from tracediff.alignment.pairing.unrecorded import collapse_paths, mark_unrecorded_origin
from tracediff.alignment.result import TensorComparison
from tracediff.maps.rules import apply_rename, slot_rules
from tracediff.maps.suggest import _rule


@pytest.mark.parametrize("a, b, rule", [
    ("blocks.0", "layers.0", (r"^blocks(?=\.|$)", "layers")),
    ("layers.0.attn", "layers.0.self_attn", (r"^(layers\.\d+\.)attn(?=\.|$)", r"\1self_attn")),
    ("model.layers.0", "layers.0", (r"^model(?:\.|$)", "")),  # a wrapper level removed
    ("layers.0.block.attn", "layers.0.attn", (r"^(layers\.\d+)\.block(?=\.|$)", r"\1")),
    ("layers.0.attn", "layers.0.inner.attn", (r"^(layers\.\d+\.)attn(?=\.|$)", r"\1inner.attn")),  # one added
    ("layers.3", "layers.1", (r"^(layers\.)3(?=\.|$)", r"\g<1>1")),  # \g<1>: "\11" would be group 11
])
def test_rule_renames_only_what_differs(a: str, b: str, rule: tuple[str, str]) -> None:
    assert _rule(a, b) == rule
    assert apply_rename(a, [rule]) == b
    if "\\d+" in rule[0]:  # every layer, not only the one it was derived from
        assert apply_rename(a.replace(".0", ".7"), [rule]) == b.replace(".0", ".7")


def test_rules_stop_at_component_boundaries() -> None:
    rule = _rule("layers.0.attn", "layers.0.self_attn")
    assert apply_rename("layers.0.attn_norm", [rule]) == "layers.0.attn_norm"
    assert re.compile(rule[0])


def test_collapse_paths() -> None:
    paths = [f"M.layers.{i}.self_attn.rotary_emb" for i in range(4)] + ["M.norm", "M.h.0", "M.h.2", "M.h.5"]
    assert collapse_paths(paths) == ["M.layers.{0..3}.self_attn.rotary_emb", "M.norm", "M.h.{0,2,5}"]
    assert collapse_paths(["M.layers.3"]) == ["M.layers.3"]


def test_slot_rules() -> None:
    spec = {"rename": [], "slots": [["rotary", "inputs.args.0", None], ["attn$", "inputs.args.1", "inputs.kwargs.p"]]}
    assert slot_rules(spec) == [("rotary", "inputs.args.0", ""), ("attn$", "inputs.args.1", "inputs.kwargs.p")]
    assert slot_rules({"rename": []}) == [] and slot_rules(None) == [] and slot_rules([["a", "b"]]) == []
    for bad, message in [({"slots": "x"}, 'map: "slots" must be a list of [module_regex, slot_a, slot_b]'),
                         ({"slots": [["a", "b"]]}, "map: slot rule 0 is ['a', 'b']; expected [module_regex, "
                                                   "slot_a, slot_b]"),
                         ({"slots": [["(", "a", "b"]]}, "map: slot rule 0 regex '(' does not compile (missing ), "
                                                        "unterminated subpattern at position 0)")]:
        with pytest.raises(UsageError) as e:
            slot_rules(bad)
        assert str(e.value) == message


def test_transforms_apply_and_describe() -> None:
    x = torch.arange(24.0).reshape(1, 2, 3, 4)
    narrow = Transform("a", (("narrow", 3, 1, 2),))
    assert torch.equal(narrow.apply(x), x[..., 1:3]) and narrow.describe(4) == "A[..., 1:3] ~ B"
    middle = Transform("b", (("narrow", 1, 0, 1),))
    assert middle.describe(4) == "A ~ B[:, 0:1]"
    permute = Transform("a", (("permute", (0, 2, 1, 3)),))
    assert permute.apply(x).shape == (1, 3, 2, 4) and permute.describe(4) == "A.permute(0,2,1,3) ~ B"
    described = {t.describe(3) for t in _candidates((1, 3, 8), (1, 4, 3, 2))}
    assert "A.reshape(1,3,4,2).permute(0,2,1,3) ~ B" in described


def _row(order: int, path: str, tensor: str, diverged: bool) -> TensorComparison:
    nan = float("nan")
    return TensorComparison(order=order, module_path_a=path, module_path_b=path, call_index=0, call_index_b=0,
                            tensor=tensor, tensor_a=tensor, shape_a=(2,), shape_b=(2,), dtype_a="torch.float32",
                            dtype_b="torch.float32", max_abs_err=1.0 if diverged else 0.0, max_rel_err=nan,
                            mean_abs_err=nan, rms_err=nan, cosine=nan, mismatch_fraction=nan, nan_mismatch=0,
                            inf_mismatch=0, atol=0.0, rtol=0.0, required_atol=nan, required_rtol=nan,
                            within_tolerance=not diverged, approximate=False,
                            status="diverged" if diverged else "identical", origin="between modules" if diverged
                            else None)


def test_unrecorded_origin_only_where_the_block_after_the_gap_starts() -> None:
    gaps = {"M.layers.3": ("M.layers.1", "M.layers.2")}
    starts = [_row(0, "M.layers.0", "outputs", False), _row(1, "M.layers.3", "inputs.args.0", True)]
    (first,) = [r for r in mark_unrecorded_origin(starts, {}, gaps) if r.diverged]
    assert (first.origin, first.unrecorded) == ("unrecorded", ("M.layers.1", "M.layers.2"))
    assert mark_unrecorded_origin(starts, gaps, {})[1].origin == "unrecorded"  # the gap may be A's
    inside = [_row(0, "M.layers.3", "inputs.args.0", False), _row(1, "M.layers.3.mlp", "outputs", False),
              _row(2, "M.layers.3.norm", "inputs.args.0", True)]
    assert mark_unrecorded_origin(inside, {}, gaps)[2].origin == "between modules"  # it arose inside layers.3
    elsewhere = [_row(0, "M.head", "inputs.args.0", True)]
    assert mark_unrecorded_origin(elsewhere, {}, gaps)[0].origin == "between modules"
