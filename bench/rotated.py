"""Timing configurations interleaved, the order rotated each round, so that drift on a shared machine falls on
every configuration alike."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path


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


def write_floor(sizes: list[int], out_root: Path) -> Callable[[], None]:
    """Write files of ``sizes`` bytes to a fresh folder, as the payload writer would."""
    blobs = [os.urandom(min(size, 1 << 16)) * (size // (1 << 16) + 1) for size in sizes]
    blobs = [blob[:size] for blob, size in zip(blobs, sizes)]

    def run() -> None:
        out = Path(tempfile.mkdtemp(dir=out_root))
        try:
            for index, blob in enumerate(blobs):
                with open(out / f"{index}.safetensors", "wb") as f:
                    f.write(blob)
        finally:
            shutil.rmtree(out)
    return run


def payload_sizes(folder: Path) -> list[int]:
    """The sizes of the payload files a capture wrote into ``folder``."""
    from tracediff import format as fmt

    return [path.stat().st_size for path in folder.glob(f"*{fmt.PAYLOAD_SUFFIX}")]
