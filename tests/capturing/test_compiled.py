"""Capturing models under ``torch.compile``, and aligning them against their eager selves.

Compile times are kept small: two-block models of width 16, ``dynamic=False``, and the ``aot_eager`` backends
(Dynamo and AOTAutograd, the ``tracediff::record`` op in the graph, eager kernels) wherever the point is not
inductor's arithmetic. Inductor (C++ on CPU) compiles the clean model and the bfloat16 plant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tracediff
from tracediff.errors import UsageError

EPS32 = torch.finfo(torch.float32).eps
WIDTH = 16


@torch.compiler.assume_constant_result
def _gain(block: Block) -> float:
    # Read while compiling and kept as a constant: a later change is not seen by the compiled code.
    return block.gain


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, 4 * WIDTH)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.gain = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.fc2(self.act(self.fc1(x)))) * _gain(self)


class Tiny(nn.Module):
    """Two blocks with ``extra`` (a planted mistake, or nothing) between them."""

    def __init__(self, extra: nn.Module | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.extra = extra if extra is not None else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[1](self.extra(self.layers[0](x)))


class CompilingBranch(nn.Module):
    """Computes differently when compiled: the mistake ``torch.compiler.is_compiling()`` makes easy."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return x * 2.5
        return x * 2


class BfloatRounding(nn.Module):
    """Rounds to bfloat16 twice in eager; inductor keeps the product in float32 (no second rounding)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(torch.bfloat16) * 3).float()


@torch.library.custom_op("tracediff_test::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@double.register_fake
def _double_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class PlantedOp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.tracediff_test.double(x)


def tiny(extra: nn.Module | None = None, seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny(extra).eval()


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 8, WIDTH, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    """Each test compiles from nothing, so its counts of graphs and compilations are its own."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def capture(model: Any, out: Path, x: torch.Tensor, **options: Any) -> tuple[torch.Tensor, Any]:
    with torch.no_grad(), tracediff.capture(model, out, **options) as session:
        y = model(x)
    return y, session


def metadata(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "tracediff_metadata.json").read_text())


def paths(folder: Path) -> list[str]:
    return [node.module_path for root in tracediff.load_trace(folder).roots for node in root.walk()]


def test_a_compiled_model_is_captured_under_its_own_paths_with_its_compiled_values(tmp_path: Path) -> None:
    model, x = tiny(), tokens()
    capture(model, tmp_path / "eager", x)
    compiled = torch.compile(model, dynamic=False)
    _, session = capture(compiled, tmp_path / "compiled", x, verify=True)

    assert session.complete and session.calls == 12
    assert paths(tmp_path / "compiled") == paths(tmp_path / "eager")  # no OptimizedModule, no _orig_mod
    found = metadata(tmp_path / "compiled")["compile"]
    assert found["regions"] == [{"module_path": "Tiny", "how": "torch.compile"}]
    assert found["recording"] == "in-graph op tracediff::record"
    assert found["during_capture"]["graph_breaks"] == 0  # tracediff's own code is never traced
    # The run without capture (verify) runs the code compiled without the records: with them, every value
    # is materialised in float32, which rounds nothing, so the output is the same float32 computation.
    assert session.verification is not None and session.verification.compared == 1
    assert session.verification.identical, session.verification.differences
    # Against eager: a clean compile passes at the default tolerances, with nothing left out.
    result = tracediff.align(tmp_path / "eager", tmp_path / "compiled")
    assert result.passed and len(result.rows) > 0 and result.verdict == "passed"


def test_the_values_recorded_are_those_the_compiled_code_computed(tmp_path: Path) -> None:
    model, x = tiny(BfloatRounding()), tokens()
    capture(model, tmp_path / "eager", x)
    model.extra.compile(dynamic=False)  # inductor: the product stays in float32
    with torch.no_grad():
        expected = model(x)  # what the compiled model computes without capture
    y, session = capture(model, tmp_path / "compiled", x)
    assert session.complete
    # Only the planted module is compiled; what it computes under capture is what it computes without.
    assert torch.equal(y, expected)
    result = tracediff.align(tmp_path / "eager", tmp_path / "compiled")
    assert not result.passed
    assert result.first_divergence is not None and result.first_divergence.module_path_b == "Tiny.extra"


