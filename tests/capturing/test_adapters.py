"""The adapter seam (``tracediff/capturing/adapters``): one adapter per runtime, chosen once, asked alone.

* no code outside ``capturing/adapters/`` asks which framework a model belongs to (the ``is_*_module`` and
  ``is_*_array`` helpers are called there only);
* an option a runtime does not support is refused once, naming the runtime;
* ``tracediff capture`` takes a Flax NNX model from a SPEC, with an inputs file written by ``--save-inputs``.
"""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tracediff
from tracediff.capturing.adapters import adapters, check_options
from tracediff.cli.main import main
from tracediff.errors import UsageError

PACKAGE = Path(tracediff.__file__).parent
ADAPTERS = PACKAGE / "capturing" / "adapters"
#: The modules that kept the adapters' names importable from their former homes (re-exports, no logic).
FORMER_HOMES = {PACKAGE / "capturing" / "mlx_adapter.py", PACKAGE / "capturing" / "jax_adapter.py"}
FRAMEWORK_QUESTIONS = {"is_mlx_module", "is_nnx_module", "is_mlx_array", "is_jax_array"}


def _calls(path: Path) -> list[tuple[int, str]]:
    """``(line, name)`` of every call of a framework question in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else None
            if name in FRAMEWORK_QUESTIONS:
                found.append((node.lineno, name))
    return found


def test_no_framework_question_is_asked_outside_the_adapters() -> None:
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}()"
                 for path in sorted(PACKAGE.rglob("*.py")) if ADAPTERS not in path.parents
                 for line, name in _calls(path)]
    assert offenders == [], "ask the chosen adapter instead (capturing/adapters):\n" + "\n".join(offenders)


def test_the_former_homes_only_re_export() -> None:
    for path in FORMER_HOMES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        kinds = {type(node).__name__ for node in tree.body}
        assert kinds <= {"Expr", "ImportFrom", "Assign"}, (path, kinds)  # docstring, the import, __all__


def test_the_check_catches_a_branch_put_back(tmp_path: Path) -> None:
    planted = tmp_path / "session.py"
    planted.write_text("def f(model):\n    if is_nnx_module(model):\n        return 1\n")
    assert _calls(planted) == [(2, "is_nnx_module")]


@pytest.mark.parametrize(("framework", "models"), [("mlx", "MLX"), ("jax", "Flax NNX")])
def test_an_unsupported_option_names_the_runtime(framework: str, models: str) -> None:
    adapter = next(a for a in adapters() if a.framework == framework)
    with pytest.raises(UsageError) as refused:
        check_options(adapter, {"ops": True})
    assert str(refused.value) == (f"ops=True is not supported for {models} models: capture without it "
                                  "(calls, inputs and outputs are recorded)")
    check_options(adapter, {"ops": False, "steps": None})  # options left at their defaults pass


def test_torch_supports_every_gated_option() -> None:
    torch_adapter = next(a for a in adapters() if a.framework == "torch")
    check_options(torch_adapter, {"ops": True, "backward": True, "verify": True, "steps": "0", "full_dtensor": True})


NNX_SPEC = """
import jax.numpy as jnp
from flax import nnx


class Net(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        self.proj = nnx.Linear(4, 4, rngs=rngs)
        self.head = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x):
        return self.head(nnx.relu(self.proj(x)))


def build():
    x = jnp.asarray([[0.5, -1.0, 2.0, 0.25], [1.5, 0.0, -0.75, 1.0]], dtype=jnp.float32)
    return Net(), (x,)
"""


def test_the_command_line_captures_a_flax_nnx_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("flax.nnx", reason='flax is not installed (the jax extra): pip install -e ".[jax]"')
    script = tmp_path / "nnx_model.py"
    script.write_text(textwrap.dedent(NNX_SPEC))
    spec = f"{script}:build"
    saved = tmp_path / "inputs.safetensors"
    assert main(["capture", spec, "--out", str(tmp_path / "a"), "--save-inputs", str(saved)]) == 0
    assert main(["capture", spec, "--out", str(tmp_path / "b"), "--inputs", str(saved)]) == 0
    capsys.readouterr()
    meta = json.loads((tmp_path / "a" / "tracediff_metadata.json").read_text())
    assert meta["framework"] == "jax" and meta["calls"] == 3
    tree = json.loads((tmp_path / "a" / "Net_debug_tree_FULL_TENSORS.json").read_text())
    assert [c["module_path"] for c in tree["children"]] == ["Net.proj", "Net.head"]
    # the inputs file's tensor became the JAX input of the second capture: the same bits recorded
    a, b = tracediff.load_trace(tmp_path / "a"), tracediff.load_trace(tmp_path / "b")
    first = [next(t for t in trace.roots[0].tensors if t.slot == "inputs.args.0") for trace in (a, b)]
    assert np.array_equal(a.load_payload(first[0]).values, b.load_payload(first[1]).values)
    assert tracediff.align(tmp_path / "a", tmp_path / "b").passed
    code = main(["capture", spec, "--out", str(tmp_path / "c"), "--dtype", "bfloat16"])
    assert code == 2
    assert capsys.readouterr().err.strip().endswith(
        "dtype=bfloat16 is not supported for Flax NNX models: set it in the SPEC's function")
