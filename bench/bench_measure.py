"""The comparison kernel on one float32 pair that differs everywhere: with and without ``pcc``.

    OMP_NUM_THREADS=1 python bench/bench_measure.py [--elements 16777216] [--repeat 9]

Prints the best and median CPU seconds of ``compare_tensors`` (the metrics) and of ``measure_tensors`` (the
metrics and ``pcc``, as ``align`` takes them) over ``--repeat`` runs. CPU time, not wall time: a busy machine
stretches the latter.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tracediff.compare.metrics import compare_tensors, measure_tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1 << 24)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    a = rng.standard_normal(args.elements, dtype=np.float32)
    b = (a + rng.standard_normal(args.elements, dtype=np.float32) * 1e-3).astype(np.float32)
    for fn in (compare_tensors, measure_tensors):
        times = []
        for _ in range(args.repeat):
            start = time.process_time()
            fn(a, b, atol=1e-5, rtol=1e-5)
            times.append(time.process_time() - start)
        times.sort()
        print(f"{fn.__name__}: best {times[0]:.3f} s, median {times[len(times) // 2]:.3f} s CPU "
              f"({a.nbytes * 2 / 1e6:.0f} MB pair)")


if __name__ == "__main__":
    main()