@pytest.mark.parametrize("how", ["Module.compile", "regional", "inside the block"])
def test_every_way_of_compiling_is_captured_without_breaks(tmp_path: Path, how: str) -> None:
    model, x = tiny(), tokens()
    capture(model, tmp_path / "eager", x)
    target: Any = model
    if how == "Module.compile":
        model.compile(backend="aot_eager", dynamic=False)
    elif how == "regional":
        for layer in model.layers:
            layer.compile(backend="aot_eager", dynamic=False)
    with torch.no_grad(), tracediff.capture(model, tmp_path / "compiled") as session:
        if how == "inside the block":
            target = torch.compile(model, backend="aot_eager", dynamic=False)
        target(x)
    assert session.complete
    assert paths(tmp_path / "compiled") == paths(tmp_path / "eager")
    during = metadata(tmp_path / "compiled")["compile"]["during_capture"]
    assert during["graph_breaks"] == 0 and during["frames_compiled"] >= 1
    assert tracediff.align(tmp_path / "eager", tmp_path / "compiled").passed


def test_a_model_captured_again_runs_the_graph_compiled_for_the_first_capture(tmp_path: Path) -> None:
    model, x = tiny(), tokens()
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    capture(compiled, tmp_path / "first", x)
    capture(compiled, tmp_path / "second", x)
    assert metadata(tmp_path / "first")["compile"]["during_capture"]["frames_compiled"] >= 1
    assert metadata(tmp_path / "second")["compile"]["during_capture"]["frames_compiled"] == 0
    assert paths(tmp_path / "second") == paths(tmp_path / "first")


def test_a_branch_on_is_compiling_is_named_at_its_module(tmp_path: Path) -> None:
    model, x = tiny(CompilingBranch()), tokens()
    capture(model, tmp_path / "eager", x)
    capture(torch.compile(model, backend="aot_eager", dynamic=False), tmp_path / "compiled", x)
    result = tracediff.align(tmp_path / "eager", tmp_path / "compiled")
    assert result.first_divergence is not None and result.first_divergence.module_path_b == "Tiny.extra"


def test_a_custom_op_whose_decomposition_differs_from_its_kernel_is_named_at_its_module(tmp_path: Path) -> None:
    from torch._inductor import decomposition

    model, x = tiny(PlantedOp()), tokens()
    capture(model, tmp_path / "eager", x)
    op = torch.ops.tracediff_test.double.default

    def drifting(t: torch.Tensor) -> torch.Tensor:  # what the compiler uses instead of the kernel: 25% off
        return t * 2.5

    # The table the compiler reads is built once (cached): rebuilt with the decomposition, and after without.
    decomposition.decompositions[op] = drifting
    decomposition.fast_random_decomps.cache_clear()
    try:
        capture(torch.compile(model, backend="aot_eager_decomp_partition", dynamic=False),
                tmp_path / "compiled", x)
    finally:
        del decomposition.decompositions[op]
        decomposition.fast_random_decomps.cache_clear()
    result = tracediff.align(tmp_path / "eager", tmp_path / "compiled")
    assert result.first_divergence is not None and result.first_divergence.module_path_b == "Tiny.extra"


def test_state_read_while_compiling_and_changed_after_is_named_by_a_regions_capture(tmp_path: Path) -> None:
    model, x = tiny(), tokens()
    for layer in model.layers:
        layer.compile(backend="aot_eager", dynamic=False)
    with torch.no_grad():
        model(x)  # compiled now, with gain 1.0 kept as a constant
    model.layers[1].gain = 1.5
    reference = tiny()
    reference.layers[1].gain = 1.5
    capture(reference, tmp_path / "eager", x)

    capture(model, tmp_path / "regions", x, compiled="regions")
    found = metadata(tmp_path / "regions")["compile"]
    assert found["during_capture"]["frames_compiled"] == 0  # the code compiled before the capture ran
    assert [r["module_path"] for r in found["regions"]] == ["Tiny.layers.0", "Tiny.layers.1"]
    assert paths(tmp_path / "regions") == ["Tiny", "Tiny.layers.0", "Tiny.extra", "Tiny.layers.1"]
    result = tracediff.align(tmp_path / "eager", tmp_path / "regions")
    assert result.first_divergence is not None and result.first_divergence.module_path_b == "Tiny.layers.1"

    # compiled="modules" compiles the regions again, with the records: the constant is read anew.
    capture(model, tmp_path / "modules", x)
    assert tracediff.align(tmp_path / "eager", tmp_path / "modules").passed


