"""Pausing Python's cyclic garbage collector while a large trace is read or aligned.

Reading a trace allocates millions of containers and frees almost none, and
aligning one builds a row per tensor: each collection would rescan them all
for nothing (a 200 MB trace spent about half of ``tracediff show``'s time in
collections). Reference counting still frees everything as usual; the
collector's state is restored on exit, even when the block raises.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector inside the block, if it was enabled (nesting is fine).

    ``@paused_gc()`` also decorates a function: each call runs with the collector paused.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
