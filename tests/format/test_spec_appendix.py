"""docs/trace-format.md's appendix A stays in step with the spec and the tests: every MUST has a row, every row a test.

A sentence with MUST in the spec's body (its tables aside: their MUST columns
are rows of their own) must fall inside a requirement the appendix quotes; a
quoted requirement must still be in the body; and each test the appendix
names must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "docs" / "trace-format.md"
APPENDIX = "## Appendix A."


def _parts() -> tuple[str, list[list[str]]]:
    text = SPEC.read_text(encoding="utf-8")
    body, _, appendix = text.partition(APPENDIX)
    assert appendix, f"{SPEC} has no {APPENDIX!r}"
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in appendix.splitlines() if line.startswith("| ") and not line.startswith("| §")]
    return body, rows


def _prose(body: str) -> str:
    """The body's sentences on one line each paragraph: tables, headings and the key-words line left out."""
    lines = [line for line in body.splitlines()
             if not line.lstrip().startswith("|") and "key words MUST" not in line]
    return " ".join(" ".join(lines).split())


def _quoted(cell: str) -> list[str]:
    return re.findall(r'"([^"]+)"', cell)


def test_every_requirement_the_appendix_quotes_is_in_the_spec() -> None:
    body, rows = _parts()
    prose = _prose(body)
    assert len(rows) >= 25
    for row in rows:
        assert len(row) == 4, row
        for quote in _quoted(row[1]):
            assert quote in prose, f"appendix A quotes text the spec no longer has: {quote!r}"


def test_every_must_of_the_spec_has_a_row() -> None:
    body, rows = _parts()
    prose = _prose(body)
    spans = [(m.start(), m.end()) for row in rows for quote in _quoted(row[1])
             for m in re.finditer(re.escape(quote), prose)]
    for must in re.finditer(r"\bMUST\b", prose):
        if not any(start <= must.start() < end for start, end in spans):
            context = prose[max(0, must.start() - 80):must.start() + 80]
            raise AssertionError(f"a MUST without a row in appendix A: ...{context}...")


def test_every_test_the_appendix_names_exists() -> None:
    _, rows = _parts()
    named = [ref for row in rows for ref in re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", row[3])]
    assert len(named) >= len(rows)
    for file, name in named:
        source = (REPO / file).read_text(encoding="utf-8")
        assert re.search(rf"^def {name}\(", source, re.M), f"appendix A names {file}::{name}, which does not exist"
