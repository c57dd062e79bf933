"""SIGTERM and SIGHUP during a capture: end the forward as Ctrl-C does, so the partial trace is written.

Without this, ``kill`` or a closed terminal ends the process at once and the
trace JSON is never written (only the journal is left). With it, the signal
raises :class:`CaptureTerminated` (a ``KeyboardInterrupt``, so a model's
``except Exception`` does not swallow it) at the point the forward has
reached; the capture writes the trace so far, marked incomplete, and the
exception propagates. ``tracediff capture`` then exits ``128 + signal``.

Handlers are installed only in the main thread and only for signals still at
their default action: a handler the user set up is left alone.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class CaptureTerminated(KeyboardInterrupt):
    """The capture process received SIGTERM or SIGHUP; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


def _raise(signum: int, _frame: Any) -> None:
    raise CaptureTerminated(signum)


@contextmanager
def termination_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise ``CaptureTerminated`` (see the module docstring)."""
    installed: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _SIGNALS:
            try:
                if signal.getsignal(signum) is signal.SIG_DFL:
                    installed[signum] = signal.signal(signum, _raise)
            except (OSError, ValueError):
                continue
    try:
        yield
    finally:
        for signum, previous in installed.items():
            try:
                signal.signal(signum, previous)
            except (OSError, ValueError):
                pass
