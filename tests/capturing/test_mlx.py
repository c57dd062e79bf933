"""Capturing MLX models (``tracediff/capturing/mlx_adapter.py``): the same trace as a torch capture.

The recorded payloads are compared with the arrays the same forward returned, bit for bit: both are the
same float computation's result, read back (not a fresh computation), so they are equal on any CPU.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.ports.mlx_harness import INSTALL

mx = pytest.importorskip("mlx.core", reason=f"mlx is not installed (the mlx extra): {INSTALL}")
nn = pytest.importorskip("mlx.nn", reason=f"mlx is not installed (the mlx extra): {INSTALL}")

import tracediff  # noqa: E402
from tracediff.cli.main import main as cli_main  # noqa: E402
from tracediff.errors import UsageError  # noqa: E402
from tracediff.files.payloads import read_tensor_file  # noqa: E402


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim)
        self.proj = nn.Linear(dim, dim)

    def __call__(self, x: Any, *, scale: float = 1.0) -> Any:
        y = self.proj(self.norm(x)) * scale
        return {"hidden": x + y, "parts": (y, [x])}


class Holder(nn.Module):
    """A container of parameters, never called: a class with no ``__call__`` at all."""

    def __init__(self) -> None:
        super().__init__()
        self.table = mx.zeros((2,))


class Toy(nn.Module):
    """Nested modules, a list of layers, a keyword argument, dict/tuple/list outputs, a module called twice,
    a container that is never called."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.holder = Holder()
        self.embed = nn.Linear(4, dim)
        self.layers = [Block(dim), Block(dim)]
        self.head = nn.Linear(dim, 3)

    def __call__(self, x: Any, fail: bool = False) -> Any:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, scale=0.5)["hidden"]
        if fail:
            raise ValueError("no head today")
        return self.head(self.head.__class__.__call__(self.layers[0].proj, h)[..., :8])


def toy() -> tuple[Toy, Any]:
    mx.random.seed(0)
    model = Toy()
    mx.eval(model.parameters())
    return model, mx.random.normal((2, 4), key=mx.random.key(1))


def tree(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "Toy_debug_tree_FULL_TENSORS.json").read_text())


def walk(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("children", []) for n in walk(child))]


def payload(folder: Path, entry: dict[str, Any]) -> Any:
    return read_tensor_file(folder / entry["value"].removeprefix("./"))


def test_every_call_is_recorded_with_its_path_index_inputs_and_outputs(tmp_path: Path) -> None:
    model, x = toy()
    with tracediff.capture(model, tmp_path) as session:
        out = model(x)
    assert session.complete and session.calls == 10
    nodes = walk(tree(tmp_path))
    # in call order; layers.0.proj is called again (through Linear.__call__) after the layers
    assert [(n["module_path"], n["call_index"]) for n in nodes] == [
        ("Toy", 0), ("Toy.embed", 0),
        ("Toy.layers.0", 0), ("Toy.layers.0.norm", 0), ("Toy.layers.0.proj", 0),
        ("Toy.layers.1", 0), ("Toy.layers.1.norm", 0), ("Toy.layers.1.proj", 0),
        ("Toy.layers.0.proj", 1), ("Toy.head", 0)]
    assert {n["module_type"] for n in nodes} == {"Toy", "Linear", "Block", "RMSNorm"}
    layer = next(n for n in nodes if n["module_path"] == "Toy.layers.1")
    assert layer["inputs"]["kwargs"]["scale"] == {"py_type": "float", "py_value": 0.5}
    assert set(layer["outputs"]) == {"hidden", "parts"} and len(layer["outputs"]["parts"]) == 2
    assert isinstance(layer["outputs"]["parts"][1], list)  # the nested list inside the tuple
    # the root's output is the array the forward returned, bit for bit
    root = nodes[0]
    assert np.array_equal(payload(tmp_path, root["outputs"]).numpy(), np.array(out))
    assert root["outputs"]["stats"]["numel"] == 6


def test_metadata_names_the_framework_and_its_version(tmp_path: Path) -> None:
    model, x = toy()
    with tracediff.capture(model, tmp_path):
        model(x)
    meta = json.loads((tmp_path / "tracediff_metadata.json").read_text())
    assert (meta["framework"], meta["framework_version"]) == ("mlx", mx.__version__)
    assert meta["model_class"] == f"{Toy.__module__}.Toy" and meta["complete"] is True
    assert meta["forward_parameters"]["Block"] == ["x", "*", "scale"]


