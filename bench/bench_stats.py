"""The statistics every runtime but torch records per tensor (``numpy_stats``: the C build's one pass), in GB/s.

    python bench/bench_stats.py [--repeats 9]
    PYTHONPATH=/path/to/another/version python bench/bench_stats.py   # the same figures for that version

For float32 tensors of the sizes a capture meets (a llama.cpp node of a 1024-wide model: 0.5 to 1.5 MB; a
logits tensor: 8 MB; one that no cache holds: 64 MB), random normal values with every seventh one zero:
the median over ``--repeats`` rounds of ``numpy_stats`` (the whole call, as a capture makes it) and of the
compiled pass alone, each time over the same tensor (so that the small ones are read from the cache, as a
node just computed is), and numpy's ``sum`` of the same bytes as a yardstick of one pass. The version
measured is the ``tracediff`` Python imports (``PYTHONPATH`` picks it: this script adds no path). Nothing
here asserts.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

SIZES_MB = (0.5, 1.5, 8.0, 64.0)


def median_seconds(run: Callable[[], object], repeats: int, inner: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            run()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)

    import tracediff
    from tracediff.capturing.stats import CHUNK, _compiled_stats, numpy_stats

    compiled = _compiled_stats()
    print(f"tracediff {tracediff.__version__} ({tracediff.__file__}); compiled statistics: "
          f"{'loaded' if compiled is not None else 'not available (numpy path)'}")
    print(f"{'MB':>6} {'numpy_stats GB/s':>17} {'compiled pass GB/s':>19} {'np.sum GB/s':>12}")
    rng = np.random.default_rng(0)
    for mb in SIZES_MB:
        values = rng.standard_normal(int(mb * 1e6) // 4, dtype=np.float32)
        values[::7] = 0.0
        tensor = torch.from_numpy(values)
        inner = max(1, int(200 / mb))
        whole = median_seconds(functools.partial(numpy_stats, tensor), args.repeats, inner)
        alone = median_seconds(functools.partial(compiled.stats, values, CHUNK), args.repeats, inner) \
            if compiled is not None else None
        summed = median_seconds(values.sum, args.repeats, inner)
        gb = values.nbytes / 1e9
        print(f"{mb:>6} {gb / whole:>17.2f} {gb / alone if alone else float('nan'):>19.2f} {gb / summed:>12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
