"""Which (atol, rtol) applies: per-dtype defaults, global and per-path overrides, and their warnings."""

from __future__ import annotations

import pytest

from tracediff import UsageError
from tracediff.compare.tolerance import TolerancePolicy, default_tolerance, parse_cli_tolerances

# (atol, rtol) of the table in tracediff/compare/tolerance.py
TABLE = {
    "torch.float64": (1e-7, 1e-7),
    "torch.float32": (1e-5, 1.3e-6),
    "torch.float16": (1e-5, 1e-3),
    "torch.bfloat16": (1e-5, 1.6e-2),
    "torch.float8_e4m3fn": (1e-3, 1.25e-1),
    "torch.float8_e5m2": (1e-3, 2.5e-1),
    "torch.int64": (0.0, 0.0),
    "torch.int32": (0.0, 0.0),
    "torch.bool": (0.0, 0.0),
}


@pytest.mark.parametrize("dtype", sorted(TABLE))
def test_default_per_dtype(dtype: str) -> None:
    assert default_tolerance(dtype, dtype) == TABLE[dtype]


@pytest.mark.parametrize("a, b, expected", [
    ("torch.float32", "torch.bfloat16", (1e-5, 1.6e-2)),
    ("torch.bfloat16", "torch.float32", (1e-5, 1.6e-2)),
    ("torch.float64", "torch.float16", (1e-5, 1e-3)),
    ("torch.float32", "torch.float64", (1e-5, 1.3e-6)),
    ("torch.float8_e4m3fn", "torch.bfloat16", (1e-3, 1.25e-1)),
    ("torch.int64", "torch.float32", (1e-5, 1.3e-6)),
    (None, None, (0.0, 0.0)),
])
def test_default_is_the_looser_dtype_of_the_pair(a: str | None, b: str | None, expected: tuple[float, float]) -> None:
    assert default_tolerance(a, b) == expected


def test_torch_testing_agrees_with_the_table() -> None:
    """The float defaults are torch.testing.assert_close's: a pair just inside passes there too."""
    import torch

    for name in ("float64", "float32", "float16", "bfloat16"):
        dtype = getattr(torch, name)
        rtol, atol = TABLE[f"torch.{name}"]
        a = torch.tensor([1.0], dtype=torch.float64)
        inside = a + 0.9 * (atol + rtol)
        outside = a + 1.1 * (atol + rtol)
        torch.testing.assert_close(inside.to(dtype).double(), a.to(dtype).double(), rtol=rtol, atol=atol)
        with pytest.raises(AssertionError):
            torch.testing.assert_close(outside.double(), a.double(), rtol=rtol, atol=atol)


def test_global_numbers_replace_the_defaults() -> None:
    policy = TolerancePolicy(atol=1e-3, rtol=0.0)
    assert policy.resolve(("layers.0", "layers.0"), "torch.float32", "torch.float32") == (1e-3, 0.0)
    assert policy.resolve(("", ""), "torch.bfloat16", "torch.bfloat16") == (1e-3, 0.0)


def test_only_the_given_tolerance_is_overridden() -> None:
    policy = TolerancePolicy(atol=1e-3)
    assert policy.resolve(("head", "head"), "torch.bfloat16", "torch.float32") == (1e-3, 1.6e-2)


def test_pattern_covers_the_module_and_everything_inside() -> None:
    policy = TolerancePolicy(atol={"*": 1e-5, "layers.*.mlp": 1e-4})
    f32 = ("torch.float32", "torch.float32")
    assert policy.resolve(("layers.0.mlp", "layers.0.mlp"), *f32)[0] == 1e-4
    assert policy.resolve(("layers.1.mlp.up_proj", "layers.1.mlp.up_proj"), *f32)[0] == 1e-4
    assert policy.resolve(("layers.1", "layers.1"), *f32)[0] == 1e-5
    assert policy.resolve(("layers.1.mlpx", "layers.1.mlpx"), *f32)[0] == 1e-5
    assert policy.resolve(("", ""), *f32)[0] == 1e-5


