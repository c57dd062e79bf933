"""An exported graph's nodes under module scopes (graph vocabulary ``"modules"``) pair with the module calls they
were exported from, with zero options.

``ExportedGraph`` is a numpy runtime defined here that computes what ``Net`` computes, op by op, as an exporter
leaves it: every node under the chain of module scopes it came from (``layers.0``, ``layers.0.mlp``,
``layers.0.mlp.up``), weights as external inputs. Its adapter declares the vocabulary as data (the seam every
graph runtime uses). The float32 ops are numpy's and torch's: each element of a matmul or a mean sums at most
16 products, so the two sides differ by a few float32 roundings per element (below 1e-6 relative here), far
inside float32's default tolerances (rtol 1.3e-6, atol 1e-5) on every CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import tracediff
from tracediff.capturing.adapters import AdapterBase, Recorder, register_adapter, unregister_adapter
from tracediff.trace.graph_scopes import GRAPH_BLOCK
from tracediff.trace.vocabulary import GraphVocabulary

WIDTH, HIDDEN = 8, 16


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(WIDTH, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.mlp = Norm(), Mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


Emit = Callable[..., None]


class ExportedGraph:
    """``Net`` as a graph of numpy ops, each reported with its key, op, module scopes and the keys it read."""

    def __init__(self, net: Net, *, chains: bool = True, scale: tuple[str, float] | None = None,
                 bf16: bool = False, stripped: bool = False) -> None:
        self.weights = {name: p.detach().numpy().copy() for name, p in net.named_parameters()}
        if scale is not None:  # a weight edited after export
            self.weights[scale[0]] = self.weights[scale[0]] * np.float32(scale[1])
        self.chains = chains  # False: only the innermost scope, as OpenVINO's friendly names give it
        self.bf16 = bf16  # every op's result rounded to bfloat16, returned as float32 (a bf16 inference precision)
        self.stripped = stripped  # no node carries a scope (a graph whose names and metadata were removed)
        self.emit: Emit | None = None
        self._count = 0

    def _node(self, op: str, scope: str | None, value: np.ndarray, sources: list[Any]) -> str:
        if self.bf16:
            value[...] = torch.from_numpy(value).to(torch.bfloat16).float().numpy()
        key = f"v{self._count}"
        self._count += 1
        if self.emit is not None:
            chain = None if self.stripped else _chain(scope) if (scope and self.chains) else scope
            self.emit(key=key, name=op, op=op, scope=chain, output=value, sources=sources)
        return key

    def __call__(self, x: np.ndarray) -> np.ndarray:
        w, node = self.weights, self._node
        key = "x"
        for i in range(2):
            p = f"layers.{i}"
            sq = x * x
            k = node("Mul", f"{p}.norm", sq, [key, key])
            mean = sq.mean(-1, keepdims=True)
            k = node("ReduceMean", f"{p}.norm", mean, [k])
            inv = (1.0 / np.sqrt(mean + np.float32(1e-6))).astype(np.float32)
            k = node("Rsqrt", f"{p}.norm", inv, [k])
            normed = x * inv * w[f"{p}.norm.weight"]
            k = node("Mul", f"{p}.norm", normed, [key, k, f"{p}.norm.weight"])
            up = normed @ w[f"{p}.mlp.up.weight"].T + w[f"{p}.mlp.up.bias"]
            k = node("Gemm", f"{p}.mlp.up", up, [k, f"{p}.mlp.up.weight", f"{p}.mlp.up.bias"])
            act = (up / (1 + np.exp(-up))).astype(np.float32)
            k = node("Silu", f"{p}.mlp.act", act, [k])
            down = act @ w[f"{p}.mlp.down.weight"].T + w[f"{p}.mlp.down.bias"]
            k = node("Gemm", f"{p}.mlp.down", down, [k, f"{p}.mlp.down.weight", f"{p}.mlp.down.bias"])
            x = x + down
            key = node("Add", p, x, [key, k])
        out = x @ w["head.weight"].T + w["head.bias"]
        node("Gemm", "head", out, [key, "head.weight", "head.bias"])
        return out


def _chain(scope: str) -> list[str]:
    """``layers.0.mlp.up`` -> ``["layers.0", "layers.0.mlp", "layers.0.mlp.up"]``, as an exporter's name scopes."""
    parts, chain = scope.split("."), []
    for part in parts:
        if chain and part.isdigit():
            chain[-1] = f"{chain[-1]}.{part}"
        else:
            chain.append(f"{chain[-1]}.{part}" if chain else part)
    return chain


class _Installed:
    def __init__(self, model: ExportedGraph) -> None:
        self.model = model

    def restore(self) -> None:
        self.model.emit = None


class ExportedGraphAdapter(AdapterBase):
    framework, models = "exported-graph", "exported graph"
    graph = GraphVocabulary(scopes="modules", views=frozenset({"Reshape"}), same_values=frozenset({"Reshape"}))

    def recognises(self, model: Any) -> bool:
        return isinstance(model, ExportedGraph)

    def version(self) -> str | None:
        return "1"

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> _Installed:
        model.emit = recorder.record_node
        return _Installed(model)

    def host(self, value: Any) -> Any:
        return value

    def metadata(self, model: Any) -> dict[str, Any]:
        return {"compute_dtype": "torch.bfloat16"} if model.bf16 else {}


