"""Cost of capturing a model compiled with ``torch.compile``, next to capturing it eager.

    python bench/bench_compiled_capture.py [--repeats 7] [--width 256] [--writers N] [--json out.json]

Model: three blocks of Linear(W, 4W) / GELU / Linear(4W, W) / residual / LayerNorm(W), random weights
(seed 0), input [4, 128, W], CPU, float32, under ``torch.no_grad()``; compiled with inductor,
``dynamic=False``.

Five configurations run in this one process, interleaved, in an order rotated from round to round: the
eager forward, its full capture, the compiled forward, its full capture (``compiled="modules"``: the
records inside the graph), each capture with the payload files and bytes it wrote, and the write floor:
writing the bytes of the eager capture's payloads (each value once), as files of the same sizes, to a
fresh folder; with the compiled forward, what no full capture of the compiled model can beat. ``--writers``
sets both captures' payload writer threads (default: the capture's own, none on two cores). Each configuration
first runs once to warm up, so compilation is not timed:
the compiled capture compiles its graph once, on its warm-up run, and every later capture of the same
model runs that graph. Each capture writes into a fresh folder, deleted after it is measured. The figures
are medians over ``--repeats`` rounds, and the ratios are capture over forward: eager capture / eager
forward, compiled capture / compiled forward.

It then measures what the capture changes in the compiled run: the final output of the captured compiled
run against an uncaptured compiled run (bit-identical or not, and the largest difference), in float32
and in bfloat16, and what the compile metadata says (graphs, graph breaks) for the first capture.
Nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import tracediff

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rotated import payload_sizes, write_floor  # noqa: E402  (bench/, the script's own folder)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(self.act(self.fc1(x))))


class Net(nn.Module):
    def __init__(self, width: int, blocks: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(width) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build(width: int, dtype: torch.dtype = torch.float32) -> tuple[Net, torch.Tensor]:
    torch.manual_seed(0)
    model = Net(width).eval().to(dtype)
    x = torch.randn(4, 128, width, generator=torch.Generator().manual_seed(1)).to(dtype)
    return model, x


def timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def capture_run(model: Any, x: torch.Tensor, root: Path, written: dict[str, int],
                writers: int | None = None) -> Callable[[], Any]:
    """A capture into a fresh folder, deleted after; ``written`` gets its payload files and bytes."""
    def run() -> Any:
        folder = Path(tempfile.mkdtemp(dir=root))
        shutil.rmtree(folder)
        with tracediff.capture(model, folder, writers=writers) as session:
            y = model(x)
        sizes = payload_sizes(folder)
        written.update(files=len(sizes), bytes=sum(sizes))
        shutil.rmtree(folder)
        return y, session

    return run


def eager_sizes(model: Any, x: torch.Tensor, root: Path) -> list[int]:
    """The payload sizes of one eager capture (untimed): every value written once."""
    folder = Path(tempfile.mkdtemp(dir=root)) / "trace"
    with tracediff.capture(model, folder):
        model(x)
    sizes = payload_sizes(folder)
    shutil.rmtree(folder.parent)
    return sizes


def compare_outputs(width: int, dtype: torch.dtype, root: Path) -> dict[str, Any]:
    """The captured compiled run's output against an uncaptured compiled run of the same model and input."""
    model, x = build(width, dtype)
    compiled = torch.compile(model, dynamic=False)
    plain = compiled(x)
    folder = root / f"compare-{dtype}".replace("torch.", "")
    with tracediff.capture(compiled, folder) as session:
        captured = compiled(x)
    meta = json.loads((folder / "tracediff_metadata.json").read_text())["compile"]["during_capture"]
    eager = model(x)
    return {
        "dtype": str(dtype).replace("torch.", ""),
        "bit_identical": bool(torch.equal(captured, plain)),
        "max_abs_diff_vs_uncaptured_compiled": float((captured.float() - plain.float()).abs().max()),
        "max_abs_diff_uncaptured_compiled_vs_eager": float((plain.float() - eager.float()).abs().max()),
        "graphs": meta["graphs"], "graph_breaks": meta["graph_breaks"], "calls": session.calls,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--writers", type=int, default=None, help="payload writer threads (default: the capture's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="tracediff-bench-compiled-"))
    try:
        with torch.no_grad():
            model, x = build(args.width)
            compiled = torch.compile(model, dynamic=False)
            written: dict[str, dict[str, int]] = {"eager capture": {}, "compiled capture": {}}
            runs: dict[str, Callable[[], Any]] = {
                "eager forward": lambda: model(x),
                "eager capture": capture_run(model, x, root, written["eager capture"], args.writers),
                "compiled forward": lambda: compiled(x),
                "compiled capture": capture_run(compiled, x, root, written["compiled capture"], args.writers),
                "write floor": write_floor(eager_sizes(model, x, root), root),
            }
            compile_seconds = {name: timed(run) for name, run in runs.items()}  # warm-up: compiles here
            times: dict[str, list[float]] = {name: [] for name in runs}
            names = list(runs)
            for round_index in range(args.repeats):
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    times[name].append(timed(runs[name]))
            medians = {name: statistics.median(values) for name, values in times.items()}
            outputs = [compare_outputs(args.width, dtype, root) for dtype in (torch.float32, torch.bfloat16)]
    finally:
        shutil.rmtree(root, ignore_errors=True)

    report = {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0], "width": args.width, "repeats": args.repeats, "writers": args.writers,
        "warm_up_seconds": compile_seconds, "median_seconds": medians,
        "eager_capture_ratio": medians["eager capture"] / medians["eager forward"],
        "compiled_capture_ratio": medians["compiled capture"] / medians["compiled forward"],
        "compiled_capture_over_floor": medians["compiled capture"] / (medians["compiled forward"]
                                                                      + medians["write floor"]),
        "write_floor_over_compiled_forward": medians["write floor"] / medians["compiled forward"],
        "written": written, "outputs": outputs,
    }
    writers = "the capture's default" if args.writers is None else args.writers
    print(f"torch {report['torch']}, {report['threads']} threads, {report['cpus']} CPUs, "
          f"load {report['load_average']:.1f}; width {args.width}; writers {writers}; medians of {args.repeats} rounds")
    for name in names:
        files = written.get(name)
        wrote = f"; {files['files']} payloads, {files['bytes'] / 1e6:.1f} MB" if files else ""
        print(f"  {name:17s} {medians[name] * 1e3:9.1f} ms   (warm-up {compile_seconds[name]:.1f} s{wrote})")
    print(f"  eager capture / eager forward       {report['eager_capture_ratio']:.2f}")
    print(f"  compiled capture / compiled forward {report['compiled_capture_ratio']:.2f}")
    print(f"  compiled capture / (compiled forward + write floor) {report['compiled_capture_over_floor']:.2f}; "
          f"the write floor alone is {report['write_floor_over_compiled_forward']:.2f}x the compiled forward")
    for out in outputs:
        print(f"  {out['dtype']}: captured compiled vs uncaptured compiled: "
              f"{'bit-identical' if out['bit_identical'] else 'differs'} "
              f"(max |diff| {out['max_abs_diff_vs_uncaptured_compiled']:.3g}; compiled vs eager "
              f"{out['max_abs_diff_uncaptured_compiled_vs_eager']:.3g}); graphs {out['graphs']}, "
              f"breaks {out['graph_breaks']}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
