"""Capturing llama.cpp: the graph nodes of a decode, their payloads, dataflow and metadata; the refusals.

The GGUF is the Llama family's clean F32 conversion (tests/ports/llama_cpp_harness.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.ports.llama_cpp_fixtures import LLAMA_CPP_PYTHON, require_llama_cpp
from tests.ports.test_llama_cpp import INSTALL

llama_cpp = require_llama_cpp(INSTALL)
pytest.importorskip("gguf", reason=f"gguf is not installed (the llama extra): {INSTALL}")
pytest.importorskip("sentencepiece", reason=f"sentencepiece is not installed (the llama extra): {INSTALL}")

import tracediff  # noqa: E402
from tests.ports.llama_cpp_harness import FAMILIES, TOKENS, GgufRun, _cli  # noqa: E402
from tracediff.trace.load import load_trace  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> GgufRun:
    return GgufRun(FAMILIES["llama"], tmp_path_factory.mktemp("llama-cpp-capture"))


@pytest.fixture(scope="module")
def f16_cache(run: GgufRun) -> Path:
    """The clean GGUF captured from the command line with llama.cpp's default F16 KV cache."""
    out = run.folder / "trace-f16-cache"
    code, text = _cli(["capture", str(run.gguf("clean")), "--inputs", str(run.inputs()), "--out", str(out)])
    assert code == 0, text
    # llama.cpp's own warnings (a tiny model's context padded past its training length) may come first
    assert text.strip().splitlines()[-1].startswith("captured ") and "graph nodes" in text
    return out


def _children(trace_dir: Path) -> dict[str, list[dict]]:
    """The step's graph nodes by path, as written (JSON), in evaluation order."""
    tree = json.loads((trace_dir / "Llama_debug_tree_FULL_TENSORS.json").read_text())
    nodes: dict[str, list[dict]] = {}
    for child in tree["children"]:
        nodes.setdefault(child["module_path"], []).append(child)
    return nodes


def test_nodes_of_a_decode(f16_cache: Path) -> None:
    nodes = _children(f16_cache)
    metadata = json.loads((f16_cache / "tracediff_metadata.json").read_text())
    runtime = metadata["runtime"]
    assert metadata["framework"] == "llama.cpp" and metadata["framework_version"] == LLAMA_CPP_PYTHON
    assert runtime["architecture"] == "llama" and runtime["kv_cache_type"] == {"k": "f16", "v": "f16"}
    assert runtime["hyperparameters"]["llama.block_count"] == "2"
    assert runtime["weight_types"]["blk.0.attn_q.weight"] == "f32"
    # llama.cpp's own names, split at their -N suffix into the block's scope; a name repeated gets call indices
    for name in ("Llama.blk.0.attn_norm", "Llama.blk.1.l_out", "Llama.result_norm", "Llama.result_output"):
        assert name in nodes, sorted(nodes)
    qcur = nodes["Llama.blk.0.Qcur"]
    assert [q["call_index"] for q in qcur] == list(range(len(qcur))) and len(qcur) >= 3
    assert [q["module_type"] for q in qcur][0] == "MUL_MAT" and "ROPE" in [q["module_type"] for q in qcur]
    rope = next(q for q in qcur if q["module_type"] == "ROPE")
    assert rope["attributes"]["freq_base"] == 500000.0  # the GGUF's rope base, as the node used it
    norm = nodes["Llama.blk.0.norm"][0]
    assert norm["module_type"] == "RMS_NORM" and norm["attributes"]["eps"] == pytest.approx(1e-6, rel=1e-6)
    # torch's dimension order: [T, hidden] (ggml's ne [hidden, T] reversed)
    assert nodes["Llama.blk.0.attn_norm"][0]["outputs"]["shape"] == f"torch.Size([{TOKENS.shape[1]}, 64])"
    # dataflow: attn_norm reads norm's output (an earlier node) and its weight (external)
    sources = nodes["Llama.blk.0.attn_norm"][0]["sources"]
    assert {"module_path": "Llama.blk.0.norm", "call_index": 0} in sources
    assert {"external": "blk.0.attn_norm.weight"} in sources
    # the KV cache is F16 by default: the cache views keep their dtype
    dtypes = {child["outputs"]["dtype"] for path, calls in nodes.items() if "cache_k" in path for child in calls}
    assert "torch.float16" in dtypes


