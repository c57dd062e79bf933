"""The command line starts without its heavy dependencies: --help and --version import no torch, pandas, deepdiff."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tracediff.cli import commands

HEAVY = ("torch", "pandas", "deepdiff")

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
    from pathlib import Path

    repr_trace = str(Path(__file__).resolve().parent.parent / "fixtures" / "llama_tiny" / "repr")
    argvs = [["align", repr_trace, repr_trace], ["show", repr_trace]]
    probe = _PROBE.format(heavy=HEAVY, argvs=argvs)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(out.stdout)
    assert [code for _, code, _ in report] == [0, 0]
    assert [heavy for _, _, heavy in report] == [[], []]
