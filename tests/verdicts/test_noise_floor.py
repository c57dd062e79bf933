"""Verdicts against noise on real transformers ports: fp32 reference, low-precision baseline and ports.

The reference A is an fp32 model with sdpa attention; the baseline N is the same model cast to the
port's dtype; ports B use eager attention in that dtype, clean or with a planted bug in layer 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tracediff
from tests.verdicts.ports import build, capture, port

BUG_ROWS = {  # where each planted bug must be reported first: (module path relative to the root, slot, origin)
    ("llama", "scaled-weight"): ("layers.1.mlp.down_proj", "outputs", "introduced"),
    ("llama", "wrong-norm"): ("layers.1.input_layernorm", "outputs", "introduced"),
    ("llama", "attention-scale"): ("layers.1.self_attn.o_proj", "inputs.args.0", "between modules"),
    ("gpt2", "scaled-weight"): ("h.1.mlp.c_proj", "outputs", "introduced"),
    ("gpt2", "wrong-norm"): ("h.1.ln_1", "outputs", "introduced"),
    ("gpt2", "attention-scale"): ("h.1.attn.c_proj", "inputs.args.0", "between modules"),
    ("bert", "scaled-weight"): ("encoder.layer.1.output.dense", "outputs", "introduced"),
    ("bert", "wrong-norm"): ("encoder.layer.1.attention.output.LayerNorm", "outputs", "introduced"),
    ("bert", "attention-scale"): ("encoder.layer.1.attention.self", "outputs.0", "introduced"),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Ports:
    """Captures on first use, shared by every test of this module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[tuple[object, ...], Path] = {}

    def get(self, *key: object) -> Path:
        if key not in self.cache:
            kind, arch, dtype = key[0], str(key[1]), DTYPES[str(key[2])]
            out = self.root / "-".join(str(k) for k in key)
            if kind == "ref":
                self.cache[key] = capture(build(arch), out)
            elif kind == "base":
                self.cache[key] = capture(build(arch), out, dtype)
            else:
                bugs = [(str(key[3]), 1)] if len(key) > 3 else []
                self.cache[key] = port(arch, out, dtype=dtype, bugs=bugs)
        return self.cache[key]


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Ports:
    return Ports(tmp_path_factory.mktemp("ports"))


def relative(path: str) -> str:
    return path.partition(".")[2]


CASES = [(arch, "bf16") for arch in ("llama", "gpt2", "bert")] + [("llama", "fp16")]


@pytest.mark.parametrize("arch,dtype", CASES)
def test_a_clean_port_with_another_attention_kernel_passes_with_the_baseline(ports: Ports, arch: str,
                                                                              dtype: str) -> None:
    ref, base = ports.get("ref", arch, "fp32"), ports.get("base", arch, dtype)
    clean = ports.get("port", arch, dtype)

    without = tracediff.align(ref, clean)
    result = tracediff.align(ref, clean, baseline=base)

    assert not without.diverged or any("rounding noise is counted as error" in w for w in without.warnings)
    assert result.passed, result.first_divergence
    assert result.sources == ()
    assert result.baseline == str(base)
    floors = [row.noise_ratio for row in result.rows if row.noise_ratio is not None]
    assert floors and max(floors) <= 3.0


BUGS = ["scaled-weight", "wrong-norm", "attention-scale"]
BUG_CASES = [(arch, "bf16", bug) for arch in ("llama", "gpt2", "bert") for bug in BUGS] + [
    ("llama", "fp16", "scaled-weight")]


@pytest.mark.parametrize("arch,dtype,bug", BUG_CASES)
def test_a_planted_bug_is_the_first_divergence_and_a_source(ports: Ports, arch: str, dtype: str, bug: str) -> None:
    ref, base = ports.get("ref", arch, "fp32"), ports.get("base", arch, dtype)
    result = tracediff.align(ref, ports.get("port", arch, dtype, bug), baseline=base)

    path, slot, origin = BUG_ROWS[(arch, bug)]
    first = result.first_divergence
    assert first is not None
    assert (relative(first.module_path_b), first.tensor, first.origin) == (path, slot, origin)
    assert first.noise_ratio is not None and first.noise_ratio > 3
    assert result.sources[0] == first
    assert first.growth is not None and first.growth > 3


@pytest.mark.parametrize("bug", BUGS)
def test_fp32_ports_need_no_baseline(ports: Ports, bug: str) -> None:
    result = tracediff.align(ports.get("ref", "llama", "fp32"), ports.get("port", "llama", "fp32", bug))

    path, slot, origin = BUG_ROWS[("llama", bug)]
    first = result.first_divergence
    assert first is not None and (relative(first.module_path_b), first.tensor, first.origin) == (path, slot, origin)
    assert [relative(s.module_path_b) for s in result.sources] == [path]
    assert not any("rounding noise" in w for w in result.warnings)