def test_attn_norm_equals_transformers(run: GgufRun, f16_cache: Path) -> None:
    """llama.cpp's first attention norm and transformers' ``input_layernorm`` compute the same sum of 64
    squares, then a scale: float32 rounding, each term within 64 * 2**-24 relative (any summation order),
    bounds them by 64 * 2**-24 ~ 3.8e-6 relative, plus one rounding of each product."""
    model = run.family.reference()
    seen: dict[str, torch.Tensor] = {}
    model.model.layers[0].input_layernorm.register_forward_hook(lambda m, i, o: seen.setdefault("norm", o))
    with torch.no_grad():
        model(input_ids=TOKENS)
    trace = load_trace(f16_cache)
    node = next(n for n in trace.nodes() if n.module_path == "Llama.blk.0.attn_norm")
    ours = trace.load(node.outputs()[0])
    reference = seen["norm"][0]
    bound = (64 + 2) * 2.0 ** -24 * reference.abs().max().item()
    assert (ours - reference).abs().max().item() <= bound


def test_library_capture_restores_the_llama(run: GgufRun, tmp_path: Path) -> None:
    llm = llama_cpp.Llama(model_path=str(run.gguf("clean")), n_ctx=64, logits_all=True, verbose=False,
                          type_k=0, type_v=0)
    own = llm._ctx
    with tracediff.capture(llm, tmp_path / "t") as session:
        llm.eval(TOKENS[0].tolist()[:4])
        llm.eval(TOKENS[0].tolist()[4:])
    assert llm._ctx is own and llm.n_tokens == 0
    assert session.complete
    trace = load_trace(tmp_path / "t")
    assert trace.root_steps == [0, 1]  # each decode call is a step
    logits = [n for n in trace.nodes() if n.module_path == "Llama.result_output"]
    assert [list(trace.load(n.outputs()[0]).shape) for n in logits] == [[4, 300], [4, 300]]
    runtime = json.loads((tmp_path / "t" / "tracediff_metadata.json").read_text())["runtime"]
    assert runtime["kv_cache_type"] == {"k": "f32", "v": "f32"}


def test_bad_gguf_exits_2(run: GgufRun, tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)
    code, text = _cli(["capture", str(broken), "--inputs", str(run.inputs()), "--out", str(tmp_path / "o")])
    assert code == 2
    assert text.strip().splitlines()[-1] == (f"tracediff capture: error: {broken}: llama.cpp could not load it: "
                                             f"Failed to load model from file: {broken}")
    assert not (tmp_path / "o").exists()
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04zip")
    code, text = _cli(["capture", str(other), "--inputs", str(run.inputs()), "--out", str(tmp_path / "o")])
    assert code == 2
    assert text.strip() == (f"tracediff capture: error: {other}: not a GGUF file "
                            "(it starts with b'PK\\x03\\x04', not b'GGUF')")