def test_a_pattern_may_match_either_side() -> None:
    """With renamed modules the override applies when A's or B's relative path matches."""
    policy = TolerancePolicy(atol={"blocks.*.up": 0.5})
    assert policy.resolve(("layers.0.fc1", "blocks.0.up"), "torch.float32", "torch.float32")[0] == 0.5


def test_without_a_default_unmatched_paths_keep_the_dtype_default() -> None:
    policy = TolerancePolicy(rtol={"head": 0.25})
    assert policy.resolve(("head", "head"), "torch.float16", "torch.float16") == (1e-5, 0.25)
    assert policy.resolve(("embed", "embed"), "torch.float16", "torch.float16") == (1e-5, 1e-3)


def test_the_pattern_given_last_wins() -> None:
    policy = TolerancePolicy(atol={"layers.*": 1e-4, "layers.1.*": 1e-2})
    f32 = ("torch.float32", "torch.float32")
    assert policy.resolve(("layers.1.fc1", "layers.1.fc1"), *f32)[0] == 1e-2
    assert policy.resolve(("layers.0.fc1", "layers.0.fc1"), *f32)[0] == 1e-4
    reverse = TolerancePolicy(atol={"layers.1.*": 1e-2, "layers.*": 1e-4})
    assert reverse.resolve(("layers.1.fc1", "layers.1.fc1"), *f32)[0] == 1e-4


def test_unused_pattern_warns_with_did_you_mean() -> None:
    policy = TolerancePolicy(atol={"layers.*.mpl": 1e-4, "layers.*.mlp": 1e-4}, rtol={"nowhere.at.all": 1.0})
    known = ["", "layers.0", "layers.0.mlp", "layers.1.mlp", "norm"]
    for path in known:
        policy.resolve((path, path), "torch.float32", "torch.float32")
    assert policy.unused_pattern_warnings(known) == [
        "--atol pattern 'layers.*.mpl' matches no module; did you mean layers.1.mlp, layers.0.mlp, layers.0?",
        "--rtol pattern 'nowhere.at.all' matches no module",
    ]


@pytest.mark.parametrize("values, expected", [
    (None, None),
    ([], None),
    (["1e-5"], 1e-5),
    (["1e-5", "layers.*.mlp=1e-4"], {"*": 1e-5, "layers.*.mlp": 1e-4}),
    (["layers.*.mlp=1e-4"], {"layers.*.mlp": 1e-4}),
    (["1e-5", "2e-5"], 2e-5),
    (["a=b=1"], {"a=b": 1.0}),
])
def test_parse_cli_tolerances(values: list[str] | None, expected: object) -> None:
    assert parse_cli_tolerances(values, "atol") == expected


@pytest.mark.parametrize("values, message", [
    (["abc"], "--atol 'abc': expected a number or PATTERN=NUMBER"),
    (["x=abc"], "--atol 'x=abc': expected a number or PATTERN=NUMBER"),
    (["=1e-3"], "--atol '=1e-3': the pattern before '=' is empty"),
])
def test_parse_cli_tolerances_refuses_bad_values(values: list[str], message: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_cli_tolerances(values, "atol")
    assert str(e.value) == message


@pytest.mark.parametrize("atol, message", [
    (-1.0, "atol for '*' is -1.0: tolerances must be >= 0"),
    (float("nan"), "atol for '*' is nan: tolerances must be >= 0"),
    ({"layers.*": -0.5}, "atol for 'layers.*' is -0.5: tolerances must be >= 0"),
    ("1e-3", "atol='1e-3': expected a number or a mapping of module-path pattern to number"),
])
def test_library_refuses_bad_tolerances(atol: object, message: str) -> None:
    with pytest.raises(UsageError) as e:
        TolerancePolicy(atol=atol)  # type: ignore[arg-type]
    assert str(e.value) == message