@pytest.mark.parametrize(("dtype", "torch_name"), [("bfloat16", "torch.bfloat16"), ("float16", "torch.float16")])
def test_half_precision_payloads_keep_their_dtype_and_bits(tmp_path: Path, dtype: str, torch_name: str) -> None:
    model, x = toy()
    model.set_dtype(getattr(mx, dtype))
    x = x.astype(getattr(mx, dtype))
    with tracediff.capture(model, tmp_path):
        out = model(x)
    root = tree(tmp_path)
    assert root["outputs"]["dtype"] == torch_name
    recorded = payload(tmp_path, root["outputs"])
    assert str(recorded.dtype) == torch_name
    # the same bits: compared as 16-bit integers
    assert np.array_equal(recorded.view(__import__("torch").int16).numpy(), np.array(out.view(mx.int16)))


def test_classes_are_restored_on_exit_and_after_an_exception(tmp_path: Path) -> None:
    model, x = toy()
    before = {cls: cls.__dict__.get("__call__") for cls in (Toy, Block, nn.Linear, nn.RMSNorm)}
    with pytest.raises(ValueError, match="no head today"):
        with tracediff.capture(model, tmp_path / "raised") as session:
            model(x, fail=True)
    assert {cls: cls.__dict__.get("__call__") for cls in before} == before
    assert not session.complete
    meta = json.loads((tmp_path / "raised" / "tracediff_metadata.json").read_text())
    assert meta["error"] == {"module_path": "Toy", "call_index": 0, "type": "ValueError", "message": "no head today"}
    with tracediff.capture(model, tmp_path / "fine"):
        model(x)
    assert {cls: cls.__dict__.get("__call__") for cls in before} == before


def test_a_module_outside_the_model_is_not_recorded(tmp_path: Path) -> None:
    model, x = toy()
    other = nn.Linear(4, 4)
    with tracediff.capture(model, tmp_path) as session:
        other(x)
        model(x)
    assert session.calls == 10
    assert "Linear" not in {n["module_path"] for n in walk(tree(tmp_path))}


def test_options_only_torch_supports_are_refused(tmp_path: Path) -> None:
    model, _ = toy()
    with pytest.raises(UsageError, match=r"^ops=True is not supported for MLX models"):
        with tracediff.capture(model, tmp_path, ops=True):
            pass
    assert not list(tmp_path.iterdir())


SCRIPT = textwrap.dedent('''
    import os, signal
    import mlx.core as mx
    import mlx.nn as nn

    class Dies(nn.Module):
        def __init__(self, kill):
            super().__init__()
            self.kill = kill
            self.layers = [nn.Linear(4, 4) for _ in range(4)]

        def __call__(self, x):
            for i, layer in enumerate(self.layers):
                if i == 2 and self.kill:
                    os.kill(os.getpid(), signal.SIGKILL)
                x = layer(x)
            return x

    def build(kill):
        mx.random.seed(0)
        return Dies(kill), mx.random.normal((2, 4), key=mx.random.key(1))

    def killed():
        return build(True)

    def fine():
        return build(False)
''')


def test_the_command_line_captures_an_mlx_spec_and_a_sigkill_leaves_a_readable_trace(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(SCRIPT)
    assert cli_main(["capture", f"{script}:fine", "--out", str(tmp_path / "fine"),
                     "--save-inputs", str(tmp_path / "inputs.safetensors")]) == 0
    assert cli_main(["capture", f"{script}:fine", "--out", str(tmp_path / "again"),
                     "--inputs", str(tmp_path / "inputs.safetensors")]) == 0
    assert tracediff.align(tmp_path / "fine", tmp_path / "again").passed
    # no writer threads: with them a finished call's journal line waits for its payloads, so what the kill
    # leaves would depend on the machine's idle cores (tests/safety/test_capture_folder.py, _capture)
    killed = subprocess.run([sys.executable, "-m", "tracediff", "capture", f"{script}:killed", "--out",
                             str(tmp_path / "killed"), "--writers", "0"], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    trace = tracediff.load_trace(tmp_path / "killed")
    assert [n.module_path for n in trace.nodes()] == ["Dies", "Dies.layers.0", "Dies.layers.1"]
    assert trace.incomplete_reason is not None and "read from its journal" in trace.incomplete_reason
    result = tracediff.align(tmp_path / "fine", tmp_path / "killed", allow_incomplete=True)
    assert result.passed
