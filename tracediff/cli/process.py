"""The speed tricks of the ``tracediff`` command, in one place: each changes the state of the process.

The library never uses them: ``tracediff.align(...)`` called from a notebook
leaves the garbage collector and the interpreter as it found them. A command
may, because the process is its own:

* :func:`paused_gc`: reading a trace allocates millions of containers and frees
  almost none, and aligning one builds a row per tensor: each collection would
  rescan them all for nothing (a 200 MB trace spent about half of ``tracediff
  show``'s time in collections). Reference counting still frees everything as
  usual; the collector's state is restored on exit, even when the block raises.
* :func:`stop_cyclic_gc` and :func:`leave`: a command that runs none of the
  user's code (``show``, ``align``, ``steps``, ``plot``), started as the
  ``tracediff`` program, runs with the collector off and ends without the
  interpreter's teardown.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn


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


def stop_cyclic_gc() -> None:
    """Turn the cyclic collector off for the rest of the process.

    Re-enabled after a large trace is read, it rescans every node and record
    once, about a second for a 200 MB trace, to free nothing the end of the
    process would not.
    """
    gc.disable()


def leave(code: int) -> NoReturn:
    """Exit with ``code``, skipping the interpreter's teardown when nothing else is running.

    At exit Python frees every object one by one: seconds for the two traces
    and the rows of a large alignment, for memory the operating system takes
    back at once. So output is flushed and the process ends with ``os._exit``.
    Only commands that run none of the user's code do this (``show``,
    ``align``, ``steps``, ``plot``), so no ``atexit`` handler of a user's
    module is skipped. When another thread is still running, or a flush fails
    (a closed pipe), Python exits the usual way, which waits for the thread
    or reports the failure as it always did.
    """
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    if threading.active_count() > 1:
        sys.exit(code)
    os._exit(code)