def test_a_cross_dtype_comparison_without_baseline_says_how_to_get_one(ports: Ports) -> None:
    result = tracediff.align(ports.get("ref", "llama", "fp32"), ports.get("port", "llama", "bf16"))

    [warning] = [w for w in result.warnings if "rounding noise" in w]
    assert warning.startswith("A is float32 and B is bfloat16: rounding noise is counted as error")
    assert "--dtype bfloat16" in warning and "--baseline" in warning
    accepted = [r for r in result.rows if r.reason.startswith("accepted across dtypes: relative RMS error")]
    assert accepted, "the relative-norm rule accepts rows of a clean bf16 port"


@pytest.fixture(scope="module")
def two_bugs(ports: Ports) -> Path:
    """A bf16 port with a benign-looking norm eps change in layer 0 and a wrong norm formula in layer 2."""
    return port("llama", ports.root / "two-bugs", dtype=torch.bfloat16, bugs=[("norm-eps", 0), ("wrong-norm", 2)])


def test_two_bugs_are_both_sources_and_the_real_one_grows_most(ports: Ports, two_bugs: Path) -> None:
    ref, base = ports.get("ref", "llama", "fp32"), ports.get("base", "llama", "bf16")
    result = tracediff.align(ref, two_bugs, baseline=base)

    where = [(relative(s.module_path_b), s.tensor) for s in result.sources]
    assert where == [("layers.0.input_layernorm", "outputs"), ("layers.2.input_layernorm", "outputs")]
    eps, norm = result.sources
    assert result.first_divergence == eps
    assert eps.growth is not None and norm.growth is not None and norm.growth > eps.growth > 3
    assert all(row.origin == "inherited" for row in result.diverged if row not in result.sources)

    with pytest.raises(AssertionError) as raised:
        tracediff.assert_traces_close(ref, two_bugs, baseline=base)
    message = str(raised.value)
    assert "first divergence (introduced): LlamaModel.layers.0.input_layernorm outputs" in message
    assert f"largest source (2 in all; growth {norm.growth:.3g}): LlamaModel.layers.2.input_layernorm outputs" \
        in message


def test_a_between_modules_source_names_the_caller_never_a_container(ports: Ports) -> None:
    result = tracediff.align(ports.get("ref", "llama", "fp32"), ports.get("port", "llama", "fp32", "attention-scale"))

    first = result.first_divergence
    assert first is not None and first.origin == "between modules"
    assert ("changed by the code of LlamaModel.layers.1.self_attn (call 0) between its submodule calls after "
            "LlamaModel.layers.1.self_attn.v_proj returned, before LlamaModel.layers.1.self_attn.o_proj ran"
            ) in first.reason


def test_ignore_sets_rows_aside_and_the_real_source_remains(ports: Ports, two_bugs: Path) -> None:
    ref, base = ports.get("ref", "llama", "fp32"), ports.get("base", "llama", "bf16")
    result = tracediff.align(ref, two_bugs, baseline=base,
                             ignore=["layers.0.input_layernorm:outputs", "nothing.here"])

    assert [(relative(r.module_path_b), r.tensor) for r in result.ignored] == [("layers.0.input_layernorm", "outputs")]
    assert result.ignored[0].reason.endswith("ignored (--ignore layers.0.input_layernorm:outputs)")
    assert ("layers.0.input_layernorm", "outputs") not in [(relative(r.module_path_b), r.tensor) for r in result.rows]
    assert "--ignore pattern 'nothing.here' matches no compared tensor" in result.warnings
    assert [(relative(s.module_path_b), s.tensor) for s in result.sources] == [("layers.2.input_layernorm", "outputs")]


def test_json_report_carries_the_verdict_fields(ports: Ports) -> None:
    result = tracediff.align(ports.get("ref", "llama", "fp32"), ports.get("port", "llama", "bf16", "scaled-weight"),
                             baseline=ports.get("base", "llama", "bf16"))
    report = result.to_dict()

    assert report["baseline"] == str(ports.get("base", "llama", "bf16"))
    assert isinstance(report["warnings"], list)
    source = report["sources"][0]
    for key in ("module_path_a", "module_path_b", "call_index", "tensor", "max_abs_err", "origin", "growth",
                "noise_floor", "noise_ratio"):
        assert key in source
    assert all(key in report["rows"][0] for key in ("noise_floor", "noise_ratio", "growth"))
    table = result.table
    assert {"noise_floor", "noise_ratio", "growth"} <= set(table.columns)


def test_next_centres_the_table_on_the_following_source(ports: Ports, two_bugs: Path) -> None:
    from tracediff.render.alignment import render_table

    result = tracediff.align(ports.get("ref", "llama", "fp32"), two_bugs, baseline=ports.get("base", "llama", "bf16"))
    second = result.sources[1]

    table = render_table(result, focus=1)
    rows = [line for line in table.splitlines() if line.startswith(("S ", ">> ", "   ")) and line.split()[0] != "#"]
    marked = [line for line in rows if line.startswith("S ")]
    assert any(f" {second.order} " in line and "LlamaModel.layers.2.input_layernorm" in line for line in marked)
    orders = [int(line.split()[1] if line.startswith(("S", ">>")) else line.split()[0]) for line in rows]
    assert orders == list(range(second.order - 5, second.order + 6))
    assert "  2. LlamaModel.layers.2.input_layernorm outputs (introduced): growth " in table
