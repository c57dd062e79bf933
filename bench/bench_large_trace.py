"""Reading a large trace: ``tracediff show`` and ``tracediff align`` on a ~200 MB trace JSON.

::

    python bench/bench_large_trace.py --mb 200 --dir /tmp/large-trace

Writes a synthetic tracediff trace (summary mode: statistics, no payloads) of
a model with many layers until the FULL_TENSORS JSON reaches ``--mb``, and a
second one beside it (``--dir``/port) with every mean moved by one part in a
million: within tolerance, but no tensor's statistics are equal to A's, so
every pair is compared statistic by statistic. Then runs each command in a
fresh process under ``/usr/bin/time -v`` and prints wall time, CPU time and
peak RSS (maximum resident set size); with ``--repeats N`` the commands run
N times, interleaved, and the median times and the largest peak are printed.
``align`` compares the trace with itself, ``align-port`` with the moved copy.
The traces are kept in ``--dir`` for reruns (``--reuse``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _tensor(i: int, shape: list[int], moved: float = 0.0) -> dict[str, object]:
    return {"shape": f"torch.Size({shape})", "dtype": "torch.float32",
            "stats": {"numel": 4096, "mean": 0.001 * (i + 1) * (1 + moved), "std": 1.0 + i * 1e-6, "min": -3.5,
                      "max": 3.5,
                      "abs_mean": 0.79, "nan": 0, "posinf": 0, "neginf": 0, "zeros": 0}}


def _layer(k: int, moved: float) -> dict[str, object]:
    prefix = f"Big.layers.{k}"
    leaves = []
    for j, name in enumerate(("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "norm")):
        leaves.append({"module_path": f"{prefix}.{name}", "module_type": "Linear", "call_index": 0,
                       "inputs": {"args": [_tensor(k * 10 + j, [1, 16, 256], moved)]},
                       "outputs": _tensor(k * 10 + j + 1, [1, 16, 256], moved)})
    return {"module_path": prefix, "module_type": "Block", "call_index": 0,
            "inputs": {"args": [_tensor(k, [1, 16, 256], moved)],
                       "kwargs": {"use_cache": {"py_type": "bool", "py_value": False}}},
            "children": leaves, "outputs": _tensor(k + 1, [1, 16, 256], moved)}


def write_trace(folder: Path, megabytes: int, moved: float = 0.0, layers: int | None = None) -> int:
    """Write the trace layer by layer (the JSON text is streamed, never held whole) until it reaches
    ``megabytes`` or holds ``layers`` layers; returns the number of layers. ``moved``: see the top."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "Big_debug_tree_FULL_TENSORS.json"
    target = megabytes * 1_000_000
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"module_path": "Big", "module_type": "Big", "call_index": 0, '
                '"inputs": {"args": []}, "children": [')
        k = 0
        while (f.tell() < target) if layers is None else (k < layers):
            f.write((", " if k else "") + json.dumps(_layer(k, moved), indent=2))
            k += 1
        f.write('], "outputs": ' + json.dumps(_tensor(0, [1, 16, 256], moved)) + "}")
    meta = {"format_version": "1.1", "tracediff_version": "bench", "model_name": "Big", "complete": True,
            "options": {"tensors": "summary"}}
    (folder / "tracediff_metadata.json").write_text(json.dumps(meta))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB, {k} layers, {k * 9 + 1} calls)", flush=True)
    return k


