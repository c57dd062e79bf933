#!/usr/bin/env python
"""Run every case of the real-port suite (tests/ports) and write the table to docs/accuracy.md.

    python scripts/port_accuracy.py                  # every port; rewrites the table in docs/accuracy.md
    python scripts/port_accuracy.py --port whisper   # one port, printed only (docs untouched)
    python scripts/port_accuracy.py --mlx            # only the mlx-lm ports; rewrites their table only

Each cell is one run of ``tracediff align`` (or replay, or align on op-level traces) on two traces of a
real port, and says whether the verdict was right: the exit code, and for a bug the module the first
divergence names. The table sits between the two ``<!-- accuracy table -->`` markers of docs/accuracy.md.
Needs the ports extra: ``pip install -c constraints.txt -e ".[ports]"``. The mlx-lm ports (transformers
against mlx-lm's own implementations, tests/ports/mlx_harness.py) have their own table, between the
``<!-- mlx accuracy table -->`` markers, and need the mlx extra; without it they are skipped.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.ports.harness import MODES, Outcome, PortRun, cases  # noqa: E402

PORTS = ("whisper", "esm", "transformer_lens", "transformer_lens_llama", "transformer_lens_neox",
         "transformer_lens_bloom", "torchtune", "torchtune_phi3", "torchtune_qwen2", "torchtune_t5", "torchtune_gemma2",
         "research_llama", "research_vit")
DOC = ROOT / "docs" / "accuracy.md"
START, END = "<!-- accuracy table -->", "<!-- /accuracy table -->"
MLX_START, MLX_END = "<!-- mlx accuracy table -->", "<!-- /mlx accuracy table -->"


def load(name: str) -> object | None:
    import pytest

    try:
        return importlib.import_module(f"tests.ports.test_{name}")
    except pytest.skip.Exception as skipped:
        print(f"{name}: skipped ({skipped})", file=sys.stderr)
        return None


def cell(outcome: Outcome) -> str:
    verdict = "right" if outcome.right else "**wrong**"
    said = f"exit {outcome.exit_code}"
    if outcome.module is not None:
        said += f", `{outcome.module}`"
    if outcome.note:
        said += f" ({outcome.note})"
    return f"{verdict}: {said}"


def table(outcomes: list[Outcome]) -> str:
    lines = ["| port | case | expected | " + " | ".join(MODES) + " |", "|---" * (len(MODES) + 3) + "|"]
    rows: dict[tuple[str, str], dict[str, Outcome]] = {}
    for outcome in outcomes:
        if outcome.mode in MODES:
            rows.setdefault((outcome.port, outcome.case), {})[outcome.mode] = outcome
    for (port, case), by_mode in rows.items():
        first = next(iter(by_mode.values()))
        expected = f"exit {first.expected_exit}" + (f", `{first.expected_module}`" if first.expected_module else "")
        lines.append(f"| {port} | {case} | {expected} | " + " | ".join(cell(by_mode[m]) for m in MODES) + " |")
    lines += ["", "| port | bug | question | expected | verdict |", "|---|---|---|---|---|"]
    for outcome in outcomes:
        if outcome.mode not in MODES:
            lines.append(f"| {outcome.port} | {outcome.case} | {outcome.mode} (hand map) | "
                         f"exit 1, `{outcome.expected_module}` | {cell(outcome)} |")
    lines += ["", "| mode | right / total |", "|---|---|"]
    for mode in (*MODES, "replay", "ops"):
        these = [o for o in outcomes if o.mode == mode]
        lines.append(f"| {mode} | {sum(o.right for o in these)} / {len(these)} |")
    return "\n".join(lines)


def mlx_table(outcomes: list[Outcome]) -> str:
    lines = ["| port | case | expected | no options |", "|---|---|---|---|"]
    for outcome in outcomes:
        expected = f"exit {outcome.expected_exit}" + (f", `{outcome.expected_module}`"
                                                      if outcome.expected_module else "")
        lines.append(f"| {outcome.port} | {outcome.case} | {expected} | {cell(outcome)} |")
    lines += ["", f"right: {sum(o.right for o in outcomes)} / {len(outcomes)}"]
    return "\n".join(lines)


def run_mlx() -> tuple[list[Outcome], float] | None:
    """Every case of the mlx-lm ports, or None without the mlx extra."""
    try:
        import mlx_lm  # noqa: F401
    except ImportError:
        print("mlx ports: skipped (the mlx extra is not installed)", file=sys.stderr)
        return None
    from tests.ports.mlx_harness import PORTS as MLX_PORTS
    from tests.ports.mlx_harness import MlxPortRun

    outcomes: list[Outcome] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="port-accuracy-mlx-") as tmp:
        for port in MLX_PORTS:
            run = MlxPortRun(port, Path(tmp))
            for case in port.cases():
                outcome = run.judge(case)
                outcomes.append(outcome)
                print(f"{port.name:18} {case:26} {cell(outcome)}", flush=True)
    return outcomes, time.perf_counter() - started


def write_between(start: str, end: str, text: str) -> None:
    doc = DOC.read_text()
    head, rest = doc.split(start, 1)
    _, tail = rest.split(end, 1)
    DOC.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def stamp(runs: int, seconds: float, command: str) -> str:
    return f"Written by `{command}` on {datetime.date.today().isoformat()} " \
           f"({runs} runs, {seconds:.0f} s on this project's 2-core machine)."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", action="append", choices=PORTS, help="only this port (repeatable); docs untouched")
    parser.add_argument("--mlx", action="store_true", help="only the mlx-lm ports; rewrites their table only")
    args = parser.parse_args(argv)
    if args.mlx or args.port is None:
        found = run_mlx()
        if found is not None:
            mlx_outcomes, seconds = found
            text = mlx_table(mlx_outcomes)
            print(text)
            if args.port is None:
                command = "python scripts/port_accuracy.py" + (" --mlx" if args.mlx else "")
                write_between(MLX_START, MLX_END, f"{stamp(len(mlx_outcomes), seconds, command)}\n\n{text}")
        if args.mlx:
            return 0
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="port-accuracy-") as tmp:
        for name in args.port or PORTS:
            module = load(name)
            if module is None:
                continue
            port = module.PORT  # type: ignore[attr-defined]
            run = PortRun(port, Path(tmp))
            for case, mode in cases(port):
                outcome = run.judge(case, mode)
                outcomes.append(outcome)
                print(f"{port.name:18} {case:26} {mode:16} {cell(outcome)}", flush=True)
    seconds = time.perf_counter() - started
    text = table(outcomes)
    print(text)
    print(f"{len(outcomes)} runs in {seconds:.0f} s")
    if args.port is None:
        write_between(START, END, f"{stamp(len(outcomes), seconds, 'python scripts/port_accuracy.py')}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