def test_inputs_without_token_ids_exit_2(run: GgufRun, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    wrong = tmp_path / "wrong.safetensors"
    save_file({"args.0": torch.zeros(1, 4), "kwargs.mask": torch.ones(1, 4)}, str(wrong))
    code, text = _cli(["capture", str(run.gguf("clean")), "--inputs", str(wrong), "--out", str(tmp_path / "o")])
    assert code == 2
    assert text.strip() == (f"tracediff capture: error: {wrong}: expected the token ids as kwargs.input_ids or as "
                            "the only integer tensor, found args.0, kwargs.mask")
    assert not (tmp_path / "o").exists()


def _context(gguf: Path) -> int:
    from tracediff.capturing.adapters.llama_cpp import LlamaCppAdapter

    return int(LlamaCppAdapter().load(gguf, {}).n_ctx())


# what llama.cpp fails on inside its decode (llama_decode returned -1, a numpy broadcast error, an OverflowError
# converting to its int32 llama_token) is refused before anything is written, naming the inputs file
@pytest.mark.parametrize(("ids", "problem"), [
    ([5, 7, 300], "token id 300 at position 2 is outside the vocabulary of clean.gguf (300 tokens: ids 0 to 299)"),
    ([5, -1], "token id -1 at position 1 is negative"),
    ([2**31], f"token id {2**31} at position 0 does not fit llama.cpp's 32-bit token ids (at most {2**31 - 1})"),
    ("context", "{n} token ids, more than the context of clean.gguf holds ({context} tokens)"),
    ([5.0, 7.0], "the token ids must be integers, got float32"),
], ids=["outside-vocabulary", "negative", "beyond-int32", "longer-than-context", "floats"])
def test_token_ids_the_model_cannot_decode_exit_2(run: GgufRun, tmp_path: Path, ids: object, problem: str) -> None:
    from safetensors.torch import save_file

    gguf = run.gguf("clean")
    if ids == "context":
        context = _context(gguf)
        ids, problem = [5] * (context + 1), problem.format(n=context + 1, context=context)
    values = torch.tensor([ids], dtype=torch.float32 if isinstance(ids[0], float) else torch.int64)
    inputs = tmp_path / "ids.safetensors"
    save_file({"kwargs.input_ids": values}, str(inputs))
    code, text = _cli(["capture", str(gguf), "--inputs", str(inputs), "--out", str(tmp_path / "o")])
    *before, last = text.strip().splitlines()
    assert (code, last) == (2, f"tracediff capture: error: {inputs}: {problem}")
    # the vocabulary and the context are the loaded model's: llama.cpp's own warning while loading this tiny
    # model (its context padded past the training length) may come first
    assert all(line.startswith("llama_context: ") for line in before), before
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["directory", "FIFO"])
def test_a_model_path_that_is_no_regular_file_exits_2(run: GgufRun, tmp_path: Path, kind: str) -> None:
    import os

    path = tmp_path / "x.gguf"
    if kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)  # opened without blocking: a capture that waited on it would hang here
    code, text = _cli(["capture", str(path), "--inputs", str(run.inputs()), "--out", str(tmp_path / "o")])
    assert (code, text.strip()) == (2, f"tracediff capture: error: {path}: the model file is a {kind}, not a "
                                       "regular file; refused")
    assert not (tmp_path / "o").exists()


