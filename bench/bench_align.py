"""Throughput and memory of ``tracediff.align`` on traces written by transformers' debugger.

    python bench/bench_align.py                   # throughput on ~600 MB traces
    python bench/bench_align.py --memory          # also peak RSS for ~100 MB and ~1 GB traces
    python bench/bench_align.py --cli             # also `tracediff align` end to end, one process per run

Traces come from a Llama-shaped ``LlamaModel`` (hidden 512, intermediate 1536,
8 layers, 8 heads, 4 KV heads, vocab 8000) run through
``transformers.model_addition_debugger_context(use_repr=False,
do_prune_layers=False)``. For each size four traces are written: ``ref``,
``same`` (a second capture of the same model: bit-identical payloads in other
files), ``port`` (every weight perturbed by 1e-4 noise, so every tensor
after the embedding differs: a port) and ``last`` (only the last decoder
layer perturbed: every tensor before it identical). Each pair's row shows the
throughput of one numpy pass over the same payload pairs beside it (``a - b``
chunk by chunk, two threads: what reading the bytes costs at least) and the
ratio of the two. Large pairs are compared by the compiled one-pass kernel: its
C build where a C compiler is found (built on first use, cached), else numba's
(``tracediff[fast]``); ``TRACEDIFF_KERNEL=numba`` or ``=numpy`` times that path
instead. The page cache is warmed by reading every file
once, then ``align`` runs ``--repeats`` times per pair; throughput is the
bytes of both traces' payloads over the median time. Peak RSS is measured in
a fresh process per size, next to the RSS of that process before aligning.

``--device cuda --dtype bfloat16`` writes the three traces from a model on that
device in that dtype (a GPU-made pair; the alignment itself always runs on the
host), into folders of their own; ``--capture tracediff`` writes them with
``tracediff.capture`` instead of transformers' debugger.

``--comparison`` times the comparison alone: every payload pair of ``ref`` and
``port`` (a transformers trace pairs by recorded order) through
``compare_payloads`` on two threads, as ``align`` runs it, with the sequence
dimension given so that positions are found in the pass (issue 34); nothing
else of ``align`` (loading, pairing, rows) is in that figure.

``--cli`` times the whole command, ``tracediff align REF OTHER``, in a fresh
process per run (start-up, imports, reading, comparing, rendering), next to
``tracediff align --help`` (start-up alone), with each process's peak RSS (the
port pair also under ``TRACEDIFF_KERNEL=numba`` and ``=numpy``, beside it), and
``--demo`` the same for the two small traces of ``tracediff demo`` (written
into the work folder once). The child processes run in an empty folder, so
the ``tracediff`` they import is the one on ``PYTHONPATH`` (to time another
version side by side: ``PYTHONPATH=/path/to/old python bench/bench_align.py``),
and with bytecode caching on, as after an install (``PYTHONDONTWRITEBYTECODE``
is dropped from their environment: compiling tracediff anew costs ~80 ms a run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MB_PER_TOKEN = 0.545  # payload MB per token of sequence for this model in float32, measured
BUILD = {"device": "cpu", "dtype": "float32", "capture": "transformers"}  # how the traces are written


def build_traces(folder: Path, seq: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaModel, model_addition_debugger_context

    config = LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=8000, max_position_embeddings=max(4096, seq))
    torch.manual_seed(0)
    model = LlamaModel(config).eval().to(BUILD["device"], getattr(torch, BUILD["dtype"]))
    ids = torch.randint(0, config.vocab_size, (1, seq)).to(BUILD["device"])
    for name in ("ref", "same", "port"):
        if name == "port":
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 1e-4)
        out = folder / name
        shutil.rmtree(out, ignore_errors=True)
        if BUILD["capture"] == "tracediff":
            import tracediff

            context = tracediff.capture(model, out)
        else:
            context = model_addition_debugger_context(model, debug_path=str(out), use_repr=False,
                                                      do_prune_layers=False)
        with torch.no_grad(), context:
            model(ids)


def build_last(folder: Path, seq: int) -> None:
    """``last``: the model of ``ref`` with only its last decoder layer perturbed (1e-4 noise), so that every
    tensor before it is identical and every one after it differs (the "only the last layer changed" case)."""
    import torch
    from transformers import LlamaConfig, LlamaModel, model_addition_debugger_context

    config = LlamaConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=8000, max_position_embeddings=max(4096, seq))
    torch.manual_seed(0)
    model = LlamaModel(config).eval().to(BUILD["device"], getattr(torch, BUILD["dtype"]))
    ids = torch.randint(0, config.vocab_size, (1, seq)).to(BUILD["device"])
    with torch.no_grad():
        for p in model.layers[-1].parameters():
            p.add_(torch.randn_like(p) * 1e-4)
    out = folder / "last"
    shutil.rmtree(out, ignore_errors=True)
    if BUILD["capture"] == "tracediff":
        import tracediff

        context = tracediff.capture(model, out)
    else:
        context = model_addition_debugger_context(model, debug_path=str(out), use_repr=False, do_prune_layers=False)
    with torch.no_grad(), context:
        model(ids)


def payload_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def warm(folder: Path) -> None:
    for f in folder.iterdir():
        with open(f, "rb") as handle:
            while handle.read(1 << 24):
                pass


def time_align(a: Path, b: Path, repeats: int) -> tuple[float, float, bool]:
    """Median wall seconds and median CPU seconds (all threads) of ``align(a, b)`` in this process."""
    import tracediff

    tracediff.align(a, b)  # warm-up
    times, cpu, passed = [], [], True
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        passed = tracediff.align(a, b).passed
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(times), statistics.median(cpu), passed


def fast_path(ref: Path, same: Path, repeats: int) -> None:
    """Wall and CPU seconds to find every payload of ``ref`` and ``same`` equal: raw bytes vs decoding."""
    try:
        from tracediff.compare.metrics import bitwise_equal
        from tracediff.compare.raw_payload import same_bytes
    except ImportError:  # the package layout of tracediff 0.2, for before/after runs
        from tracediff.alignment.metrics import bitwise_equal  # type: ignore[no-redef]
        from tracediff.alignment.raw_payload import same_bytes  # type: ignore[no-redef]

    try:  # decoded with numpy since issue 23; into torch tensors before
        from tracediff.trace.payload import read_payload

        def decode(path: Path) -> object:
            return read_payload(path, root=path.parent)
    except ImportError:
        from tracediff._io import read_tensor_file as decode  # type: ignore[assignment,no-redef]

    names = sorted(p.name for p in ref.glob("*.safetensors"))
    total = sum((ref / n).stat().st_size + (same / n).stat().st_size for n in names)
    ways = {
        "raw bytes (same_bytes)": lambda: all(same_bytes(ref / n, same / n) is not None for n in names),
        "decode + bitwise_equal": lambda: all(bitwise_equal(decode(ref / n), decode(same / n)) for n in names),
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for round_index in range(repeats + 1):  # interleaved; the first round warms up
        for name, way in ways.items():
            wall, cpu = time.perf_counter(), time.process_time()
            assert way()
            if round_index:
                runs[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    print(f"\nidentical pair, one thread, {total / 1e6:.0f} MB, median of {repeats}:")
    for name, measured in runs.items():
        wall = statistics.median(r[0] for r in measured)
        cpu = statistics.median(r[1] for r in measured)
        print(f"  {name:<24} wall {wall:.3f} s ({total / wall / 1e9:.2f} GB/s), CPU {cpu:.3f} s "
              f"({total / cpu / 1e9:.2f} GB per CPU second)")


def time_comparison(ref: Path, other: Path, repeats: int, floor: bool = False) -> tuple[float, float]:
    """Median wall and CPU seconds of comparing every payload pair of ``ref`` and ``other`` on two threads;
    ``floor``: of one numpy pass instead (``a - b`` chunk by chunk into a reused array), what a kernel fusing
    every metric into one pass over the bytes would cost at least."""
    from concurrent.futures import ThreadPoolExecutor

    import tracediff
    from tracediff.compare.payloads import compare_payloads

    a, b = tracediff.load_trace(ref), tracediff.load_trace(other)
    pairs = [(ra, rb) for (_, ra), (_, rb) in zip(a.records(), b.records()) if ra.has_payload and rb.has_payload]

    def one_pass(pair: tuple[object, object]) -> object:
        import numpy as np

        pa, pb = a.load_payload(pair[0]), b.load_payload(pair[1])  # type: ignore[arg-type]
        fa, fb = pa.values.reshape(-1), pb.values.reshape(-1)
        chunk = 1 << 18
        out = np.empty(min(fa.size, chunk), fa.dtype)
        for start in range(0, fa.size, chunk):
            stop = min(start + chunk, fa.size)
            np.subtract(fa[start:stop], fb[start:stop], out=out[:stop - start])
        return None

    def one(pair: tuple[object, object]) -> object:
        ra, rb = pair
        along = 1 if len(rb.shape or ()) == 3 else None  # type: ignore[attr-defined]
        try:
            return compare_payloads(a, ra, b, rb, atol=1e-5, rtol=1.3e-6, along=along)  # type: ignore[arg-type]
        except TypeError:  # before issue 34: no positions in the pass
            return compare_payloads(a, ra, b, rb, atol=1e-5, rtol=1.3e-6)  # type: ignore[arg-type]

    work = one_pass if floor else one
    times, cpu = [], []
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(work, pairs))  # warm-up
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            list(pool.map(work, pairs))
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return statistics.median(times), statistics.median(cpu)


def comparison_kernel() -> str:
    """Which comparison runs on large pairs: the compiled one-pass kernel (its C or numba build) or numpy."""
    try:
        from tracediff.compare import kernel
    except ImportError:
        return "numpy (this tracediff has no compiled kernel)"
    if not kernel.enabled() or kernel.load() is None:
        return f"numpy ({kernel.VARIABLE}=numpy, or neither a C compiler nor numba)"
    loaded = kernel.load()
    if type(loaded).__module__.endswith("fused_c"):
        return f"compiled one-pass kernel (C build) for pairs of {kernel.MIN_ELEMENTS}+ elements"
    import numba  # type: ignore[import-untyped]

    return f"compiled one-pass kernel (numba {numba.__version__}) for pairs of {kernel.MIN_ELEMENTS}+ elements"


def time_cli(argv: list[str], repeats: int, kernel: str | None = None) -> tuple[float, float, int]:
    """Median seconds and the largest peak RSS (MB) of ``argv`` run as a fresh process, and its exit code
    (``CLI_CPU[-1]`` then holds the median CPU seconds, user and system, of those runs); ``kernel``: the
    comparison's ``TRACEDIFF_KERNEL`` for the runs."""
    # The peak RSS comes from GNU time: a child forked from this (large) process would report this
    # process's RSS, which Linux carries across exec into the child's high-water mark.
    timer = shutil.which("time") or "/usr/bin/time"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if kernel is not None:
        env["TRACEDIFF_KERNEL"] = kernel
    times, peaks, cpu, code = [], [], [], 0
    with tempfile.TemporaryDirectory() as empty:  # no ./tracediff shadows the one on PYTHONPATH
        for _ in range(repeats + 1):  # the first run warms the page cache and writes the bytecode
            start = time.perf_counter()
            done = subprocess.run([timer, "-f", "%M %U %S", *argv], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, cwd=empty, env=env)
            times.append(time.perf_counter() - start)
            peak, user, system = done.stderr.strip().splitlines()[-1].split()
            peaks.append(int(peak) / 1024)
            cpu.append(float(user) + float(system))
            code = done.returncode
    CLI_CPU.append(statistics.median(cpu[1:]))
    return statistics.median(times[1:]), max(peaks[1:]), code