def measure(argv: list[str]) -> tuple[float, float, float, int]:
    """Wall seconds, CPU seconds (user + system), peak RSS in MB and exit code of ``tracediff ARGV``."""
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "tracediff", *argv],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    rss = int(match.group(1)) / 1024 if match else float("nan")
    cpu = sum(float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", done.stderr))
    return wall, cpu, rss, done.returncode


def phases(folder_a: Path, folder_b: Path) -> None:
    """Where the time of ``align A B`` goes: imports, reading each trace, aligning, rendering (in this process)."""
    started = time.perf_counter()
    from tracediff.alignment import align
    from tracediff.cli.process import paused_gc
    from tracediff.render.alignment import render_table
    from tracediff.trace.load import load_trace

    def timed(name: str, began: float) -> None:
        print(f"{name:20s} {time.perf_counter() - began:6.2f} s", flush=True)

    timed("imports", started)
    with paused_gc():  # as the command runs them
        began = time.perf_counter()
        trace_a = load_trace(folder_a)
        timed("read A", began)
        began = time.perf_counter()
        trace_b = load_trace(folder_b)
        timed("read B", began)
        began = time.perf_counter()
        result = align(trace_a, trace_b)
        timed("align", began)
        began = time.perf_counter()
        render_table(result)
        timed("render", began)


def floor(folders: list[Path]) -> None:
    """What any reader in Python pays: ``json.loads`` of each trace JSON, and one walk touching every tensor."""
    import gc

    gc.disable()  # as the command runs
    total = 0.0
    for folder in folders:
        began = time.perf_counter()
        tree = json.loads((folder / "Big_debug_tree_FULL_TENSORS.json").read_bytes())
        parsed = time.perf_counter()
        means, stack = [], [tree]
        while stack:
            node = stack.pop()
            for entry in (*node["inputs"].get("args", ()), node.get("outputs")):
                if isinstance(entry, dict) and "stats" in entry:
                    means.append((node["module_path"], entry["stats"]["mean"]))
            stack.extend(node.get("children", ()))
        walked = time.perf_counter()
        total += walked - began
        print(f"floor {folder.name:14s} json.loads {parsed - began:5.2f} s, walk {walked - parsed:5.2f} s "
              f"({len(means)} tensors)", flush=True)
        del tree, means
    print(f"floor in all         {total:6.2f} s", flush=True)
    gc.enable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="size of the trace JSON in MB (default 200)")
    parser.add_argument("--dir", default="/tmp/tracediff-large-trace", help="where the trace is written")
    parser.add_argument("--reuse", action="store_true", help="reuse the trace already in --dir")
    parser.add_argument("--only", action="append", choices=["show", "show-json", "align", "align-port"],
                        help="run only this command (repeatable; default: all four)")
    parser.add_argument("--phases", action="store_true",
                        help="also time the phases of align-port in this process (imports, reads, align, render)")
    parser.add_argument("--floor", action="store_true",
                        help="also time json.loads of both traces and one walk over their tensors (no tracediff)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each command, interleaved; the medians are printed (default 1)")
    args = parser.parse_args()
    folder = Path(args.dir)
    port = folder / "port"
    if not (args.reuse and (folder / "Big_debug_tree_FULL_TENSORS.json").is_file()
            and (port / "Big_debug_tree_FULL_TENSORS.json").is_file()):
        layers = write_trace(folder, args.mb)
        write_trace(port, args.mb, moved=1e-6, layers=layers)
    print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)
    if args.floor:
        floor([folder, port])
    if args.phases:
        phases(folder, port)
    commands = {"show": ["show", str(folder)],
                "show-json": ["show", str(folder), "--format", "json"],
                "align": ["align", str(folder), str(folder)],
                "align-port": ["align", str(folder), str(port)]}
    names = args.only or list(commands)
    runs: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name in names}
    for _ in range(args.repeats):  # interleaved, so that a noisy moment touches every command alike
        for name in names:
            runs[name].append(measure(commands[name]))
    for name in names:
        walls, cpus, rsss, codes = zip(*runs[name])
        spread = f" (runs: {', '.join(f'{w:.1f}' for w in walls)})" if len(walls) > 1 else ""
        print(f"{name:20s} wall {statistics.median(walls):7.1f} s  cpu {statistics.median(cpus):7.1f} s  "
              f"peak RSS {max(rsss):7.0f} MB  exit {sorted(set(codes))}{spread}", flush=True)
    print(f"load average: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
