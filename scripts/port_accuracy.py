#!/usr/bin/env python
"""Run every case of the real-port suite (tests/ports) and write the table to docs/accuracy.md.

    python scripts/port_accuracy.py                  # every port; rewrites the table in docs/accuracy.md
    python scripts/port_accuracy.py --port whisper   # one port, printed only (docs untouched)

Each cell is one run of ``tracediff align`` (or replay, or align on op-level traces) on two traces of a
real port, and says whether the verdict was right: the exit code, and for a bug the module the first
divergence names. The table sits between the two ``<!-- accuracy table -->`` markers of docs/accuracy.md.
Needs the ports extra: ``pip install -c constraints.txt -e ".[ports]"``.
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", action="append", choices=PORTS, help="only this port (repeatable); docs untouched")
    args = parser.parse_args(argv)
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
        doc = DOC.read_text()
        head, rest = doc.split(START, 1)
        _, tail = rest.split(END, 1)
        stamp = f"Written by `python scripts/port_accuracy.py` on {datetime.date.today().isoformat()} " \
                f"({len(outcomes)} runs, {seconds:.0f} s on this project's 2-core machine)."
        DOC.write_text(f"{head}{START}\n{stamp}\n\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
