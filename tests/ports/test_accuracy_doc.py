"""docs/accuracy.md's table agrees with the suite's marks: a cell is **wrong** exactly where a case is xfail.

Moving a mark (after the pairing rebuild fixes a case) without rerunning ``scripts/port_accuracy.py``
fails here, and so does a table written by hand.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tests.ports.harness import INSTALL, MODES, cases

DOC = Path(__file__).resolve().parents[2] / "docs" / "accuracy.md"
FILES = ("whisper", "esm", "transformer_lens", "transformer_lens_llama", "transformer_lens_neox",
         "transformer_lens_bloom", "torchtune", "torchtune_phi3", "torchtune_qwen2", "torchtune_t5", "torchtune_gemma2",
         "research_llama", "research_vit")


def doc_cells() -> dict[tuple[str, str, str], bool]:
    """(port, case, mode) -> right, from the table between the markers."""
    text = DOC.read_text().split("<!-- accuracy table -->", 1)[1].split("<!-- /accuracy table -->", 1)[0]
    cells: dict[tuple[str, str, str], bool] = {}
    for line in text.splitlines():
        fields = [field.strip() for field in line.strip().strip("|").split("|")]
        if len(fields) == 3 + len(MODES) and fields[0] not in ("port", "---"):
            for mode, cell in zip(MODES, fields[3:]):
                cells[fields[0], fields[1], mode] = cell.startswith("right")
        elif len(fields) == 5 and fields[2].endswith("(hand map)"):
            cells[fields[0], fields[1], fields[2].split(" ")[0]] = fields[4].startswith("right")
    return cells


@pytest.mark.parametrize("name", FILES)
def test_table_matches_marks(name: str) -> None:
    for package in ("whisper", "esm", "transformer_lens", "torchtune"):
        pytest.importorskip(package, reason=f"the ports extra is not installed: {INSTALL}")
    module = importlib.import_module(f"tests.ports.test_{name}")
    port, wrong = module.PORT, module.WRONG
    cells = doc_cells()
    expected = {(port.name, case, mode): (case, mode) not in wrong for case, mode in cases(port)}
    assert {key: cells.get(key) for key in expected} == expected


def test_mlx_table_matches_marks() -> None:
    """The mlx-lm ports' table (its own markers) agrees with tests/ports/test_mlx_lm.py's marks."""
    pytest.importorskip("mlx_lm", reason='mlx-lm is not installed (the mlx extra): pip install -c constraints.txt '
                                          '-e ".[mlx]"')
    from tests.ports.mlx_harness import PORTS
    from tests.ports.test_mlx_lm import WRONG

    text = DOC.read_text().split("<!-- mlx accuracy table -->", 1)[1].split("<!-- /mlx accuracy table -->", 1)[0]
    cells: dict[tuple[str, str], bool] = {}
    for line in text.splitlines():
        fields = [field.strip() for field in line.strip().strip("|").split("|")]
        if len(fields) == 4 and fields[0] not in ("port", "---"):
            cells[fields[0], fields[1]] = fields[3].startswith("right")
    expected = {(port.name, case): (port.name, case) not in WRONG for port in PORTS for case in port.cases()}
    assert cells == expected