def test_regions_needs_a_compiled_region(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="has no compiled region"):
        capture(tiny(), tmp_path / "t", tokens(), compiled="regions")
    with pytest.raises(UsageError, match=r"compiled='fast': expected one of modules, regions"):
        capture(tiny(), tmp_path / "u", tokens(), compiled="fast")


def test_compiled_generation_with_a_static_cache_is_captured_step_by_step(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from tests.generation import ports

    config = transformers.LlamaConfig(
        vocab_size=ports.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager", pad_token_id=0,
        bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt, options = ports.prompt(), ports.generate_kwargs(cache_implementation="static")
    with tracediff.capture(model, tmp_path / "eager") as eager:
        expected = model.generate(prompt, **options)
    model.forward = torch.compile(model.forward, backend="aot_eager", dynamic=False)  # as for compiled decoding
    with tracediff.capture(model, tmp_path / "compiled") as session:
        tokens_out = model.generate(prompt, **options)

    assert torch.equal(tokens_out, expected) and session.complete and session.calls == eager.calls
    trace = tracediff.load_trace(tmp_path / "compiled")
    assert trace.root_steps == list(range(ports.NEW_TOKENS))
    found = metadata(tmp_path / "compiled")["compile"]
    assert found["regions"] == [{"module_path": "LlamaForCausalLM", "how": "torch.compile(forward)"}]
    # one graph for the prompt, one for every decode step (the static cache keeps their shapes)
    assert found["during_capture"]["graphs"] == 2 and found["during_capture"]["graph_breaks"] == 0
    assert tracediff.align(tmp_path / "eager", tmp_path / "compiled").passed



class Marked(nn.Module):
    """A value that says whether this module ran compiled (+1) or not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + (1.0 if torch.compiler.is_compiling() else 0.0)


class ManyMarked(nn.Module):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Marked() for _ in range(count)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_modules_compiled_one_frame_each_stay_compiled_past_the_recompile_limit(tmp_path: Path) -> None:
    # backward=True puts a backward hook on every module: Dynamo then runs each module's call itself and
    # compiles its forward as a frame of its own; more of them than Dynamo's recompile limit.
    count = torch._dynamo.config.recompile_limit + 2
    model, x = ManyMarked(count), torch.ones(4, requires_grad=True)
    compiled = torch.compile(model, backend="aot_eager", dynamic=False)
    expected = compiled(x)  # without capture: every block ran compiled
    with tracediff.capture(compiled, tmp_path / "compiled", backward=True) as session:
        y = compiled(x)
        y.sum().backward()
    assert torch.equal(y, expected), "a module ran eager under capture"
    assert session.complete and session.calls == count + 1


CLI_SPEC = """
import torch
from tests.capturing.test_compiled import CompilingBranch, tiny, tokens


def regional():
    model = tiny(CompilingBranch())
    model.extra = torch.compile(model.extra, backend="aot_eager", dynamic=False)
    return model, tokens()


def whole():
    return torch.compile(tiny(), backend="aot_eager", dynamic=False), tokens()
"""


def test_the_command_line_takes_the_compiled_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracediff.cli.main import main

    script = tmp_path / "compiled_spec.py"
    script.write_text(CLI_SPEC)
    assert main(["capture", f"{script}:regional", "--out", str(tmp_path / "regions"), "--compiled", "regions"]) == 0
    assert main(["capture", f"{script}:regional", "--out", str(tmp_path / "modules")]) == 0
    regions, modules = metadata(tmp_path / "regions"), metadata(tmp_path / "modules")
    assert regions["options"]["compiled"] == "regions" and modules["options"]["compiled"] == "modules"
    assert regions["compile"]["recording"] == "at compiled region calls, from outside"
    assert modules["compile"]["recording"] == "in-graph op tracediff::record"
    # regions: the compiled region is one call, nothing inside it recorded; its value is the compiled one
    assert "Tiny.extra" in paths(tmp_path / "regions")
    capsys.readouterr()
    # a model compiled as a whole is one region: refused, exit 2, one line naming the problem
    assert main(["capture", f"{script}:whole", "--out", str(tmp_path / "whole"), "--compiled", "regions"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is compiled as a whole" in err and "Traceback" not in err


def test_a_runtime_without_compiled_regions_refuses_the_option() -> None:
    from tracediff.capturing.adapters import adapters, check_options

    for adapter in adapters():
        if adapter.framework == "torch":
            check_options(adapter, {"compiled": "regions"})
            continue
        check_options(adapter, {"compiled": "modules"})  # the default passes every runtime
        with pytest.raises(UsageError, match=rf"compiled='regions' is not supported for {adapter.models} models"):
            check_options(adapter, {"compiled": "regions"})


def test_the_command_line_refuses_regions_for_a_flax_model(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("flax.nnx", reason='flax is not installed (the jax extra): pip install -e ".[jax]"')
    from tests.capturing.test_adapters import NNX_SPEC
    from tracediff.cli.main import main

    script = tmp_path / "nnx_model.py"
    script.write_text(NNX_SPEC)
    assert main(["capture", f"{script}:build", "--out", str(tmp_path / "a"), "--compiled", "regions"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(
        "compiled='regions' is not supported for Flax NNX models: capture without it (calls, inputs and outputs "
        "are recorded)")
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())


def _start_of_the_last_call_moved_after_its_return(graph_module: torch.fx.GraphModule,
                                                   example_inputs: list[torch.Tensor]) -> Any:
    """A backend that runs the graph with one record out of program order, as a scheduler that reorders
    records would: the last call's start moved just before the model's return."""
    records = [node for node in graph_module.graph.nodes
               if node.op == "call_function" and "tracediff.record" in str(node.target)]
    starts = [node for node in records if node.args[-2] == 0]  # the event: 0 a call's start, 1 its return
    records[-1].prepend(starts[-1])
    graph_module.recompile()
    return graph_module.forward


def test_a_record_out_of_program_order_is_counted_and_the_capture_is_not_complete(tmp_path: Path) -> None:
    model, x = tiny(), tokens()
    capture(model, tmp_path / "eager", x)
    reordered = torch.compile(model, backend=_start_of_the_last_call_moved_after_its_return, dynamic=False)
    _, session = capture(reordered, tmp_path / "compiled", x)

    # Every call ran; one was recorded out of order: its return came with no call open, its start after it.
    assert not session.complete and session.calls == 12
    lost = metadata(tmp_path / "compiled")["unrecorded_calls"]
    assert lost == {"count": 1, "calls": [{
        "module_path": "Tiny.layers.1.norm", "call_index": 0,
        "why": "its return was not recorded before its caller's: its outputs are missing"}]}
    assert tracediff.load_trace(tmp_path / "compiled").incomplete_reason == (
        "module calls that ran were not recorded: 1 (first Tiny.layers.1.norm: its return was not recorded "
        "before its caller's: its outputs are missing)")
    result = tracediff.align(tmp_path / "eager", tmp_path / "compiled")
    assert not result.passed and result.incomplete_b is not None

    # A reader counts the loss, whatever `complete` says.
    meta_file = tmp_path / "compiled" / "tracediff_metadata.json"
    meta_file.write_text(json.dumps({**metadata(tmp_path / "compiled"), "complete": True}))
    assert tracediff.load_trace(tmp_path / "compiled").incomplete_reason is not None
    assert not tracediff.align(tmp_path / "eager", tmp_path / "compiled").passed


def _payload_names(folder: Path) -> dict[tuple[str, int], dict[str, str]]:
    """Each call's input and output payload files (their ``value``), by (path, call index)."""
    tree = json.loads(next(folder.glob("*_FULL_TENSORS.json")).read_text())
    found: dict[tuple[str, int], dict[str, str]] = {}

    def walk(node: dict[str, Any]) -> None:
        args = node.get("inputs", {}).get("args", [])
        outputs = node.get("outputs")
        found[(node["module_path"], node["call_index"])] = {
            "input": args[0].get("value") if args and isinstance(args[0], dict) else None,
            "output": outputs.get("value") if isinstance(outputs, dict) else None}
        for child in node.get("children", []):
            walk(child)

    walk(tree)
    return found


@pytest.mark.parametrize("writers", [0, 2])  # payloads written in the hook; by writer threads (more cores)
def test_a_compiled_capture_writes_each_value_once_as_eager_capture_does(tmp_path: Path, writers: int) -> None:
    """Inside a compiled graph a module's input comes in inductor's buffer, which may hold the value of the
    call before it or, reused in place, another one: it shares that call's payload when its bytes are the
    payload's, and is written otherwise. Equal bytes are one payload: each block's output, its norm's times a
    gain of 1.0, is written once here and twice by eager capture (two tensors). With writer threads the
    payload is compared with the writer's copy until its file is written, so the same payloads are shared."""
    model, x = tiny(), tokens()
    capture(model, tmp_path / "eager", x, writers=0)
    compiled = torch.compile(model, dynamic=False)  # inductor, the default backend
    _, session = capture(compiled, tmp_path / "compiled", x, writers=writers)
    assert session.complete
    eager_files = sorted(p.name for p in (tmp_path / "eager").glob("*.safetensors"))
    compiled_files = sorted(p.name for p in (tmp_path / "compiled").glob("*.safetensors"))
    assert len(compiled_files) == len(eager_files) - 2, (compiled_files, eager_files)
    names = _payload_names(tmp_path / "compiled")
    for block in ("Tiny.layers.0", "Tiny.layers.1"):
        assert names[(f"{block}.fc1", 0)]["input"] == names[(block, 0)]["input"]  # the block's own input
        assert names[(f"{block}.act", 0)]["input"] == names[(f"{block}.fc1", 0)]["output"]
        assert names[(f"{block}.fc2", 0)]["input"] == names[(f"{block}.act", 0)]["output"]
        assert names[(block, 0)]["output"] == names[(f"{block}.norm", 0)]["output"]
    result = tracediff.align(tmp_path / "eager", tmp_path / "compiled")
    assert result.passed and len(result.rows) > 0


def test_a_graph_buffer_is_compared_with_the_writer_threads_copy_until_its_file_is_written(tmp_path: Path) -> None:
    """With writer threads a payload's file may not be written yet when the next record comes: the record is
    compared with the writer's host copy then (the same bytes as the file will hold), and with the file
    once it is written, so what is shared does not depend on how far the writers have got."""
    import threading

    from tracediff.capturing.encode import Encoder
    from tracediff.capturing.graph_buffers import mark
    from tracediff.capturing.pipeline import PayloadPipeline
    from tracediff.files.payloads import read_tensor_file, write_tensor_file

    gate = threading.Event()

    def held(path: Path, tensor: torch.Tensor) -> int:
        assert gate.wait(30)
        return write_tensor_file(path, tensor)

    pipeline = PayloadPipeline(writers=2, write=held)
    encoder = Encoder(tmp_path, "full", pipeline=pipeline)
    buffer = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    first = encoder.encode(mark(buffer.detach()), "a")
    assert not list(tmp_path.glob("*.safetensors")) and pipeline.pending_copy(tmp_path / "a.safetensors") is not None
    assert encoder.encode(mark(buffer.clone()), "b") is first  # the writer's copy holds these bytes
    buffer.numpy()[0, 0] = 99.0  # written in place, no version bump
    changed = encoder.encode(mark(buffer.detach()), "c")
    assert changed is not first
    gate.set()
    written = threading.Event()
    pipeline.after_written(written.set)
    assert written.wait(30)
    assert pipeline.pending_copy(tmp_path / "a.safetensors") is None
    assert encoder.encode(mark(buffer.clone()), "d") is changed  # compared with c's file now
    buffer.numpy()[0, 1] = -1.0
    assert encoder.encode(mark(buffer.detach()), "e") is not changed
    pipeline.close()
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["a.safetensors", "c.safetensors",
                                                                       "e.safetensors"]
    assert read_tensor_file(tmp_path / "a.safetensors")[0, 0].item() == 0.0
    assert read_tensor_file(tmp_path / "c.safetensors")[0, 0].item() == 99.0


def test_a_graph_buffer_is_taken_for_a_written_value_only_on_its_bytes(tmp_path: Path) -> None:
    from tracediff.capturing.encode import Encoder
    from tracediff.capturing.graph_buffers import mark
    from tracediff.files.payloads import read_tensor_file

    encoder = Encoder(tmp_path, "full")
    buffer = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    first = encoder.encode(mark(buffer.detach()), "a")
    assert encoder.encode(mark(buffer.detach()), "b") is first  # the same memory, the same bytes
    buffer.numpy()[0, 0] = 99.0  # written in place as inductor's kernels write: no version bump
    changed = encoder.encode(mark(buffer.detach()), "c")
    assert changed is not first
    assert read_tensor_file(tmp_path / "c.safetensors")[0, 0].item() == 99.0
    assert encoder.encode(mark(buffer.clone()), "d") is changed  # other memory, the same bytes
    assert encoder.encode(mark(buffer.t()), "e") is not changed  # another layout
    assert encoder.encode(buffer.detach(), "f") is not changed  # no graph's buffer: eager's rule alone
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == [
        "a.safetensors", "c.safetensors", "e.safetensors", "f.safetensors"]
    assert read_tensor_file(tmp_path / "a.safetensors")[0, 0].item() == 0.0
