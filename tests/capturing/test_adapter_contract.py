"""The adapter contract (tracediff/capturing/adapters/base.py), checked the same way for every built-in adapter.

Each adapter of ``adapters()`` (torch, MLX, Flax NNX, and every runtime of ``_FILE_RUNTIMES``: llama.cpp,
OpenVINO, ONNX Runtime, ExecuTorch) goes through the same checks, as Polygraphy runs each of its runners
through one comparator:

* it declares what the core and the command line read as data: ``supported_options`` among ``GATED_OPTIONS``,
  ``options`` as ``RuntimeOption`` with names of their own and flags no ``tracediff capture`` flag has,
  ``graph`` None or a ``GraphVocabulary``;
* it recognises its own example model, and no other runtime's, so that choosing once is never ambiguous;
* ``install`` changes what the model runs, its calls or nodes reach the recorder while installed, and
  ``restore`` puts back exactly what was there (torch: every module's ``forward`` and hooks; MLX and Flax NNX:
  their classes' ``__call__``; a graph runtime: the attributes of its loaded model);
* ``host`` of the runtime's arrays, nested too, gives numpy arrays or CPU tensors;
* ``metadata`` sets only the keys an adapter may set.

Each runtime's example model is made here (``EXAMPLES``), tiny, skipped with the reason when the runtime is not
installed. An adapter added to the package without an example here fails ``test_every_adapter_has_an_example``.
A capture chooses its adapter once: ``test_a_capture_chooses_its_adapter_once`` counts the choices.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tracediff
import tracediff.capturing.adapters as registry
from tracediff.capturing.adapters import GATED_OPTIONS, Adapter, RuntimeOption, adapters, find_adapter
from tracediff.capturing.adapters.base import ADAPTER_METADATA
from tracediff.trace.vocabulary import GraphVocabulary

ADAPTERS = {adapter.framework: adapter for adapter in adapters()}
FRAMEWORKS = sorted(ADAPTERS)


@dataclass
class Example:
    """One runtime's tiny model, what runs it, one of its arrays, and what ``install`` may change in it."""

    model: Any
    run: Callable[[Any], None]  # one forward, or one run of the graph on its inputs
    array: Any  # an array of the runtime, as ``host`` is handed one
    state: Callable[[Any], list[Any]]  # what install changes and restore must put back, compared by identity


class Heard:
    """A recorder that counts what reaches it: module calls (``observer``) and graph nodes."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.calls = self.nodes = self.lost = 0

    @property
    def observer(self) -> Heard:
        return self

    def enter(self, module: Any, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls += 1
        return path

    def exit(self, token: Any, output: Any) -> None:
        pass

    def error(self, token: Any, exc: BaseException) -> None:
        pass

    def call_lost(self, path: str, call_index: int | None, why: str) -> None:
        self.lost += 1

    def begin_step(self) -> None:
        pass

    def end_step(self) -> None:
        pass

    def record_node(self, **node: Any) -> None:
        self.nodes += 1

    @property
    def heard(self) -> int:
        return self.calls + self.nodes


# --- the example models, one factory per runtime --------------------------------------------------------------


def _torch_example(folder: Path) -> Example:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.proj(x))

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(), Block()])
            self.head = torch.nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 4)

    def state(net: torch.nn.Module) -> list[Any]:
        kept = []
        for module in net.modules():
            kept.append(module.__dict__.get("forward"))
            kept.append(module.__dict__.get("_compiled_call_impl"))
            for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
                kept.extend(getattr(module, hooks).values())
        return kept

    return Example(model, lambda net: net(x), torch.arange(6.0).reshape(2, 3), state)


def _class_calls(modules: list[Any]) -> list[Any]:
    """The ``__call__`` every class of ``modules`` defines itself (None where it defines none)."""
    classes = {cls: None for module in modules for cls in type(module).__mro__ if cls is not object}
    return [cls.__dict__.get("__call__") for cls in classes]


def _mlx_example(folder: Path) -> Example:
    mx = pytest.importorskip("mlx.core", reason='mlx is not installed (the mlx extra): pip install -e ".[mlx]"')
    nn = pytest.importorskip("mlx.nn", reason='mlx is not installed (the mlx extra): pip install -e ".[mlx]"')

    class Net(nn.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.head = nn.Linear(4, 2)

        def __call__(self, x: Any) -> Any:
            return self.head(nn.relu(self.proj(x)))

    mx.random.seed(0)
    model = Net()
    x = mx.ones((2, 4))
    return Example(model, lambda net: mx.eval(net(x)), mx.arange(6).reshape(2, 3),
                   lambda net: _class_calls([module for module in net.modules()]))


def _nnx_example(folder: Path) -> Example:
    jnp = pytest.importorskip("jax.numpy", reason='jax is not installed (the jax extra): pip install -e ".[jax]"')
    nnx = pytest.importorskip("flax.nnx", reason='flax is not installed (the jax extra): pip install -e ".[jax]"')

    class Net(nnx.Module):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            rngs = nnx.Rngs(0)
            self.proj = nnx.Linear(4, 4, rngs=rngs)
            self.head = nnx.Linear(4, 2, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.head(nnx.relu(self.proj(x)))

    model = Net()
    x = jnp.ones((2, 4), dtype=jnp.float32)
    return Example(model, lambda net: net(x).block_until_ready(), jnp.arange(6, dtype=jnp.float32).reshape(2, 3),
                   lambda net: _class_calls([module for _, module in nnx.iter_modules(net)]))


def _attributes(model: Any) -> list[Any]:
    """A loaded graph model's attributes, by name: what ``install`` hands the recorder through."""
    return sorted(vars(model).items(), key=lambda item: item[0])