def test_llama_cpp_python_without_the_callback_exits_2(run: GgufRun, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(llama_cpp, "ggml_backend_sched_eval_callback")
    code, text = _cli(["capture", str(run.gguf("clean")), "--inputs", str(run.inputs()), "--out", str(tmp_path / "o")])
    assert code == 2
    assert text.strip().startswith(f"tracediff capture: error: llama-cpp-python {LLAMA_CPP_PYTHON} has no eval "
                                   "callback "
                                   "(llama_context_params.cb_eval)")


def test_tracediff_align_and_show_never_import_llama_cpp(f16_cache: Path) -> None:
    code = ("import sys, tracediff; from tracediff.cli.main import main; t = tracediff.load_trace(sys.argv[1]); "
            "main(['show', sys.argv[1]]); tracediff.align(sys.argv[1], sys.argv[1]); "
            "assert 'llama_cpp' not in sys.modules, 'imported'")
    result = subprocess.run([sys.executable, "-c", code, str(f16_cache)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_payload_dtypes_kept(f16_cache: Path) -> None:
    trace = load_trace(f16_cache)
    dtypes = {record.dtype for node in trace.nodes() for record in node.outputs()}
    assert {"torch.float32", "torch.float16", "torch.int32"} <= dtypes or {"torch.float32", "torch.float16"} <= dtypes
    node = next(n for n in trace.nodes() if n.module_path == "Llama.embd")
    assert np.isfinite(trace.load(node.outputs()[0]).numpy()).all()


def test_a_view_is_read_when_asked_and_declined(run: GgufRun, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A view ggml computes nothing for is recorded when ggml asks about it and declined, so that ggml computes
    it with the next node instead of as a graph of its own; every other node is wanted, then recorded once."""
    from tracediff.capturing.adapters import llama_cpp as adapter
    from tracediff.capturing.adapters.ggml_tensor import EMPTY_OPS, GgmlTensor

    answers: list[tuple[str, bool, bool]] = []  # (op, ask, answer)
    on_node = adapter.GraphRecording._on_node

    def logged(self: adapter.GraphRecording, address: int, ask: bool, user_data: object) -> bool:
        answer = on_node(self, address, ask, user_data)
        answers.append((self._lib.op(GgmlTensor.from_address(address)), ask, answer))
        return answer

    monkeypatch.setattr(adapter.GraphRecording, "_on_node", logged)
    llm = llama_cpp.Llama(model_path=str(run.gguf("clean")), n_ctx=64, logits_all=True, verbose=False)
    with tracediff.capture(llm, tmp_path / "t") as session:
        llm.eval(TOKENS[0].tolist())
    assert session.complete and GgmlTensor.op.offset > 0
    declined = [op for op, ask, answer in answers if ask and not answer]
    assert declined and set(declined) <= EMPTY_OPS
    told = [op for op, ask, _ in answers if not ask]
    assert all(answer for _, ask, answer in answers if not ask)  # False after a compute would stop the graph
    assert not set(told) & EMPTY_OPS and len(told) + len(declined) == session.calls - 1  # the step aside
    ops = [node.module_type for node in load_trace(tmp_path / "t").nodes() if node.graph]
    assert sorted(ops) == sorted(told + declined)


def test_views_hold_their_sources_values(f16_cache: Path) -> None:
    """A view read when ggml asks about it holds its source's values as computed: a reshape the same
    elements in the same order, a permute or transpose the same elements."""
    trace = load_trace(f16_cache)
    checked: dict[str, int] = {}
    for node in trace.nodes():
        if node.module_type not in ("RESHAPE", "PERMUTE", "TRANSPOSE") or not node.inputs():
            continue
        source, view = trace.load(node.inputs()[0]).float(), trace.load(node.outputs()[0]).float()
        if node.module_type == "RESHAPE":
            assert torch.equal(view.flatten(), source.flatten()), node.module_path
        else:
            assert torch.equal(view.flatten().sort().values, source.flatten().sort().values), node.module_path
        checked[node.module_type] = checked.get(node.module_type, 0) + 1
    assert checked.get("RESHAPE", 0) >= 4 and checked.get("PERMUTE", 0) >= 2, checked


def _payloads(trace_dir: Path) -> list[tuple[str, int, torch.Tensor]]:
    trace = load_trace(trace_dir)
    return [(node.module_path, node.call_index, trace.load(record)) for node in trace.nodes() if node.graph
            for record in node.outputs()]


def test_op_names_and_dimensions_are_ggmls_own() -> None:
    """A node's op name, kept once per op and first parameter, is what ggml's ``ggml_op_desc`` says of it:
    each unary and GLU op by its own name (``SILU``, ``GELU``, ``SWIGLU``...), not the first one seen; and the
    dimensions counted in Python are ``ggml_n_dims``'s."""
    import ctypes

    from tracediff.capturing.adapters.ggml_tensor import MAX_DIMS, GgmlTensor, n_dims
    from tracediff.capturing.adapters.llama_cpp import _ggml

    lib = _ggml(llama_cpp)
    handle = lib._handle
    desc = handle.ggml_op_desc
    desc.argtypes, desc.restype = [ctypes.c_void_p], ctypes.c_char_p
    ggml_dims = handle.ggml_n_dims
    ggml_dims.argtypes, ggml_dims.restype = [ctypes.c_void_p], ctypes.c_int
    op_name = handle.ggml_op_name
    op_name.argtypes, op_name.restype = [ctypes.c_int], ctypes.c_char_p
    ops: dict[str, int] = {}
    while "GLU" not in ops:  # ggml_op_name reads its table unchecked: stop at GLU, the last op before GGML_OP_COUNT
        name = (op_name(len(ops)) or b"").decode("ascii", "replace")
        assert name.replace("_", "").isalnum() and len(ops) < 200, f"op {len(ops)}: {name!r}"
        ops[name] = len(ops)
    seen: dict[str, set[str]] = {}
    # ABS, SGN, NEG, STEP, TANH, ELU, RELU, SIGMOID; REGLU, GEGLU, SWIGLU (their name tables are read unchecked too)
    for family, count in (("UNARY", 8), ("GLU", 3)):
        for parameter in range(count):
            tensor = GgmlTensor()
            tensor.op, tensor.op_params[0] = ops[family], parameter
            expected = desc(ctypes.addressof(tensor)).decode()
            assert lib.op(tensor) == expected and lib.op(tensor) == expected  # kept, then read back
            seen.setdefault(family, set()).add(expected)
    assert len(seen["UNARY"]) == 8 and len(seen["GLU"]) == 3
    tensor = GgmlTensor()
    tensor.op = ops["MUL_MAT"]
    assert lib.op(tensor) == "MUL_MAT"
    for ne in ((1, 1, 1, 1), (5, 1, 1, 1), (1, 5, 1, 1), (5, 5, 1, 1), (5, 1, 5, 1), (5, 5, 5, 5), (1, 1, 1, 5),
               (0, 1, 1, 1), (5, 0, 1, 1)):
        tensor = GgmlTensor()
        for i in range(MAX_DIMS):
            tensor.ne[i] = ne[i]
        assert n_dims(tensor) == ggml_dims(ctypes.addressof(tensor)), ne


@pytest.mark.parametrize("cache", ["f16", "q8_0"])  # the K cache
def test_a_node_in_a_device_buffer_is_copied_out_by_ggml(run: GgufRun, tmp_path: Path, cache: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose buffer is no host buffer (layers offloaded to a GPU: its ``data`` is the device's address)
    is copied to the host by ggml's ``ggml_backend_tensor_get``, never read where it lies. On the CPU backend
    every node is in host memory and read in place; taken for a device's here, every node is copied out by
    its buffer's own backend, and the trace holds the same bytes (a quantized KV cache's views dequantized
    from the copy)."""
    from tracediff.capturing.adapters.ggml_tensor import GgmlLibrary

    kv = {"type_k": 8} if cache == "q8_0" else {}  # a quantized V cache needs flash attention
    tokens = TOKENS[0].tolist()
    hosts: list[bool] = []
    in_host_memory = GgmlLibrary.in_host_memory

    def noted(self: GgmlLibrary, tensor: object) -> bool:
        hosts.append(in_host_memory(self, tensor))  # type: ignore[arg-type]
        return hosts[-1]

    monkeypatch.setattr(GgmlLibrary, "in_host_memory", noted)
    llm = llama_cpp.Llama(model_path=str(run.gguf("clean")), n_ctx=64, logits_all=True, verbose=False, **kv)
    with tracediff.capture(llm, tmp_path / "in-place") as session:
        llm.eval(tokens)
    assert session.complete and hosts and all(hosts)

    copied: list[int] = []
    copy_to_host = GgmlLibrary.copy_to_host

    def counted(self: GgmlLibrary, tensor: object) -> object:
        copied.append(1)
        return copy_to_host(self, tensor)  # type: ignore[arg-type]

    monkeypatch.setattr(GgmlLibrary, "in_host_memory", lambda self, tensor: False)
    monkeypatch.setattr(GgmlLibrary, "copy_to_host", counted)
    with tracediff.capture(llm, tmp_path / "copied") as session:
        llm.eval(tokens)
    assert session.complete and len(copied) == session.calls - 1  # every node, the step aside
    in_place, through_ggml = _payloads(tmp_path / "in-place"), _payloads(tmp_path / "copied")
    assert [(path, index) for path, index, _ in in_place] == [(path, index) for path, index, _ in through_ggml]
    for (path, index, a), (_, _, b) in zip(in_place, through_ggml):
        assert a.dtype == b.dtype and a.shape == b.shape, (path, index)
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), (path, index)
    if cache == "q8_0":
        trace = load_trace(tmp_path / "copied")
        assert any(node.attributes.get("dequantized") for node in trace.nodes() if node.graph)
