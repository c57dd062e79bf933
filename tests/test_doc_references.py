"""Every ``tracediff.x.y`` the documentation names exists, and every name a user is shown is declared API.

The README and docs/ name modules and functions by their dotted paths; a module that moved and a
docstring left behind are caught here. Names shown to users (outside the pages about internals) must be
in ``tracediff.__all__`` or listed in docs/api.md's documented subpackages.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
#: Pages about tracediff's own insides: they may name private modules.
INTERNALS = {"performance.md", "architecture.md", "trace-format.md", "safety.md"}
OPTIONAL = {"tracediff.steps.lightning"}  # needs an extra at import time
_REFERENCE = re.compile(r"(?<![.\w])tracediff(?:\.[A-Za-z_][A-Za-z_0-9]*)+")


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in OPTIONAL:
            return True
        try:
            obj = importlib.import_module(module)
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def _references() -> list[tuple[str, str]]:
    found = set()
    for page in PAGES:
        for dotted in _REFERENCE.findall(page.read_text(encoding="utf-8")):
            found.add((page.relative_to(REPO).as_posix(), dotted.rstrip(".")))
    return sorted(found)


@pytest.mark.parametrize(("page", "dotted"), _references())
def test_every_dotted_name_in_the_docs_exists(page: str, dotted: str) -> None:
    assert _resolves(dotted), f"{page} names {dotted}, which does not exist"


def test_names_shown_to_users_are_declared_api() -> None:
    import tracediff

    api = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    undeclared = []
    for page, dotted in _references():
        if Path(page).name in INTERNALS or page == "docs/api.md" or page == "docs/cli.md":
            continue
        parts = dotted.split(".")
        if len(parts) == 2 and (parts[1] in tracediff.__all__ or _is_module(dotted)):
            continue
        if f"`{dotted}`" not in api and not _is_module(dotted):
            undeclared.append(f"{page}: {dotted}")
    assert not undeclared, "not in tracediff.__all__ nor docs/api.md: " + ", ".join(undeclared)


def _is_module(dotted: str) -> bool:
    if dotted in OPTIONAL:
        return True
    try:
        importlib.import_module(dotted)
    except ImportError:
        return False
    return True
