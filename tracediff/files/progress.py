"""The progress bars of long commands: on stderr, only when it is a terminal, gone when done.

``capture``, ``align`` and ``replay`` take ``progress=True`` (``--progress``); each asks for its bar here, so
every bar looks and behaves the same: drawn by ``tqdm`` on stderr, never written into a redirected file or a
notebook's log, and cleared on ``close()`` (``leave=False``). ``tqdm`` is imported only when a bar is drawn.

Example::

    bar = progress_bar(progress, desc="replay", unit=" calls", total=len(pairs))
    with bar:
        for pair in pairs:
            ...
            bar.update(1)
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, Protocol

__all__ = ["ProgressBar", "progress_bar"]


class ProgressBar(Protocol):
    """What a command does with its bar."""

    def update(self, n: float = 1) -> Any: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> Any: ...


class _NoBar:
    """The bar when none is drawn: every call does nothing."""

    def update(self, n: float = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        pass


def progress_bar(enabled: bool, *, desc: str, unit: str, total: float | None = None,
                 unit_scale: bool = False) -> ProgressBar:
    """A ``tqdm`` bar on stderr when ``enabled`` and stderr is a terminal; otherwise a bar that draws nothing.

    ``desc`` names the command (``"replay"``), ``unit`` what is counted (``" calls"``, ``"B"`` with
    ``unit_scale=True`` for bytes), ``total`` how many there will be (None: a counter without an end).
    """
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    bar: ProgressBar = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=sys.stderr, leave=False)
    return bar
