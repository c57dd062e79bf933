"""Capturing Flax NNX models (``tracediff/capturing/jax_adapter.py``) and aligning them against torch.

The torch twin holds the same weights (a Linear's kernel is ``[in, out]`` in Flax, ``[out, in]`` in torch);
both run float32 matmuls of their own, so they agree within the default tolerances, not bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

INSTALL = 'pip install -c constraints.txt -e ".[jax]"'
jnp = pytest.importorskip("jax.numpy", reason=f"jax is not installed (the jax extra): {INSTALL}")
nnx = pytest.importorskip("flax.nnx", reason=f"flax is not installed (the jax extra): {INSTALL}")

import tracediff  # noqa: E402

DIM = 8


class Block(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.proj = nnx.Linear(DIM, DIM, rngs=rngs)
        self.out = nnx.Linear(DIM, DIM, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return x + self.out(nnx.relu(self.proj(x)))


class Net(nnx.Module):
    def __init__(self) -> None:
        rngs = nnx.Rngs(0)
        self.layers = nnx.List([Block(rngs), Block(rngs)])
        self.head = nnx.Linear(DIM, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class TorchBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj, self.out = torch.nn.Linear(DIM, DIM), torch.nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(torch.relu(self.proj(x)))


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([TorchBlock(), TorchBlock()])
        self.head = torch.nn.Linear(DIM, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def twin(net: Net) -> TorchNet:
    """A torch model with ``net``'s weights."""
    model = TorchNet().eval()
    pairs = [(model.layers[i].proj, net.layers[i].proj) for i in range(2)]
    pairs += [(model.layers[i].out, net.layers[i].out) for i in range(2)] + [(model.head, net.head)]
    with torch.no_grad():
        for linear, flax_linear in pairs:
            linear.weight.copy_(torch.from_numpy(np.array(flax_linear.kernel[...]).T))
            linear.bias.copy_(torch.from_numpy(np.array(flax_linear.bias[...])))
    return model


def inputs() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, 5, DIM)).astype(np.float32)


def test_every_call_is_recorded_and_the_classes_are_restored(tmp_path: Path) -> None:
    net = Net()
    before = {cls: cls.__dict__.get("__call__") for cls in (Net, Block, nnx.Linear)}
    with tracediff.capture(net, tmp_path) as session:
        out = net(jnp.asarray(inputs()))
    assert {cls: cls.__dict__.get("__call__") for cls in before} == before
    assert session.complete and session.calls == 8
    tree = json.loads((tmp_path / "Net_debug_tree_FULL_TENSORS.json").read_text())
    assert [c["module_path"] for c in tree["children"]] == ["Net.layers.0", "Net.layers.1", "Net.head"]
    assert [c["module_path"] for c in tree["children"][0]["children"]] == ["Net.layers.0.proj", "Net.layers.0.out"]
    trace = tracediff.load_trace(tmp_path)
    root_out = next(t for t in trace.roots[0].tensors if t.slot == "outputs")
    assert np.array_equal(trace.load_payload(root_out).values, np.asarray(out))  # the same bits, read back
    meta = json.loads((tmp_path / "tracediff_metadata.json").read_text())
    import jax

    assert (meta["framework"], meta["framework_version"]) == ("jax", jax.__version__)


def test_bfloat16_payloads_keep_their_bits(tmp_path: Path) -> None:
    x = jnp.asarray(inputs()).astype(jnp.bfloat16)
    layer = nnx.Linear(DIM, DIM, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    with tracediff.capture(layer, tmp_path):
        out = layer(x)
    tree = json.loads((tmp_path / "Linear_debug_tree_FULL_TENSORS.json").read_text())
    assert tree["outputs"]["dtype"] == "torch.bfloat16"
    trace = tracediff.load_trace(tmp_path)
    payload = trace.load_payload(next(t for t in trace.roots[0].tensors if t.slot == "outputs"))
    assert np.array_equal(np.asarray(payload.values).view(np.uint16), np.asarray(out).view(np.uint16))


def test_a_flax_model_aligns_against_its_torch_twin_and_a_transposed_weight_is_named(tmp_path: Path) -> None:
    net = Net()
    model = twin(net)
    with torch.no_grad(), tracediff.capture(model, tmp_path / "torch"):
        model(torch.from_numpy(inputs()))
    with tracediff.capture(net, tmp_path / "flax"):
        net(jnp.asarray(inputs()))
    result = tracediff.align(tmp_path / "torch", tmp_path / "flax")
    assert result.passed, result.first_divergence
    net.layers[1].out.kernel[...] = net.layers[1].out.kernel[...].T  # a square weight converted untransposed
    with tracediff.capture(net, tmp_path / "flax-bug"):
        net(jnp.asarray(inputs()))
    result = tracediff.align(tmp_path / "torch", tmp_path / "flax-bug")
    assert not result.passed
    assert result.first_divergence is not None and result.first_divergence.module_path_b == "Net.layers.1.out"
