"""The order of floating-point work, and the switch that changes it: ``TRACEDIFF_REORDER``.

Float sums depend on their order. Which order a comparison takes depends on things outside the data: how
long a chunk is, how many threads share the pairs, in which order partial states are merged (one per rank
under ``align --distributed``), and how the CPU's SIMD kernels group the terms (AVX2, AVX-512 and AMX group
them differently). A test that compares two computations made in different orders holds on every CPU only
if its bound covers any order. ``TRACEDIFF_REORDER=1`` makes that visible on any machine: the kernels that
ask this module take chunks of an odd length 2048 times shorter, compare pairs on a pool of three threads
whatever the size of the trace, and merge partial states in reverse order. Every result must stay within
the rounding bound its tests derive; a test that fails only under the switch depends on the order.

The variable is read once, on first use. It is meant for test runs (``docs/compatibility.md``); a library
user never needs it: results under it differ only by rounding, and large comparisons are slower.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import TypeVar

VARIABLE = "TRACEDIFF_REORDER"
# chunks under the switch: 2048 times shorter, so that a test's small tensors (a few thousand elements) span many;
# of odd length, so that no chunk starts on a power-of-two boundary
_SHORTER = 2048
_THREADS = 3  # worker threads under the switch: neither one nor a usual core count

T = TypeVar("T")


@functools.cache
def reordered() -> bool:
    """True when ``TRACEDIFF_REORDER`` is set to anything but empty or ``0``."""
    return os.environ.get(VARIABLE, "") not in ("", "0")


def chunk_size(default: int) -> int:
    """Elements per chunk: ``default``, or under the switch an odd length near ``default / 2048``, at least 3
    (127 for the comparison's 2**18, 511 for the statistics' 2**20)."""
    if not reordered() or default <= 3:
        return default
    small = max(3, default // _SHORTER)
    return small - 1 if small % 2 == 0 else small


def merge_order(parts: Sequence[T]) -> list[T]:
    """Partial states in the order to merge them: as given, or reversed under the switch."""
    return list(reversed(parts)) if reordered() else list(parts)


def worker_threads(default: int) -> int:
    """Threads that compare tensor pairs side by side: ``default``, or 3 under the switch."""
    return _THREADS if reordered() else default
