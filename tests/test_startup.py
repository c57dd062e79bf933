"""The command line starts without its heavy dependencies: --help and --version import no torch, pandas, deepdiff
or the other frameworks (mlx, jax, flax); reading and comparing traces import none of them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tracediff.cli import commands

HEAVY = ("torch", "pandas", "deepdiff", "mlx", "jax", "flax")

# Runs each argv through the real entry point in one fresh interpreter and reports, per argv, the exit code
# and which heavy modules had been imported by then.
_PROBE = textwrap.dedent("""
    import contextlib, io, json, sys
    from tracediff.cli.main import main
    heavy = {heavy!r}
    report = []
    for argv in {argvs!r}:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
        report.append([argv, code, sorted(m for m in heavy if m in sys.modules)])
    print(json.dumps(report))
""")


def command_names() -> list[str]:
    return [getattr(module, "COMMAND", module.__name__.rpartition(".")[2]) for module in commands.ALL]


def test_help_and_version_of_every_command_import_nothing_heavy() -> None:
    argvs = [["--help"], ["--version"], *([name, "--help"] for name in command_names())]
    probe = _PROBE.format(heavy=HEAVY, argvs=argvs)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert [argv for argv, _, _ in report] == argvs
    for argv, code, heavy in report:
        assert code == 0, argv
        assert heavy == [], f"tracediff {' '.join(argv)} imported {heavy}"


def test_python_m_tracediff_version_imports_nothing_heavy() -> None:
    """The whole start-up, as ``python -X importtime`` sees it (the console script runs the same code)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "tracediff", "--version"], capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.startswith("tracediff ")
    imported = {line.rpartition("|")[2].strip() for line in out.stderr.splitlines() if "|" in line}
    assert not {name for name in imported if name.split(".")[0] in HEAVY}


def test_import_tracediff_is_light() -> None:
    code = f"import sys, tracediff; print([m for m in {HEAVY!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_align_of_statistics_only_traces_imports_no_torch() -> None:
    """Traces without payloads (summary or repr traces) are compared on statistics: torch is never imported."""
    repr_trace = str(Path(__file__).resolve().parent.parent / "fixtures" / "llama_tiny" / "repr")
    argvs = [["align", repr_trace, repr_trace], ["show", repr_trace]]
    probe = _PROBE.format(heavy=HEAVY, argvs=argvs)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert [code for _, code, _ in report] == [0, 0]
    assert [heavy for _, _, heavy in report] == [[], []]


# --- reading and comparing traces need no torch (issue 23) ---------------------------------------------------

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _no_torch_report(argvs: list[list[str]]) -> list[list[object]]:
    probe = _PROBE.format(heavy=("torch", "mlx", "jax", "flax"), argvs=argvs)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    report: list[list[object]] = json.loads(out.stdout)
    return report


def test_align_show_and_plot_of_traces_with_payloads_import_no_torch(tmp_path: Path) -> None:
    """Payloads are decoded with numpy: comparing, showing and plotting a trace never imports torch."""
    ref, bug = str(FIXTURES / "llama_tiny" / "ref"), str(FIXTURES / "llama_tiny" / "port_bug")
    native = str(FIXTURES / "llama_tiny" / "native")
    argvs = [["align", ref, bug], ["align", ref, ref], ["align", native, bug, "--format", "json"], ["show", ref]]
    if importlib.util.find_spec("matplotlib") is not None:
        argvs.append(["plot", ref, bug, "-o", str(tmp_path / "plot.png")])
    report = _no_torch_report(argvs)
    assert [code for _, code, _ in report] == [1, 0, 1, 0] + [0] * (len(argvs) - 4)
    assert [heavy for _, _, heavy in report] == [[]] * len(argvs)


def test_steps_imports_no_torch(tmp_path: Path) -> None:
    from tests.steps.test_cli import _run

    _run(tmp_path / "a")
    _run(tmp_path / "lr", bump_lr_at=2)
    report = _no_torch_report([["steps", str(tmp_path / "a"), str(tmp_path / "lr")]])
    assert report == [[["steps", str(tmp_path / "a"), str(tmp_path / "lr")], 1, []]]


def test_load_trace_and_align_in_the_library_import_no_torch() -> None:
    ref, bug = FIXTURES / "llama_tiny" / "ref", FIXTURES / "llama_tiny" / "port_bug"
    code = textwrap.dedent(f"""
        import sys, tracediff
        trace = tracediff.load_trace({str(ref)!r})
        payload = trace.load_payload(trace.records()[-1][1])
        result = tracediff.align(trace, {str(bug)!r})
        print(result.passed, payload.dtype, result.first_divergence.tensor, "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "float32", "outputs", "False"]


def test_align_and_show_of_mlx_traces_import_neither_torch_nor_mlx(tmp_path: Path) -> None:
    """An MLX capture imports mlx (the model is MLX); reading its trace afterwards needs neither."""
    import pytest

    from tests.ports.mlx_harness import INSTALL

    mx = pytest.importorskip("mlx.core", reason=f"mlx is not installed (the mlx extra): {INSTALL}")
    import mlx.nn as mlx_nn

    import tracediff

    mx.random.seed(0)
    model = mlx_nn.Sequential(mlx_nn.Linear(4, 4), mlx_nn.ReLU(), mlx_nn.Linear(4, 2))
    x = mx.random.normal((2, 4), key=mx.random.key(1))
    for name in ("a", "b"):
        with tracediff.capture(model, tmp_path / name):
            model(x)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    report = _no_torch_report([["align", a, b], ["show", a]])
    assert [(code, heavy) for _, code, heavy in report] == [(0, []), (0, [])]


def test_align_of_two_small_trace_folders_loads_only_what_it_uses() -> None:
    """The levers of a small alignment's start-up stay pulled: its table is written without tabulate (whose
    import pulls wcwidth and importlib.metadata), a trace folder is not offered to the dump importers, a
    small pair is compared without a thread pool, one-rank traces load nothing of sharded or distributed
    alignments, and only the command being run builds its options."""
    ref, bug = str(FIXTURES / "llama_tiny" / "ref"), str(FIXTURES / "llama_tiny" / "port_bug")
    probe = textwrap.dedent(f"""
        import contextlib, io, sys
        from tracediff.cli import main as cli
        built = []
        build = cli.build_parser
        cli.build_parser = lambda command=None: built.append(command) or build(command)
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(["align", {ref!r}, {bug!r}])
        loaded = ["tabulate", "wcwidth", "tracediff.importers", "concurrent.futures", "tracediff.sharding",
                  "tracediff.alignment.distributed", "tracediff.alignment.sharded"]
        print(code, built, [m for m in loaded if m in sys.modules])
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split(maxsplit=1) == ["1", "['align'] []\n"], out.stdout