@pytest.fixture(scope="module")
def adapter() -> Iterator[ExportedGraphAdapter]:
    registered = ExportedGraphAdapter()
    register_adapter(registered)
    try:
        yield registered
    finally:
        unregister_adapter(registered)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory, adapter: ExportedGraphAdapter) -> tuple[Net, Path, np.ndarray]:
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 3, WIDTH)
    reference = tmp_path_factory.mktemp("eager")
    with torch.no_grad(), tracediff.capture(net, reference):
        net(x)
    return net, reference, x.numpy()


def _graph_trace(net: Net, x: np.ndarray, out: Path, **kwargs: Any) -> Path:
    graph = ExportedGraph(net, **kwargs)
    with tracediff.capture(graph, out):
        graph(x)
    return out


def test_nodes_under_module_scopes_load_as_the_calls_they_were_exported_from(
        traces: tuple[Net, Path, np.ndarray], tmp_path: Path) -> None:
    net, _, x = traces
    trace = tracediff.load_trace(_graph_trace(net, x, tmp_path / "graph"))
    assert trace.graph is not None and trace.graph.scopes == "modules"
    calls = {node.relative_path: node for node in trace.nodes() if node.module_type == GRAPH_BLOCK}
    assert sorted(calls) == sorted(["layers.0", "layers.0.norm", "layers.0.mlp", "layers.0.mlp.up",
                                    "layers.0.mlp.act", "layers.0.mlp.down", "layers.1", "layers.1.norm",
                                    "layers.1.mlp", "layers.1.mlp.up", "layers.1.mlp.act", "layers.1.mlp.down",
                                    "head"])
    assert calls["layers.0.mlp.up"].parent is calls["layers.0.mlp"]
    assert calls["layers.0.mlp"].parent is calls["layers.0"]
    # a layer's output is the residual sum the next layer reads, its input the tensor coming in (layer 0's is
    # the graph's input, a name: nothing to compare)
    first, second = calls["layers.0"], calls["layers.1"]
    assert [r.slot for r in first.outputs()] == ["outputs"]
    assert first.outputs()[0].payload == first.children[-1].outputs()[0].payload
    assert [r.payload for r in second.inputs()] == [first.outputs()[0].payload]
    # the norm's output is its last Mul, read by up's Gemm outside it; its ReduceMean stays inside
    assert calls["layers.0.norm"].outputs()[0].payload == calls["layers.0.norm"].children[-1].outputs()[0].payload


@pytest.mark.parametrize("chains", [True, False], ids=["scope-chains", "innermost-scope"])
def test_a_clean_export_passes_against_the_eager_model_with_zero_options(
        traces: tuple[Net, Path, np.ndarray], tmp_path: Path, chains: bool) -> None:
    net, reference, x = traces
    result = tracediff.align(reference, _graph_trace(net, x, tmp_path / "graph", chains=chains))
    assert result.verdict == "passed", result.first_divergence
    compared = {row.module_path_b.partition(".")[2] for row in result.rows if row.within_tolerance is not None}
    assert {"layers.0.mlp.up", "layers.1.mlp.down", "layers.1", "head"} <= compared


def test_a_weight_scaled_after_export_is_named_at_its_module(traces: tuple[Net, Path, np.ndarray],
                                                             tmp_path: Path) -> None:
    net, reference, x = traces
    graph = _graph_trace(net, x, tmp_path / "graph", scale=("layers.1.mlp.down.weight", 1.01))
    result = tracediff.align(reference, graph)
    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    assert result.first_divergence.module_path_a == "Net.layers.1.mlp.down"


def test_a_runtime_that_computed_in_bfloat16_is_said_first_and_judged_as_bfloat16(
        traces: tuple[Net, Path, np.ndarray], tmp_path: Path) -> None:
    """Its float32 tensors carry bfloat16 rounding (metadata ``compute_dtype``): no module is blamed for it; the
    first warning says so and how to judge against noise; a real mistake is still named at its module."""
    net, reference, x = traces
    result = tracediff.align(reference, _graph_trace(net, x, tmp_path / "bf16", bf16=True))
    assert result.warnings[0].startswith("B computed in bfloat16 (its runtime's precision, the trace metadata's "
                                         "compute_dtype), though its tensors are float32")
    assert "--baseline ref-bfloat16" in result.warnings[0]
    assert result.verdict == "passed", result.first_divergence
    assert {row.rtol for row in result.rows if row.dtype_b == "torch.float32"} == {1.6e-2}
    wrong = tracediff.align(reference, _graph_trace(net, x, tmp_path / "bf16-bug", bf16=True,
                                                    scale=("layers.1.mlp.down.weight", 1.5)))
    assert wrong.verdict == "diverged"
    assert wrong.first_divergence is not None
    assert wrong.first_divergence.module_path_a == "Net.layers.1.mlp.down"


def test_a_graph_stripped_of_its_scopes_is_placed_under_the_modules_by_values_and_dataflow(
        traces: tuple[Net, Path, np.ndarray], tmp_path: Path) -> None:
    net, reference, x = traces
    result = tracediff.align(reference, _graph_trace(net, x, tmp_path / "stripped", stripped=True))
    assert result.warnings[0].startswith("B's graph nodes carry no module scopes: they were placed under A's modules "
                                         "by their values and dataflow (")
    assert result.verdict == "passed", (result.reason, result.first_divergence)
    compared = {row.module_path_a.partition(".")[2] for row in result.rows if row.within_tolerance is not None}
    assert {"layers.0.norm", "layers.0.mlp.up", "layers.1.mlp.down", "layers.1", "head"} <= compared
    wrong = tracediff.align(reference, _graph_trace(net, x, tmp_path / "stripped-bug", stripped=True,
                                                    scale=("layers.1.mlp.down.weight", 1.01)))
    assert wrong.verdict != "passed"
