"""Where a llama.cpp capture's time goes, per graph node: each part of the eval callback timed in place.

    python bench/llama_node_costs.py [--size large] [--tensors summary|full] [--repeats 7]

The model of ``bench/bench_llama_capture.py`` (``--size``, made once into its ``--cache``). Each round runs the
plain decode, then a capture of it; the parts of the capture named below are wrapped with a timer (which adds
about a microsecond to each call), so the figures say where the time goes, not what a capture costs without
them (``bench_llama_capture.py`` says that). Printed: the medians of the plain decode and the capture, and
for each part its mean time per capture and per call:

- ``_record``: the whole eval callback after a node is computed (everything below but ``_finish``);
- ``view`` and ``read_data``: the node's struct and data read through ctypes;
- ``numpy_stats``: the node's statistics, of which ``compiled pass`` is the C build's one pass;
- ``encode``: the node's tensor entry (statistics, payload written or not);
- ``journal enter`` / ``journal exit``: the crash journal's lines (JSON encoded, one write each);
- ``_finish``: the trace files written when the capture ends.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llama_capture import SIZES, build  # noqa: E402  (bench/, the script's own folder)

TOTALS: dict[str, list[float]] = {}  # part -> [seconds, calls] over the timed captures


def timed(owner: Any, attribute: str, label: str) -> None:
    """Wrap ``owner.attribute`` so that its calls add to ``TOTALS[label]``."""
    original: Callable[..., Any] = getattr(owner, attribute)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            total = TOTALS.setdefault(label, [0.0, 0])
            total[0] += time.perf_counter() - start
            total[1] += 1

    setattr(owner, attribute, wrapper)


def install_timers() -> None:
    from tracediff.capturing import encode, journal, session, stats
    from tracediff.capturing.adapters import ggml_tensor, llama_cpp
    from tracediff.native import fused_c

    timed(llama_cpp.GraphRecording, "_record", "_record")
    timed(ggml_tensor, "view", "view")
    timed(ggml_tensor, "read_data", "read_data")
    timed(stats, "numpy_stats", "numpy_stats")
    timed(fused_c._Pass, "stats", "compiled pass")
    timed(encode.Encoder, "encode", "encode")
    timed(journal.Journal, "entered", "journal enter")
    timed(journal.Journal, "finished", "journal exit")
    timed(session, "_finish", "_finish")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="large")
    parser.add_argument("--tensors", choices=("summary", "full"), default="summary")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "tracediff-bench-llama")
    parser.add_argument("--out-root", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args(argv)
    import llama_cpp

    import tracediff

    gguf = build(args.cache, args.size)
    tokens = [3 + (7 * i) % 97 for i in range(128 if args.size == "large" else 64)]
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=2 * len(tokens), logits_all=True, verbose=False,
                          type_k=0, type_v=0)
    install_timers()

    def plain() -> None:
        llm.reset()
        llm.eval(tokens)

    def captured() -> None:
        out = Path(tempfile.mkdtemp(dir=args.out_root)) / "trace"
        try:
            with tracediff.capture(llm, out, tensors=args.tensors):
                llm.eval(tokens)
        finally:
            shutil.rmtree(out.parent)

    plain()
    captured()
    TOTALS.clear()
    plains, captures = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        plain()
        plains.append(time.perf_counter() - start)
        start = time.perf_counter()
        captured()
        captures.append(time.perf_counter() - start)
    plain_s, capture_s = statistics.median(plains), statistics.median(captures)
    nodes = TOTALS.get("_record", [0.0, 0])[1] / args.repeats
    print(f"llama-cpp-python {llama_cpp.__version__}, --size {args.size}, tensors={args.tensors}, "
          f"{args.repeats} rounds, {nodes:.0f} nodes per capture")
    print(f"plain decode {plain_s * 1e3:.1f} ms; capture {capture_s * 1e3:.1f} ms ({capture_s / plain_s:.2f}x), "
          f"{(capture_s - plain_s) / max(nodes, 1) * 1e6:.0f} us per node beyond the plain decode")
    print(f"{'part':16} {'ms per capture':>15} {'calls':>7} {'us per call':>12}")
    for label, (seconds, calls) in TOTALS.items():
        print(f"{label:16} {seconds / args.repeats * 1e3:15.2f} {calls / args.repeats:7.0f} "
              f"{seconds / max(calls, 1) * 1e6:12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
