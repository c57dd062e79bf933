"""Start-up time of the command line: ``tracediff --version`` and ``tracediff align --help``.

    python bench/bench_startup.py            # 15 runs of each, median and min in seconds
    python bench/bench_startup.py --runs 30

Each command runs as a fresh process, as a user would start it: the console
script found on PATH, the pyenv shim when there is one (a shell script that
runs pyenv to find the script: what a user's shell runs), and
``python -m tracediff``. ``python -c pass`` is the floor: the interpreter
alone. Wall time per run with ``time.perf_counter`` around ``subprocess.run``,
and the child's CPU time (user + system, from ``getrusage``), which a busy
machine inflates much less than wall time; the load average is printed too.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(argv: list[str], runs: int) -> tuple[float, float, float]:
    """Median wall, min wall and median CPU (user + system) seconds of ``runs`` fresh runs of ``argv``."""
    subprocess.run(argv, capture_output=True, check=True)  # warm the file cache
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), _cpu()
        subprocess.run(argv, capture_output=True, check=True)
        wall.append(time.perf_counter() - start)
        cpu.append(_cpu() - start_cpu)
    return statistics.median(wall), min(wall), statistics.median(cpu)


def _commands() -> list[tuple[str, list[str]]]:
    py = sys.executable
    out = [("python -c pass (floor)", [py, "-c", "pass"])]
    scripts = []
    script = shutil.which("tracediff")
    if script:
        scripts.append(("script", script))
    shim = os.path.join(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv")), "shims", "tracediff")
    if os.path.exists(shim) and shim != script:
        scripts.append(("pyenv shim", shim))
    for label, path in scripts:
        out.append((f"tracediff --version ({label})", [path, "--version"]))
        out.append((f"tracediff align --help ({label})", [path, "align", "--help"]))
    out.append(("python -m tracediff --version", [py, "-m", "tracediff", "--version"]))
    out.append(("python -m tracediff align --help", [py, "-m", "tracediff", "align", "--help"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="runs per command (default 15)")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.runs} runs each")
    print(f"{'command':44} {'median s':>9} {'min s':>7} {'cpu s':>7}")
    for label, argv in _commands():
        median, best, cpu = _time(argv, args.runs)
        print(f"{label:44} {median:9.3f} {best:7.3f} {cpu:7.3f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
