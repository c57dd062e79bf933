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

import json
from collections.abc import Iterator
from typing import Any

from .. import format as fmt
from .hashing import combine_hashes


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


def entry_identity(entry: dict[str, Any] | None) -> str | None:
    """What makes two entries identical: the hash, or the JSON of a plain value."""
    if entry is None:
        return None
    if "hash" in entry:
        return str(entry["hash"])
    known, value = fmt.typed_value_content(entry)
    if known:  # tuples compare as lists, as they were recorded
        return "value:" + json.dumps([entry.get(fmt.PY_TYPE), fmt.as_json(value)], sort_keys=True)
    return "error:" + str(entry.get("error"))


def flatten_optimizer(snapshot: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, entry)`` pairs in causal order: type, defaults, param groups, then state."""
    if "type" in snapshot:
        yield "type", snapshot["type"]
    for key, entry in snapshot.get("defaults", {}).items():
        yield f"defaults.{key}", entry
    for g, group in enumerate(snapshot.get("param_groups", [])):
        for key, entry in group.items():
            yield f"param_groups.{g}.{key}", entry
    for pname, param_state in snapshot.get("state", {}).items():
        for key, entry in param_state.items():
            yield f"state.{pname}.{key}", entry