CLI_CPU: list[float] = []  # the median CPU seconds of each time_cli call, in order


def peak_rss_child(a: str, b: str) -> None:
    """RSS after importing tracediff, and the peak during ``align(a, b)``.

    The kernel's high-water mark is reset first (``/proc/self/clear_refs``): a child inherits the
    ru_maxrss of the process that forked it, which here is the benchmark itself.
    """
    import tracediff  # the baseline: the process before aligning

    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmHWM")
    tracediff.align(a, b)
    print(json.dumps({"baseline_mb": before / 1024, "peak_mb": _status_kib("VmHWM") / 1024}))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def ensure(folder: Path, target_mb: int) -> Path:
    import torch

    element = getattr(torch, BUILD["dtype"]).itemsize
    seq = max(16, round(target_mb / (MB_PER_TOKEN * element / 4)))
    made = "".join(f"-{BUILD[key]}" for key, plain in (("device", "cpu"), ("dtype", "float32"),
                                                        ("capture", "transformers")) if BUILD[key] != plain)
    here = folder / f"seq{seq}{made}"
    if not all((here / n).is_dir() and any((here / n).glob("*.json")) for n in ("ref", "same", "port")):
        print(f"writing traces with seq={seq} into {here} ...", file=sys.stderr)
        here.mkdir(parents=True, exist_ok=True)
        build_traces(here, seq)
    if not ((here / "last").is_dir() and any((here / "last").glob("*.json"))):
        print(f"writing the last-layer trace with seq={seq} into {here} ...", file=sys.stderr)
        build_last(here, seq)
    return here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/tracediff-bench-align", help="where traces are written and kept")
    parser.add_argument("--size-mb", type=int, default=600, help="target payload size of one trace (MB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="also measure peak RSS at ~100 MB and ~1 GB")
    parser.add_argument("--cli", action="store_true", help="also time `tracediff align` end to end")
    parser.add_argument("--demo", action="store_true",
                        help="also time `tracediff align` on the two small traces of `tracediff demo`")
    parser.add_argument("--fast-path", action="store_true",
                        help="also time finding identical payloads from raw bytes vs by decoding them")
    parser.add_argument("--comparison", action="store_true",
                        help="also time the comparison of every payload pair alone (two threads)")
    parser.add_argument("--device", default="cpu", help="where the traces are written: cpu (default), cuda")
    parser.add_argument("--dtype", default="float32", help="model dtype of the traces: float32 (default), bfloat16")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--capture", choices=("transformers", "tracediff"), default="transformers",
                        help="what writes the traces: transformers' debugger (default) or tracediff.capture")
    args = parser.parse_args()
    BUILD.update(device=args.device, dtype=args.dtype, capture=args.capture)
    if args.child:
        peak_rss_child(*args.child)
        return

    import torch

    work = Path(args.work)
    here = ensure(work, args.size_mb)
    for name in ("ref", "same", "port"):
        warm(here / name)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    print(f"kernel: {comparison_kernel()}")  # loaded now: the in-process figures are those of a warm kernel
    print("align in this process (GB/s), next to one numpy pass over the same payload pairs (a - b chunk by chunk")
    print("into a reused array, two threads: the floor any comparison pays to read the bytes):")
    print(f"{'pair':<12}{'MB (A+B)':>10}{'median s':>10}{'GB/s':>8}{'CPU s':>8}{'numpy pass GB/s':>17}"
          f"{'ratio':>7}  passed")
    for pair in ("same", "port", "last"):
        total = payload_bytes(here / "ref") + payload_bytes(here / pair)
        seconds, cpu, passed = time_align(here / "ref", here / pair, args.repeats)
        floor, _ = time_comparison(here / "ref", here / pair, args.repeats, floor=True)
        print(f"{'ref~' + pair:<12}{total / 1e6:>10.0f}{seconds:>10.3f}{total / seconds / 1e9:>8.2f}{cpu:>8.3f}"
              f"{total / floor / 1e9:>17.2f}{floor / seconds:>7.2f}  {passed}")

    if args.fast_path:
        fast_path(here / "ref", here / "same", args.repeats)

    if args.comparison:
        total = payload_bytes(here / "ref") + payload_bytes(here / "port")
        seconds, cpu = time_comparison(here / "ref", here / "port", args.repeats)
        print(f"\ncomparison alone, ref~port, two threads, median of {args.repeats}: {seconds:.3f} s "
              f"({total / seconds / 1e9:.2f} GB/s), CPU {cpu:.3f} s ({total / cpu / 1e9:.2f} GB per CPU second)")
        seconds, cpu = time_comparison(here / "ref", here / "port", args.repeats, floor=True)
        print(f"one numpy pass (a - b) over the same pairs, two threads: {seconds:.3f} s "
              f"({total / seconds / 1e9:.2f} GB/s), CPU {cpu:.3f} s ({total / cpu / 1e9:.2f} GB per CPU second)")

    if args.cli:
        tool = [sys.executable, "-m", "tracediff"]
        print(f"\nend to end, one process per run ({' '.join(tool)} ...), median of {args.repeats}:")
        print(f"{'command':<28}{'MB (A+B)':>10}{'median s':>10}{'GB/s':>8}{'peak RSS MB':>13}  exit")
        seconds, peak, code = time_cli(tool + ["align", "--help"], args.repeats)
        print(f"{'align --help (start-up)':<28}{'':>10}{seconds:>10.3f}{'':>8}{peak:>13.0f}  {code}"
              f"  CPU {CLI_CPU[-1]:.3f} s")
        runs = [(pair, None) for pair in ("same", "port", "last")]
        runs += [("port", build) for build in ("numba", "numpy")]  # the port pair on the other paths, beside it
        for pair, build in runs:
            total = payload_bytes(here / "ref") + payload_bytes(here / pair)
            seconds, peak, code = time_cli(tool + ["align", str(here / "ref"), str(here / pair)], args.repeats,
                                           build)
            name = f"align ref {pair}" + (f" ({build})" if build else "")
            print(f"{name:<28}{total / 1e6:>10.0f}{seconds:>10.3f}{total / seconds / 1e9:>8.2f}"
                  f"{peak:>13.0f}  {code}  CPU {CLI_CPU[-1]:.3f} s")

    if args.demo:
        demo = work / "demo"
        if not (demo / "rename.json").exists():
            subprocess.run([sys.executable, "-m", "tracediff", "demo", "--out", str(demo), "--overwrite"],
                           stdout=subprocess.DEVNULL, check=True)
        argv = [sys.executable, "-m", "tracediff", "align", str(demo / "reference"), str(demo / "port"),
                "--map", str(demo / "rename.json")]
        numpy_floor = [sys.executable, "-c", "import numpy"]
        runs: dict[str, list[tuple[float, float]]] = {"align": [], "numpy": []}
        for _ in range(args.repeats):  # alternating, so that a busy spell hits both
            for name, command in (("align", argv), ("numpy", numpy_floor)):
                seconds, peak, code = time_cli(command, 1)
                runs[name].append((seconds, CLI_CPU[-1]))
        align_s, align_cpu = (statistics.median(r[i] for r in runs["align"]) for i in (0, 1))
        numpy_s, numpy_cpu = (statistics.median(r[i] for r in runs["numpy"]) for i in (0, 1))
        seconds, peak, code = time_cli(argv, 1)
        print(f"\ndemo traces, `tracediff align reference port --map rename.json`, one process per run, median of "
              f"{args.repeats}: {align_s:.3f} s ({align_cpu:.3f} CPU s), peak RSS {peak:.0f} MB, exit {code}; "
              f"`python -c 'import numpy'` alternating with it: {numpy_s:.3f} s ({numpy_cpu:.3f} CPU s): "
              f"{align_s - numpy_s:+.3f} s above it ({align_cpu - numpy_cpu:+.3f} CPU s)")

    if args.memory:
        print(f"\n{'trace MB':>9}{'baseline RSS MB':>17}{'peak RSS MB':>13}")
        for target in (100, 1000):
            folder = ensure(work, target)
            with tempfile.TemporaryDirectory() as empty:  # PYTHONPATH picks the version, as for --cli
                out = subprocess.run([sys.executable, __file__, "--child", str(folder / "ref"), str(folder / "port")],
                                     capture_output=True, text=True, check=True, cwd=empty)
            rss = json.loads(out.stdout.strip().splitlines()[-1])
            size = payload_bytes(folder / "ref") / 1e6
            print(f"{size:>9.0f}{rss['baseline_mb']:>17.0f}{rss['peak_mb']:>13.0f}")


if __name__ == "__main__":
    main()