def _graph_run(adapter_name: str, inputs: dict[str, torch.Tensor]) -> Callable[[Any], None]:
    return lambda model: ADAPTERS[adapter_name].run_inputs(model, inputs)


LLAMA_VOCAB, LLAMA_HIDDEN, LLAMA_HEADS, LLAMA_FF = 32, 16, 2, 32


def _write_gguf(path: Path) -> Path:
    """A one-block llama GGUF of seeded random float32 weights (hidden 16, vocabulary 32), written by gguf-py."""
    import gguf

    rng = np.random.default_rng(0)
    head = LLAMA_HIDDEN // LLAMA_HEADS
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_embedding_length(LLAMA_HIDDEN)
    writer.add_block_count(1)
    writer.add_feed_forward_length(LLAMA_FF)
    writer.add_head_count(LLAMA_HEADS)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(LLAMA_VOCAB)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}".encode() for i in range(LLAMA_VOCAB)])
    writer.add_token_scores([0.0] * LLAMA_VOCAB)
    writer.add_token_types([2, 3, 3] + [1] * (LLAMA_VOCAB - 3))  # unknown, bos, eos, then normal tokens
    shapes = {"token_embd.weight": (LLAMA_VOCAB, LLAMA_HIDDEN), "output_norm.weight": (LLAMA_HIDDEN,),
              "output.weight": (LLAMA_VOCAB, LLAMA_HIDDEN), "blk.0.attn_norm.weight": (LLAMA_HIDDEN,),
              "blk.0.attn_q.weight": (LLAMA_HIDDEN, LLAMA_HIDDEN), "blk.0.attn_k.weight": (head, LLAMA_HIDDEN),
              "blk.0.attn_v.weight": (head, LLAMA_HIDDEN), "blk.0.attn_output.weight": (LLAMA_HIDDEN, LLAMA_HIDDEN),
              "blk.0.ffn_norm.weight": (LLAMA_HIDDEN,), "blk.0.ffn_gate.weight": (LLAMA_FF, LLAMA_HIDDEN),
              "blk.0.ffn_up.weight": (LLAMA_FF, LLAMA_HIDDEN), "blk.0.ffn_down.weight": (LLAMA_HIDDEN, LLAMA_FF)}
    for name, shape in shapes.items():
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llama_cpp_example(folder: Path) -> Example:
    from tests.ports.llama_cpp_fixtures import require_llama_cpp
    from tests.ports.test_llama_cpp import INSTALL

    require_llama_cpp(INSTALL)
    pytest.importorskip("gguf", reason=f"gguf is not installed (the llama extra): {INSTALL}")
    llm = ADAPTERS["llama.cpp"].load(_write_gguf(folder / "tiny.gguf"), {"threads": 1})
    llm.eval([1, 5])  # a context that holds tokens already: restore must give it back as it was
    return Example(llm, _graph_run("llama.cpp", {"kwargs.input_ids": torch.tensor([[1, 7, 9, 4]])}),
                   np.arange(6, dtype=np.float32).reshape(2, 3), lambda model: [model._ctx, model.n_tokens])


