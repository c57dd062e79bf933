"""Timing configurations interleaved, the order rotated each round, so that drift on a shared machine falls on
every configuration alike."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping


def rotated_medians(runs: Mapping[str, Callable[[], object]], repeats: int
                    ) -> tuple[dict[str, float], dict[str, list[float]], float]:
    """One warm-up of each run, then ``repeats`` rounds: the median wall time of each run (s), every time, and the
    load average before the timing."""
    names = list(runs)
    for name in names:
        runs[name]()
    load = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}, times, load
