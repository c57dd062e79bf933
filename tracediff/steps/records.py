"""One step record seen as ordered groups of named entries, and the aggregate hash of a group.

Every group is a JSON object ``{name: entry}`` in recording order (model order
for params, buffers and grads), except ``optimizer``, which is nested (see
:mod:`tracediff.steps.optimizer`) and read flat through :func:`group_items`.
A record also holds ``__all_{group}__`` (``__all_params__``, ``__all_grads__``,
``__all_buffers__``, ``__all_optimizer__``, ``__all_rngs__``, ``__all_batch__``):
the combined hash of the group's ``(name, identity)`` pairs, so that two
identical groups are recognised without looking at their entries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .entries import entry_identity
from .hashing import combine_hashes
from .optimizer import flatten_optimizer


def aggregate_key(group: str) -> str:
    """``"params"`` -> ``"__all_params__"``."""
    return f"__all_{group}__"


def group_items(group: str, content: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, entry)`` pairs of one group of a record, in recording order."""
    if not isinstance(content, dict):
        return
    if group == "optimizer":
        yield from flatten_optimizer(content)
    else:
        for name, entry in content.items():
            yield name, entry if isinstance(entry, dict) else {"error": f"malformed entry {entry!r}"[:200]}


def aggregate_hash(group: str, content: Any) -> str:
    """The combined hash of a group (see :func:`tracediff.steps.hashing.combine_hashes`)."""
    return combine_hashes((name, entry_identity(entry)) for name, entry in group_items(group, content))
