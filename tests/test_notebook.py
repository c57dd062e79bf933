"""``notebooks/porting_walkthrough.ipynb`` executes top to bottom and finds the planted bug."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "porting_walkthrough.ipynb"


def _text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            parts.append(output["text"])
        parts.extend(str(v) for k, v in output.get("data", {}).items() if k == "text/plain")
    return "".join(parts)


def test_committed_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)


@pytest.mark.slow
def test_notebook_executes_and_finds_the_bug(tmp_path: Path) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert not [o for cell in code for o in cell.outputs if o.output_type == "error"]
    outputs = "\n".join(_text(cell) for cell in code)
    assert "first divergence: ReferenceLM.blocks.0.attn.rope ~ PortedLM.layers.0.self_attn.rotary_emb" in outputs
    assert "origin: introduced" in outputs
    assert re.search(r"traces differ: \d+ of \d+ compared tensors out of tolerance\nfirst divergence \(introduced\): "
                     r"ReferenceLM\.blocks\.0\.attn\.rope ~ PortedLM\.layers\.0\.self_attn\.rotary_emb", outputs)
    assert re.search(r"passed: \{'compared': \d+, 'diverged': 0,", outputs)
    images = [o for cell in code for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1
    grouped = next(_text(cell) for cell in code if "groupby" in cell.source)
    assert "Rope" in grouped and "Linear" in grouped
