"""The recorder's options, checked before anything is written."""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from ..errors import UsageError
from .stat_names import NUMERIC_STATS, STAT_NAMES

GROUPS = ("rngs", "batch", "params", "buffers", "grads", "optimizer")
"""Every group a record can hold, in causal order (the order the comparison walks them)."""


def _unknown(kind: str, names: Iterable[str], known: tuple[str, ...]) -> UsageError | None:
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return UsageError(f"{kind}: unknown name {name!r} (expected some of {', '.join(known)}){hint}")
    return None


def checked_groups(checksums: Collection[str] | str) -> tuple[str, ...]:
    """The groups to record, in causal order. A bare string is refused (``{"params"}``, not ``"params"``)."""
    if isinstance(checksums, str):
        raise UsageError(f"checksums={checksums!r}: expected a collection of group names, e.g. {{{checksums!r}}}")
    error = _unknown("checksums", checksums, GROUPS)
    if error:
        raise error
    return tuple(g for g in GROUPS if g in checksums)


def checked_stats(stats: Collection[str] | str | None) -> tuple[str, ...]:
    """The numeric statistics to record, in ``NUMERIC_STATS`` order; ``"all"`` means every one."""
    if stats is None:
        return ()
    if stats == "all":
        return NUMERIC_STATS
    if isinstance(stats, str):
        raise UsageError(f"stats={stats!r}: expected \"all\", None or a collection of statistic names")
    error = _unknown("stats", stats, STAT_NAMES)
    if error:
        raise error
    return tuple(s for s in NUMERIC_STATS if s in stats)


@dataclass(frozen=True)
class Schedule:
    """Which steps are recorded: every ``every``-th step from 0, or exactly ``steps``."""

    every: int | None
    steps: frozenset[int] | None

    def __contains__(self, step: object) -> bool:
        if not isinstance(step, int):
            return False
        if self.steps is not None:
            return step in self.steps
        return step % (self.every or 1) == 0

    def to_dict(self) -> dict[str, object]:
        return {"every": self.every, "steps": sorted(self.steps) if self.steps is not None else None}


def checked_schedule(every: int | None, steps: Iterable[int] | None) -> Schedule:
    if every is not None and steps is not None:
        raise UsageError(f"every={every!r} and steps=[...] both given; pass one of them")
    if steps is not None:
        chosen = list(steps)
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in chosen):
            raise UsageError(f"steps={chosen!r}: expected step numbers >= 0 (the first step is 0)")
        return Schedule(every=None, steps=frozenset(chosen))
    if every is None:
        return Schedule(every=1, steps=None)
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise UsageError(f"every={every!r}: expected a whole number >= 1")
    return Schedule(every=every, steps=None)
