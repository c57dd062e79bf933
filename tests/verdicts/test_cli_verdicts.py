"""The command line of verdicts: ``capture --dtype/--device``, ``align --baseline/--noise-factor/--ignore/--next``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.alignment.helpers import run_cli

SPEC = "tests.verdicts.spec_ports"


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tracediff.cli.main import main

    root = tmp_path_factory.mktemp("cli-verdicts")
    out = {name: root / name for name in ("ref", "base", "port")}
    assert main(["capture", f"{SPEC}:reference", "--out", str(out["ref"])]) == 0
    assert main(["capture", f"{SPEC}:reference", "--out", str(out["base"]), "--dtype", "bfloat16",
                 "--device", "cpu"]) == 0
    assert main(["capture", f"{SPEC}:buggy_port", "--out", str(out["port"])]) == 0
    return out


def test_capture_dtype_casts_the_model_and_keeps_integer_inputs(captured: dict[str, Path]) -> None:
    from tracediff import load_trace

    trace = load_trace(captured["base"])
    dtypes = {t.slot: t.dtype for n in trace.nodes() for t in n.tensors if n.relative_path == ""}
    assert dtypes["inputs.kwargs.input_ids"] == "torch.int64"
    assert dtypes["outputs.last_hidden_state"] == "torch.bfloat16"


@pytest.mark.parametrize("option,message", [
    (["--dtype", "int8"], "--dtype 'int8': expected one of bfloat16, float16, float32, float64"),
    (["--device", "nowhere"], "--device nowhere: not usable here"),
])
def test_capture_rejects_a_bad_dtype_or_device_before_building(tmp_path: Path, capsys: Any, option: list[str],
                                                                message: str) -> None:
    code, _, err = run_cli(["capture", f"{SPEC}:reference", "--out", str(tmp_path / "x"), *option], capsys)

    assert code == 2
    assert err.startswith("tracediff capture: ") and message in err
    assert not (tmp_path / "x").exists()
    assert len(err.strip().splitlines()) == 1


def test_align_with_baseline_names_the_bug_in_json(captured: dict[str, Path], capsys: Any) -> None:
    code, out, _ = run_cli(["align", str(captured["ref"]), str(captured["port"]), "--baseline", str(captured["base"]),
                            "--format", "json"], capsys)

    assert code == 1
    report = json.loads(out)
    assert report["baseline"] == str(captured["base"])
    assert report["noise_factor"] == 3.0
    assert report["first_divergence"]["module_path_b"] == "LlamaModel.layers.1.mlp.down_proj"
    [source] = report["sources"]
    assert {k: source[k] for k in ("module_path_a", "module_path_b", "call_index", "tensor", "origin")} == {
        "module_path_a": "LlamaModel.layers.1.mlp.down_proj", "module_path_b": "LlamaModel.layers.1.mlp.down_proj",
        "call_index": 0, "tensor": "outputs", "origin": "introduced"}
    assert source["growth"] > 3 and source["noise_ratio"] > 3 and source["max_abs_err"] > 0
    assert all(set(row) >= {"noise_floor", "noise_ratio", "growth"} for row in report["rows"])
    assert report["warnings"] == []


def test_align_table_states_the_baseline_verdict_and_the_sources(captured: dict[str, Path], capsys: Any) -> None:
    code, out, _ = run_cli(["align", str(captured["ref"]), str(captured["port"]), "--baseline",
                            str(captured["base"])], capsys)

    assert code == 1
    assert f"A vs B with baseline {captured['base']}: " in out
    assert "beyond 3 x the bfloat16 noise floor, first LlamaModel.layers.1.mlp.down_proj outputs" in out
    assert "error sources (1; growth = error over what flowed in, in units of the noise floor):" in out
    assert "  1. LlamaModel.layers.1.mlp.down_proj outputs (introduced): growth " in out


def test_a_large_noise_factor_passes_and_says_so(captured: dict[str, Path], capsys: Any) -> None:
    code, out, _ = run_cli(["align", str(captured["ref"]), str(captured["port"]), "--baseline", str(captured["base"]),
                            "--noise-factor", "1000"], capsys)

    assert code == 0
    assert f"A vs B with baseline {captured['base']}: every tensor within 1000 x the bfloat16 noise floor" in out


def test_without_baseline_the_dtype_warning_goes_to_stderr(captured: dict[str, Path], capsys: Any) -> None:
    _, _, err = run_cli(["align", str(captured["ref"]), str(captured["port"])], capsys)

    assert "tracediff align: warning: A is float32 and B is bfloat16: rounding noise is counted as error" in err
    assert "tracediff capture SPEC --out ref-bfloat16 --dtype bfloat16" in err


def test_ignore_and_next(captured: dict[str, Path], capsys: Any) -> None:
    code, out, _ = run_cli(["align", str(captured["ref"]), str(captured["port"]), "--baseline", str(captured["base"]),
                            "--ignore", "layers.1.mlp.down_proj:outputs", "--next", "1", "--format", "json"],
                           capsys)

    report = json.loads(out)
    assert [(r["module_path_b"], r["tensor"]) for r in report["ignored"]] == [
        ("LlamaModel.layers.1.mlp.down_proj", "outputs")]
    assert code == (0 if report["passed"] else 1)


@pytest.mark.parametrize("value", ["0.5", "nan"])
def test_a_noise_factor_below_one_is_bad_input(captured: dict[str, Path], capsys: Any, value: str) -> None:
    code, _, err = run_cli(["align", str(captured["ref"]), str(captured["port"]), "--noise-factor", value], capsys)

    assert code == 2
    assert "noise_factor=" in err and "expected a number >= 1" in err


def test_reports_show_the_noise_floor_and_the_sources(captured: dict[str, Path], capsys: Any, tmp_path: Path) -> None:
    import csv
    import io

    base = ["align", str(captured["ref"]), str(captured["port"]), "--baseline", str(captured["base"])]
    _, text, _ = run_cli([*base, "--format", "csv"], capsys)
    header = next(csv.reader(io.StringIO(text)))
    assert {"noise_floor", "noise_ratio", "growth"} <= set(header)

    _, markdown, _ = run_cli([*base, "--format", "markdown"], capsys)
    assert "| x noise " in markdown and "| growth " in markdown
    assert "- 1. LlamaModel.layers.1.mlp.down_proj outputs (introduced): growth " in markdown.replace("\\", "")

    _, page, _ = run_cli([*base, "--format", "html"], capsys)
    assert '<div id="sources" class="sources"><div class="label">Error sources (1)' in page
    assert '<span class="tag source">error source</span>' in page
    assert '"noise_factor":3.0' in page and '"sources":[' in page
    assert "every tensor within" not in page and "beyond 3 x the bfloat16 noise floor" in page


def test_the_plot_draws_the_noise_band(captured: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from tracediff import align
    from tracediff.render.plot import error_figure

    result = align(captured["ref"], captured["port"], baseline=captured["base"])
    labels = error_figure(result).axes[0].get_legend_handles_labels()[1]

    assert "noise band (3 x floor)" in labels and "error source" in labels