def _onnx_example(folder: Path) -> Example:
    pytest.importorskip("onnxruntime", reason='onnxruntime is not installed (the onnx extra): pip install -e ".[onnx]"')
    onnx = pytest.importorskip("onnx", reason='onnx is not installed (the onnx extra): pip install -e ".[onnx]"')
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Mul", ["x", "two"], ["doubled"], name="/model/scale/Mul"),
             helper.make_node("Relu", ["doubled"], ["out"], name="/model/act/Relu")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])],
                              initializer=[numpy_helper.from_array(np.float32(2.0), "two")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(proto)
    model = ADAPTERS["onnxruntime"].load(proto, {})
    return Example(model, _graph_run("onnxruntime", {"kwargs.x": torch.tensor([[-1.0, 0.5, 2.0, -3.0]])}),
                   np.arange(6, dtype=np.float32).reshape(2, 3), _attributes)


def _openvino_example(folder: Path) -> Example:
    ov = pytest.importorskip("openvino", reason='openvino is not installed (the openvino extra): '
                                                'pip install -e ".[openvino]"')
    import openvino.opset13 as ops

    x = ops.parameter([1, 4], name="x")
    scaled = ops.multiply(x, ops.constant(2.0, dtype=float))
    scaled.set_friendly_name("__module.model.scale/aten::mul/Multiply")
    out = ops.relu(scaled)
    out.set_friendly_name("__module.model.act/aten::relu/Relu")
    model = ADAPTERS["openvino"].load(ov.Model([out], [x], "tiny"), {"precision": "f32"})
    return Example(model, _graph_run("openvino", {"kwargs.x": torch.tensor([[-1.0, 0.5, 2.0, -3.0]])}),
                   np.arange(6, dtype=np.float32).reshape(2, 3), _attributes)


EXECUTORCH = "executorch is not installed (see README: pip install --no-deps executorch==1.5.1 and its requirements)"


def _executorch_example(folder: Path) -> Example:
    exir = pytest.importorskip("executorch.exir", reason=EXECUTORCH)
    pytest.importorskip("executorch.runtime", reason=EXECUTORCH)

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    x = torch.randn(1, 4)
    exported = torch.export.export(module, (x,))
    manager = exir.to_edge_transform_and_lower(exported, generate_etrecord=True).to_executorch()
    model = ADAPTERS["executorch"].load(manager, {})
    return Example(model, _graph_run("executorch", {"args.0": x}), torch.arange(6.0).reshape(2, 3), _attributes)


EXAMPLES: dict[str, Callable[[Path], Example]] = {
    "torch": _torch_example, "mlx": _mlx_example, "jax": _nnx_example, "llama.cpp": _llama_cpp_example,
    "onnxruntime": _onnx_example, "openvino": _openvino_example, "executorch": _executorch_example,
}


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Example]]:
    """The example of a runtime, made once for the module (skipped when its runtime is not installed)."""
    made: dict[str, Example] = {}
    folder = tmp_path_factory.mktemp("adapter-examples")

    def get(framework: str) -> Example:
        if framework not in EXAMPLES:
            pytest.fail(f"adapter {framework!r} has no example model in {__name__}.EXAMPLES")
        if framework not in made:
            made[framework] = EXAMPLES[framework](folder)
        return made[framework]

    yield get


def _available(get: Callable[[str], Example], framework: str) -> Example | None:
    """The example of ``framework``, or None when its runtime is not installed."""
    try:
        return get(framework)
    except pytest.skip.Exception:
        return None


# --- what every adapter declares ------------------------------------------------------------------------------


def test_every_adapter_has_an_example() -> None:
    assert sorted(set(FRAMEWORKS) - set(EXAMPLES)) == [], "add an example model for it to EXAMPLES"
    assert len(ADAPTERS) == len(adapters()), "two built-in adapters share a framework name"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_it_names_its_runtime(framework: str) -> None:
    adapter = ADAPTERS[framework]
    assert isinstance(adapter.framework, str) and adapter.framework
    assert isinstance(adapter.models, str) and adapter.models


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_its_supported_options_are_gated_options(framework: str) -> None:
    supported = ADAPTERS[framework].supported_options
    assert isinstance(supported, frozenset)
    assert sorted(supported - set(GATED_OPTIONS)) == []


