"""The one rule for globs over module paths (tracediff.globs): ``*`` is one segment, ``**`` any number."""

from __future__ import annotations

import fnmatch

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tracediff.globs import covers, matches


def reference(path: str, pattern: str) -> bool:
    """Segment by segment: ``**`` takes none or more segments, any other pattern segment one (fnmatch on it)."""
    def match(pat: list[str], segs: list[str]) -> bool:
        if not pat:
            return not segs
        if pat[0] == "**":
            return any(match(pat[1:], segs[k:]) for k in range(len(segs) + 1))
        return bool(segs) and fnmatch.fnmatchcase(segs[0], pat[0]) and match(pat[1:], segs[1:])
    return match(pattern.split("."), path.split("."))


_names = st.sampled_from(["model", "layers", "0", "1", "12", "mlp", "q_proj", "self_attn", "norm"])
_pattern_segments = st.one_of(_names, st.sampled_from(["*", "**", "?", "*_proj", "layer?", "[01]", "[!0]", "1*",
                                                       "*s", "x**", "[0-9]"]))


@given(st.lists(_names, min_size=1, max_size=6).map(".".join),
       st.lists(_pattern_segments, min_size=1, max_size=6).map(".".join))
@example("model.layers.0.self_attn.q_proj", "model.layers.*")
@example("x", "**.**.x")
@example("model", "model.**")
def test_the_matcher_agrees_with_the_segment_by_segment_reference(path: str, pattern: str) -> None:
    assert matches(path, pattern) == reference(path, pattern)


@pytest.mark.parametrize(("path", "pattern", "expected"), [
    ("model.layers.3", "model.layers.*", True),
    ("model.layers.3.mlp.down_proj", "model.layers.*", False),  # fnmatch's '*' crossed the dots
    ("model.layers.3.mlp.down_proj", "model.layers.**", True),
    ("model.layers.0.self_attn.q_proj", "model.layers.*.self_attn.q_proj", True),  # transformers' tp_plan form
    ("model.layers.0.self_attn.q_proj", "**.q_proj", True),
    ("q_proj", "**.q_proj", True),
    ("model.layers.0.self_attn.q_proj", "*.q_proj", False),
    ("model.layers.0.mlp", "model.**.mlp", True),
    ("lm_head", "lm_head", True),
])
def test_star_is_one_segment_and_double_star_any_number(path: str, pattern: str, expected: bool) -> None:
    assert matches(path, pattern) is expected


def test_covers_is_the_module_and_what_is_under_it() -> None:
    assert covers("model.layers.1", "model.layers.1") and covers("model.layers.1", "model.layers.1.mlp.up_proj")
    assert not covers("model.layers.1", "model.layers.10")
    assert covers("model.layers.*.mlp", "model.layers.4.mlp.down_proj")
    assert not covers("layers.*", "model.layers.0")


# Every site that takes a module-path glob uses the rule: '*.q_proj' is a child of a top-level module, never a
# q_proj three levels down (fnmatch's '*' matched both).
def test_shards_rules_use_the_rule() -> None:
    from tracediff.sharding.rules import parse_rules

    star, double = parse_rules("*.q_proj outputs: replicated\n**.q_proj outputs: replicated\n", "rules").rules
    assert not star.matches("layers.0.self_attn.q_proj") and star.matches("attn.q_proj")
    assert double.matches("layers.0.self_attn.q_proj")


def test_ops_inside_uses_the_rule() -> None:
    from tracediff.capturing.ops import OpSelection

    assert not OpSelection(inside=("layers.*",)).records_inside("Net.layers.0.attn")
    assert OpSelection(inside=("layers.*",)).records_inside("Net.layers.0")
    assert OpSelection(inside=("**.attn",)).records_inside("Net.layers.0.attn")


def test_tolerance_overrides_use_the_rule_and_cover_what_is_under_a_match() -> None:
    from tracediff.compare.tolerance import TolerancePolicy

    f32 = ("torch.float32", "torch.float32")
    policy = TolerancePolicy(atol={"*": 1e-5, "layers.*": 1e-3, "*.fc1": 0.5})  # the last match wins
    assert policy.resolve(("layers.1.fc1", "layers.1.fc1"), *f32)[0] == 1e-3  # under layers.1; '*.fc1' is not it
    assert policy.resolve(("head.fc1", "head.fc1"), *f32)[0] == 0.5
    assert policy.resolve(("head", "head"), *f32)[0] == 1e-5


def test_logits_patterns_use_the_rule() -> None:
    from types import SimpleNamespace

    from tracediff.alignment.lm_verdicts import is_logits_row

    row = SimpleNamespace(tensor="outputs")
    assert is_logits_row(row, "model.heads.lm", ("**.lm",))  # type: ignore[arg-type]
    assert not is_logits_row(row, "model.heads.lm", ("*.lm",))  # type: ignore[arg-type]
