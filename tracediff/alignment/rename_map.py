"""What ``align(rename=...)`` accepts, turned into validated rename rules.

Three forms, so that the library takes whatever the CLI's ``--map`` file holds:

* a list of rules: ``[("blocks\\.(\\d+)", r"layers.\\1"), ...]`` (pairs as tuples or lists);
* the object a map file holds: ``{"rename": [[regex, replacement], ...]}``; other keys
  (such as ``"slots"``) are left to the options that read them, never refused;
* the path of such a JSON file (``str`` or ``os.PathLike``).

``None`` means no rules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError
from .matching import RenameRules, check_rename, load_rename_file

RenameSpec = RenameRules | list[list[str]] | Mapping[str, Any] | str | os.PathLike[str] | None
"""A list of ``(regex, replacement)`` rules, a ``{"rename": [...]}`` mapping, or a path to a JSON map file."""


def rename_rules(spec: Any) -> RenameRules:
    """The rules of ``spec`` in any of the forms of :data:`RenameSpec`, validated (``UsageError`` otherwise)."""
    if spec is None:
        return []
    if isinstance(spec, (str, os.PathLike)):
        return load_rename_file(os.fspath(spec))
    if isinstance(spec, Mapping):
        rules = spec.get("rename", [])
        if not isinstance(rules, (list, tuple)):
            raise UsageError(f'rename: the "rename" entry is {type(rules).__name__}; '
                             "expected a list of [regex, replacement]")
        return check_rename(rules, source="rename")
    if isinstance(spec, (list, tuple)):
        return check_rename(spec, source="rename")
    raise UsageError(f"rename: got {type(spec).__name__}; expected a list of [regex, replacement] rules, "
                     '{"rename": [...]} or the path of a JSON map file')
