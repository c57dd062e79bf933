"""Hostile variants of genuine graph (llama.cpp) and compiled (torch.compile) traces keep every promise.

Each variant of ``tests/safety/trace_variants.py`` edits a copy of the genuine trace B, and ``tracediff align
A B --format json`` runs in-process. Asserted: exit 0, 1 or 2 (never 3), no traceback, one stderr line for
exit 2, strict JSON with ``passed`` agreeing with the exit code; and a variant that corrupts a compared value
or removes structure A has never passes. Before these variants were checked, 23 of them passed on llama.cpp
traces (a node that stopped agreeing was left unpaired, its rows never compared) and a 4,301-digit block
number exited 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.alignment.test_report_schema import SCHEMA
from tests.safety.helpers import cli
from tests.safety.trace_variants import KINDS, genuine, make, variants

torch = pytest.importorskip("torch")


def _llama_cpp_usable() -> str | None:
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
        import sentencepiece  # noqa: F401
    except (ImportError, OSError) as e:
        return f"the llama extra is not usable ({type(e).__name__}: {e})"
    return None


@pytest.fixture(scope="module")
def genuine_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    made: dict[str, tuple[Path, Path]] = {}
    for kind in KINDS:
        if kind == "llama.cpp" and _llama_cpp_usable():
            continue
        made[kind] = genuine(kind, tmp_path_factory.mktemp(kind.replace(".", "_")))
    return made


def _pair(genuine_pairs: dict[str, tuple[Path, Path]], kind: str) -> tuple[Path, Path]:
    if kind not in genuine_pairs:
        pytest.skip(_llama_cpp_usable() or f"no genuine {kind} trace")
    return genuine_pairs[kind]


def _align(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict | None, str]:
    code, out, err = cli(["align", str(a), str(b), "--format", "json"], capsys)
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("tracediff align: error: "), err
        return code, None, err

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-strict JSON constant {constant}")

    report = json.loads(out, parse_constant=refuse)
    assert report["passed"] is (code == 0), (code, report["passed"])
    return code, report, err


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_genuine_pair_passes(kind: str, genuine_pairs: dict[str, tuple[Path, Path]],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The variants start from a pair that passes: what a variant changes is what makes it fail."""
    a, b = _pair(genuine_pairs, kind)
    code, report, _ = _align(a, b, capsys)
    assert code == 0 and report is not None and report["unplaced"] == [], report


@pytest.mark.parametrize(("kind", "name"), [pytest.param(kind, v.name, id=f"{kind}-{v.name}")
                                            for kind in KINDS for v in variants(kind)])
def test_a_hostile_variant_keeps_every_promise(kind: str, name: str, genuine_pairs: dict[str, tuple[Path, Path]],
                                               tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _pair(genuine_pairs, kind)
    variant = next(v for v in variants(kind) if v.name == name)
    code, report, _ = _align(a, make(variant, b, tmp_path / "b"), capsys)
    if variant.must_fail:
        assert code != 0, report


def test_a_node_that_stops_agreeing_is_named_where_it_runs(genuine_pairs: dict[str, tuple[Path, Path]],
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``blk.0.attn_out`` x10 agrees with nothing: its consumers place it (``ffn_inp`` and ``norm`` lead to
    ``ffn_norm``, paired with post_attention_layernorm), so it is compared with o_proj and named there."""
    a, b = _pair(genuine_pairs, "llama.cpp")
    variant = next(v for v in variants("llama.cpp") if v.name == "payload:x10:Llama.blk.0.attn_out")
    code, report, _ = _align(a, make(variant, b, tmp_path / "b"), capsys)
    assert code == 1 and report is not None and report["verdict"] == "diverged", report
    first = report["first_divergence"]
    assert first["module_path_a"] == "LlamaForCausalLM.model.layers.0.self_attn.o_proj", first
    assert first["module_path_b"] == "Llama.blk.0.attn_out" and first["tensor"] == "outputs", first
    assert first["pairing"] == "shape", first  # no value says it: reported as the weakest evidence
    jsonschema.Draft202012Validator(SCHEMA).validate(report)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_lost_block_is_named(kind: str, genuine_pairs: dict[str, tuple[Path, Path]], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """Block 1 deleted from B: undecided, naming A's block 1 (or its calls) as having no counterpart."""
    a, b = _pair(genuine_pairs, kind)
    variant = next(v for v in variants(kind) if v.name == "clean:block_1_deleted")
    code, report, _ = _align(a, make(variant, b, tmp_path / "b"), capsys)
    assert code == 1 and report is not None and report["verdict"] == "undecided", report
    assert any(".layers.1" in u["module_path_a"] for u in report["unplaced"]), report["unplaced"]