def _capture_flags() -> tuple[set[str], set[str]]:
    """The flags and destinations of ``tracediff capture``'s own options (the runtimes' groups left out)."""
    from tracediff.cli.main import build_parser

    parser = build_parser("capture")
    command = next(action for action in parser._actions if action.dest == "command").choices["capture"]
    runtime = command.get_default("runtime_flags")
    own = [action for action in command._actions if action.dest not in runtime]
    return {flag for action in own for flag in action.option_strings}, {action.dest for action in own}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_its_runtime_options_are_its_own(framework: str) -> None:
    adapter = ADAPTERS[framework]
    options = adapter.options
    assert isinstance(options, tuple) and all(isinstance(option, RuntimeOption) for option in options)
    names = [option.name for option in options]
    assert len(names) == len(set(names)), names
    flags, dests = _capture_flags()
    assert sorted({option.flag for option in options} & flags) == [], "a flag of tracediff capture's own"
    assert sorted(set(names) & dests) == [], "a name of tracediff capture's own options"
    for option in options:
        assert option.kind in ("str", "int", "path") and option.help, option
    if options:  # its models are files: the command line names its option group by their kind
        assert adapter.file_kind


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_its_graph_vocabulary(framework: str) -> None:
    graph = ADAPTERS[framework].graph
    assert graph is None or isinstance(graph, GraphVocabulary)
    if graph is not None:
        json.dumps(graph.to_json())  # written into every trace it captures


# --- what every adapter does with its example model ------------------------------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_it_recognises_its_model_and_no_other(framework: str, example: Callable[[str], Example]) -> None:
    adapter = ADAPTERS[framework]
    own = example(framework)
    assert adapter.recognises(own.model)
    chosen = find_adapter(own.model)
    assert chosen is not None and chosen.framework == framework  # no adapter asked earlier claims it
    others = {name: _available(example, name) for name in FRAMEWORKS if name != framework}
    claimed = [name for name, other in others.items() if other is not None and adapter.recognises(other.model)]
    assert claimed == [], f"{framework} recognises the models of {claimed}"
    assert not adapter.recognises(object())


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_install_then_restore_leaves_the_model_as_it_was(framework: str, example: Callable[[str], Example]) -> None:
    adapter, own = ADAPTERS[framework], example(framework)

    def same(a: list[Any], b: list[Any]) -> bool:
        return len(a) == len(b) and all(x is y or x == y for x, y in zip(a, b))

    before = own.state(own.model)
    installed = adapter.install(own.model, Heard(type(own.model).__name__), {})
    try:
        assert not same(own.state(own.model), before), "install changed nothing the example's state shows"
    finally:
        installed.restore()
    assert same(own.state(own.model), before)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_recorder_hears_the_model_only_while_installed(framework: str,
                                                           example: Callable[[str], Example]) -> None:
    adapter, own = ADAPTERS[framework], example(framework)
    recorder = Heard(type(own.model).__name__)
    installed = adapter.install(own.model, recorder, {})
    try:
        own.run(own.model)
    finally:
        installed.restore()
    heard = recorder.heard
    assert heard > 0 and recorder.lost == 0
    own.run(own.model)
    assert recorder.heard == heard


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    else:
        yield value


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_host_arrays_are_numpy_or_cpu_tensors(framework: str, example: Callable[[str], Example]) -> None:
    adapter, own = ADAPTERS[framework], example(framework)
    hosted = adapter.host([own.array, (own.array,), {"nested": own.array}])
    leaves = list(_leaves(hosted))
    assert len(leaves) == 3
    for leaf in leaves:
        assert isinstance(leaf, np.ndarray) or (isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu"), leaf
        values = leaf.numpy() if isinstance(leaf, torch.Tensor) else leaf
        assert values.tolist() == [[0, 1, 2], [3, 4, 5]]  # the array's own values, not a copy of something else


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_its_metadata_sets_only_its_keys(framework: str, example: Callable[[str], Example]) -> None:
    adapter, own = ADAPTERS[framework], example(framework)
    assert sorted(set(adapter.metadata(own.model)) - ADAPTER_METADATA) == []


# --- chosen once per capture ------------------------------------------------------------------------------------

SPEC = """
import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.ones(2, 4),)
"""


def test_a_capture_chooses_its_adapter_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every choice of an adapter (``adapter_for``, ``find_adapter``, ``array_adapter``) asks ``adapters()``."""
    from tracediff.capturing.spec import capture_spec, save_inputs

    asked: list[int] = []
    every = registry.adapters

    def counted() -> list[Adapter]:
        asked.append(1)
        return every()

    monkeypatch.setattr(registry, "adapters", counted)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with tracediff.capture(model, tmp_path / "direct"):
        model(torch.ones(2, 4))
    assert len(asked) == 1
    script = tmp_path / "spec.py"
    script.write_text(textwrap.dedent(SPEC))
    save_inputs(tmp_path / "inputs.safetensors", ((torch.full((2, 4), 0.5),), {}))
    asked.clear()
    session = capture_spec(f"{script}:build", tmp_path / "spec", inputs=tmp_path / "inputs.safetensors",
                           save_inputs_to=tmp_path / "again.safetensors")
    assert session.complete and len(asked) == 1  # the SPEC's model, its inputs file and the capture: one choice
