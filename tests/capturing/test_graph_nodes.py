"""Graph nodes (``tracediff/capturing/graph.py``): a runtime whose work is a graph, captured as steps of calls.

``TinyGraph`` is a numpy runtime defined here: each evaluation computes ``x -> norm -> matmul -> add`` and
updates a ``cache`` node read by the next evaluation, and reports every node to an observer with its explicit
key and the keys it read, as ggml's evaluation callback does. ``TinyGraphAdapter`` feeds those reports to the
capture's ``GraphNodeSink``. The recorded payloads are compared with the arrays the runtime computed bit for
bit: they are the same float computation's results, written and read back, so they are equal on any CPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tracediff
from tracediff import format as fmt
from tracediff.capturing.adapters import (
    AdapterBase,
    Recorder,
    adapter_for,
    known_models,
    register_adapter,
    unregister_adapter,
)
from tracediff.errors import UsageError
from tracediff.files.payloads import read_tensor_file
from tracediff.show import show_trace

DIM = 6
Observer = Callable[[int, tuple[int, int] | str, str, str, str | None, np.ndarray, list[Any]], None]


class TinyGraph:
    """A numpy runtime: ``out = (rms_norm(x) * g) @ w + cache``; then ``cache = out`` for the next call."""

    def __init__(self, *, seed: int = 0, perturb: str | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.g = rng.standard_normal(DIM).astype(np.float32)
        self.w = rng.standard_normal((DIM, DIM)).astype(np.float32)
        self.cache = np.zeros((1, DIM), dtype=np.float32)
        self.perturb = perturb  # the node whose value is changed (a port's bug), or None
        self.observer: Observer | None = None
        self.on_step: tuple[Callable[[], None], Callable[[], None]] | None = None
        self.calls = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        step, self.calls = self.calls, self.calls + 1
        if self.on_step is not None:
            self.on_step[0]()
        norm = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-6)) * self.g
        self._node(step, (step, 0), "norm", "RMS_NORM", "blk.0", norm, ["x", "g"])
        mul = norm @ self.w
        if self.perturb == "mul":
            mul = mul + np.float32(1.0)
        self._node(step, (step, 1), "mul", "MUL_MAT", "blk.0", mul, [(step, 0), "w"])
        out = mul + self.cache
        self._node(step, (step, 2), "out", "ADD", None, out, [(step, 1), "cache"])
        self.cache = out.copy()
        self._node(step, "cache", "cache", "CPY", None, self.cache, [(step, 2)])
        if self.on_step is not None:
            self.on_step[1]()
        return out

    def _node(self, step: int, key: tuple[int, int] | str, name: str, op: str, scope: str | None,
              value: np.ndarray, sources: list[Any]) -> None:
        if self.observer is not None:
            self.observer(step, key, name, op, scope, value, sources)


class _Installed:
    def __init__(self, model: TinyGraph) -> None:
        self.model = model
        self.saved = (model.observer, model.on_step)

    def restore(self) -> None:
        self.model.observer, self.model.on_step = self.saved


class TinyGraphAdapter(AdapterBase):
    framework = "tinygraph"
    models = "tiny graph"

    def recognises(self, model: Any) -> bool:
        return isinstance(model, TinyGraph)

    def version(self) -> str | None:
        return "0.1"

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> _Installed:
        installed = _Installed(model)

        def observe(step: int, key: Any, name: str, op: str, scope: str | None, value: np.ndarray,
                    sources: list[Any]) -> None:
            recorder.record_node(key=key, name=name, op=op, scope=scope, output=value, sources=sources,
                                 attributes={"step": step})

        model.observer = observe
        model.on_step = (recorder.begin_step, recorder.end_step)
        return installed

    def host(self, value: Any) -> Any:
        return value

    def metadata(self, model: Any) -> dict[str, Any]:
        return {"runtime": {"nodes_per_step": 4}}


@pytest.fixture
def adapter() -> Iterator[TinyGraphAdapter]:
    registered = TinyGraphAdapter()
    register_adapter(registered)
    try:
        yield registered
    finally:
        unregister_adapter(registered)


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal((1, DIM)).astype(np.float32) for _ in range(2)]


def _capture(model: TinyGraph, out: Path) -> list[dict[str, np.ndarray]]:
    """Capture two evaluations; returns what the runtime computed, node by node (copies)."""
    seen: list[dict[str, np.ndarray]] = []
    with tracediff.capture(model, out) as session:
        for x in _inputs():
            values: dict[str, np.ndarray] = {}
            inner = model.observer

            def spy(step: int, key: Any, name: str, op: str, scope: str | None, value: np.ndarray,
                    sources: list[Any], values: dict[str, np.ndarray] = values, inner: Any = inner) -> None:
                values[name] = value.copy()
                inner(step, key, name, op, scope, value, sources)

            model.observer = spy
            model(x)
            model.observer = inner
            seen.append(values)
    assert session.complete
    return seen


def _tree(out: Path) -> dict[str, Any]:
    return json.loads((out / "TinyGraph_debug_tree_FULL_TENSORS.json").read_text())


def test_a_graph_runtime_is_captured_as_steps_of_calls(adapter: TinyGraphAdapter, tmp_path: Path) -> None:
    model = TinyGraph()
    seen = _capture(model, tmp_path / "t")
    tree = _tree(tmp_path / "t")
    steps = [tree, *tree[fmt.SUBSEQUENT_CALLS]]
    assert [s[fmt.STEP] for s in steps] == [0, 1]
    assert [s[fmt.CALL_INDEX] for s in steps] == [0, 1]
    for k, step in enumerate(steps):
        nodes = step[fmt.CHILDREN]
        assert [(n[fmt.MODULE_PATH], n[fmt.MODULE_TYPE], n[fmt.CALL_INDEX]) for n in nodes] == [
            ("TinyGraph.blk.0.norm", "RMS_NORM", k), ("TinyGraph.blk.0.mul", "MUL_MAT", k),
            ("TinyGraph.out", "ADD", k), ("TinyGraph.cache", "CPY", k)]
        for node in nodes:
            name = node[fmt.MODULE_PATH].rsplit(".", 1)[1]
            payload = read_tensor_file(tmp_path / "t" / node[fmt.OUTPUTS][fmt.VALUE].removeprefix("./"))
            assert torch.equal(payload, torch.from_numpy(seen[k][name]))  # the runtime's own array, written
            assert node[fmt.ATTRIBUTES] == {"step": k}
        # the step's result: the output no later node of the step read (cache is read by the next step only)
        assert step[fmt.OUTPUTS] == nodes[3][fmt.OUTPUTS]
    metadata = json.loads((tmp_path / "t" / fmt.METADATA_FILE).read_text())
    assert (metadata[fmt.FRAMEWORK], metadata[fmt.FRAMEWORK_VERSION]) == ("tinygraph", "0.1")
    assert metadata[fmt.RUNTIME] == {"nodes_per_step": 4}
    assert metadata["calls"] == 10 and metadata["complete"] is True
    assert model.observer is None and model.on_step is None  # the interception is undone


@pytest.mark.parametrize(("tensors", "writers"), [("full", 0), ("full", 1), ("summary", 0), ("summary", 1)])
def test_a_node_handed_in_memory_the_runtime_reuses_is_recorded_before_record_node_returns(
        adapter: TinyGraphAdapter, tmp_path: Path, tensors: str, writers: int) -> None:
    """ggml hands each node in its own memory and reuses it once the callback returns; the llama.cpp adapter
    reads it in place, so every payload and statistic must be taken before ``record_node`` returns."""
    model = TinyGraph()
    scratch = np.empty((1, DIM), dtype=np.float32)  # one buffer for every node, as a runtime's arena
    seen: list[np.ndarray] = []
    with tracediff.capture(model, tmp_path / "t", tensors=tensors, writers=writers) as session:  # type: ignore[arg-type]
        inner = model.observer
        assert inner is not None

        def reused(step: int, key: Any, name: str, op: str, scope: str | None, value: np.ndarray,
                   sources: list[Any]) -> None:
            scratch[...] = value.reshape(scratch.shape)
            seen.append(scratch.copy())
            inner(step, key, name, op, scope, scratch, sources)
            scratch.fill(np.nan)  # the runtime's next use of the memory

        model.observer = reused
        for x in _inputs():
            model(x)
        model.observer = inner
    assert session.complete
    tree = _tree(tmp_path / "t") if tensors == "full" else json.loads(
        (tmp_path / "t" / "TinyGraph_debug_tree_SUMMARY.json").read_text())
    nodes = [n for step in [tree, *tree[fmt.SUBSEQUENT_CALLS]] for n in step[fmt.CHILDREN]]
    assert len(nodes) == len(seen) == 8
    for node, value in zip(nodes, seen):
        entry = node[fmt.OUTPUTS]
        expected = torch.from_numpy(value)
        if tensors == "full":
            payload = read_tensor_file(tmp_path / "t" / entry[fmt.VALUE].removeprefix("./"))
            assert torch.equal(payload, expected)
        stats = entry["stats"]  # the NaN written after the callback would show in every one of these
        assert (stats["nan"], stats["min"], stats["max"]) == (0, float(value.min()), float(value.max()))
        # six float64 additions in any order: within 2 gamma(6) (u = 2^-53) of the exact mean's magnitude
        assert abs(stats["mean"] - float(value.astype(np.float64).mean())) <= 1e-14 * stats["abs_mean"]


def test_sources_name_earlier_nodes_one_per_input(adapter: TinyGraphAdapter, tmp_path: Path) -> None:
    _capture(TinyGraph(), tmp_path / "t")
    tree = _tree(tmp_path / "t")
    first, second = tree[fmt.CHILDREN], tree[fmt.SUBSEQUENT_CALLS][0][fmt.CHILDREN]
    ref = {(n[fmt.MODULE_PATH], n[fmt.CALL_INDEX]): n for n in [*first, *second]}
    for node in [*first, *second]:
        assert len(node[fmt.SOURCES]) == len(node[fmt.INPUTS].get(fmt.ARGS, []))
        for source, arg in zip(node[fmt.SOURCES], node[fmt.INPUTS].get(fmt.ARGS, [])):
            if fmt.SOURCE_EXTERNAL in source:  # an input no node produced: a weight, the graph's input
                assert arg == {fmt.PY_TYPE: fmt.EXTERNAL_INPUT, fmt.REPR: source[fmt.SOURCE_EXTERNAL]}
            else:  # the producer's own entry: the same payload
                assert arg == ref[(source[fmt.MODULE_PATH], source[fmt.CALL_INDEX])][fmt.OUTPUTS]
    assert first[0][fmt.SOURCES] == [{"external": "x"}, {"external": "g"}]
    assert first[1][fmt.SOURCES] == [{"module_path": "TinyGraph.blk.0.norm", "call_index": 0}, {"external": "w"}]
    # an unknown key is external; the key "cache", reused across steps, is its latest record
    assert first[2][fmt.SOURCES][1] == {"external": "cache"}
    assert second[2][fmt.SOURCES][1] == {"module_path": "TinyGraph.cache", "call_index": 0}


def test_show_and_load_read_a_graph_trace(adapter: TinyGraphAdapter, tmp_path: Path) -> None:
    _capture(TinyGraph(), tmp_path / "t")
    trace = tracediff.load_trace(tmp_path / "t")
    paths = [(node.module_path, node.call_index) for node in trace.nodes()]
    assert ("TinyGraph.blk.0.mul", 1) in paths and ("TinyGraph", 1) in paths
    view = show_trace(tmp_path / "t", path="blk.0.*")
    assert {node.module_path for node in view.nodes} >= {"TinyGraph.blk.0.norm", "TinyGraph.blk.0.mul"}
    assert view.first_nonfinite is None


def test_two_identical_graph_traces_align(adapter: TinyGraphAdapter, tmp_path: Path) -> None:
    _capture(TinyGraph(), tmp_path / "a")
    _capture(TinyGraph(), tmp_path / "b")
    result = tracediff.align(tmp_path / "a", tmp_path / "b")
    assert result.verdict == "passed" and result.first_divergence is None


def test_a_changed_node_is_the_first_divergence(adapter: TinyGraphAdapter, tmp_path: Path) -> None:
    _capture(TinyGraph(), tmp_path / "a")
    _capture(TinyGraph(perturb="mul"), tmp_path / "b")
    result = tracediff.align(tmp_path / "a", tmp_path / "b")
    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    # the node itself, or the block of its scope when a reader groups blk.0's nodes into one call first
    assert (result.first_divergence.module_path_b, result.first_divergence.call_index_b) in \
        {("TinyGraph.blk.0.mul", 0), ("TinyGraph.blk.0", 0)}
    diverged = {(row.module_path_b, row.call_index_b) for row in result.rows if row.within_tolerance is False}
    assert ("TinyGraph.blk.0.mul", 0) in diverged and ("TinyGraph.blk.0.norm", 0) not in diverged


def test_an_option_the_runtime_does_not_support_is_refused_by_name(adapter: TinyGraphAdapter,
                                                                    tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^ops=True is not supported for tiny graph models"):
        with tracediff.capture(TinyGraph(), tmp_path / "t", ops=True):
            pass
    assert not (tmp_path / "t").exists()


def test_node_payloads_keep_their_dtype(adapter: TinyGraphAdapter, tmp_path: Path) -> None:
    model = TinyGraph()
    values = {"f16": np.arange(6, dtype=np.float16).reshape(2, 3), "i32": np.arange(4, dtype=np.int32),
              "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}
    with tracediff.capture(model, tmp_path / "t"):
        assert model.observer is not None and model.on_step is not None
        model.on_step[0]()
        for name, value in values.items():
            model.observer(0, name, name, "LEAF", None, value, [])  # type: ignore[arg-type]
        model.on_step[1]()
    nodes = _tree(tmp_path / "t")[fmt.CHILDREN]
    for node, (name, value) in zip(nodes, values.items()):
        payload = read_tensor_file(tmp_path / "t" / node[fmt.OUTPUTS][fmt.VALUE].removeprefix("./"))
        expected = value if isinstance(value, torch.Tensor) else torch.from_numpy(value)
        assert payload.dtype == expected.dtype and torch.equal(payload, expected), name


def test_nodes_without_begin_step_make_one_step(adapter: TinyGraphAdapter, tmp_path: Path) -> None:
    model = TinyGraph()
    with tracediff.capture(model, tmp_path / "t") as session:
        assert model.observer is not None
        model.observer(0, "a", "a", "LEAF", None, np.ones(2, dtype=np.float32), [])
        model.observer(0, "b", "b", "NEG", None, -np.ones(2, dtype=np.float32), ["a"])
    assert session.complete
    tree = _tree(tmp_path / "t")
    assert tree[fmt.STEP] == 0 and [n[fmt.MODULE_PATH] for n in tree[fmt.CHILDREN]] == ["TinyGraph.a", "TinyGraph.b"]
    assert tree[fmt.OUTPUTS] == tree[fmt.CHILDREN][1][fmt.OUTPUTS]


def test_the_registered_adapter_is_chosen_and_unregistered_is_gone(tmp_path: Path) -> None:
    registered = TinyGraphAdapter()
    with pytest.raises(UsageError) as refused:
        adapter_for(TinyGraph())
    assert str(refused.value) == f"model: expected a {known_models()} model, got TinyGraph"
    assert known_models().startswith("torch, MLX, Flax NNX") or known_models() == "torch, MLX or Flax NNX"
    register_adapter(registered)
    try:
        assert adapter_for(TinyGraph()) is registered
        assert adapter_for(torch.nn.Linear(2, 2)).framework == "torch"
    finally:
        unregister_adapter(registered)
