"""Dumps for the importer tests: the docs' plain PyTorch script, run twice (once with a planted bug)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
MSPROBE = ROOT / "fixtures" / "msprobe"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("save_layer_outputs", ROOT / "docs" / "examples"
                                                  / "save_layer_outputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()


@pytest.fixture(scope="module")
def layer_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``reference`` (``.pt`` files) and ``scaled_weight`` (``.npy`` files, layers.1.fc's weight x 1.05)."""
    root = tmp_path_factory.mktemp("dumps")
    EXAMPLE.save_layer_outputs(root / "reference")
    EXAMPLE.save_layer_outputs(root / "scaled_weight", plant_bug=True, file_format="npy")
    return root / "reference", root / "scaled_weight"
