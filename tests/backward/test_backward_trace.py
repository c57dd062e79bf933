"""capture(backward=True): gradients per module call, read back and aligned in backward order."""

from __future__ import annotations

import json

import torch
from torch import nn

import tracediff
from tests.models import SharedLoop, seeded, tiny_llama, toy_input


def _capture_backward(model: nn.Module, out, x: torch.Tensor, *, grad_hook=None) -> tracediff.CaptureSession:
    handle = model.register_full_backward_hook(grad_hook) if grad_hook else None
    try:
        with tracediff.capture(model, out, backward=True) as session:
            model(x).sum().backward()
    finally:
        if handle is not None:
            handle.remove()
    return session


def test_grads_are_recorded_per_call_with_the_values_autograd_computes(tmp_path):
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    torch.manual_seed(0)
    x = torch.randn(5, 4, requires_grad=True)
    _capture_backward(model, tmp_path / "t", x)

    trace = tracediff.load_trace(tmp_path / "t")
    order = [(n.relative_path, n.phase) for n in trace.backward]
    assert order == [("", "backward"), ("2", "backward"), ("1", "backward"), ("0", "backward")]
    last = next(n for n in trace.backward if n.relative_path == "2")
    grad_out = trace.load(next(r for r in last.tensors if r.slot == "grad_outputs.0"))
    assert torch.equal(grad_out, torch.ones(5, 2))  # d(sum)/d(output)
    first = next(n for n in trace.backward if n.relative_path == "0")
    grad_in = trace.load(next(r for r in first.tensors if r.slot == "grad_inputs.0"))
    assert torch.equal(grad_in, x.grad)


def test_backward_records_come_after_forward_and_in_arrival_order(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    _capture_backward(model, tmp_path / "t", torch.randn(2, 4))
    records = tracediff.load_trace(tmp_path / "t").records()
    slots = [(node.relative_path, record.slot) for node, record in records]
    last_forward = max(i for i, (_, slot) in enumerate(slots) if not slot.startswith("grad"))
    first_backward = min(i for i, (_, slot) in enumerate(slots) if slot.startswith("grad"))
    assert last_forward < first_backward
    backward = [s for s in slots if s[1].startswith("grad")]
    assert backward.index(("1", "grad_outputs.0")) < backward.index(("1", "grad_inputs.0")) \
        < backward.index(("0", "grad_outputs.0"))


def test_repeated_calls_get_backward_call_indices_in_reverse(tmp_path):
    model = seeded(SharedLoop)
    _capture_backward(model, tmp_path / "t", toy_input())
    trace = tracediff.load_trace(tmp_path / "t")
    shared = [n for n in trace.backward if n.relative_path == "shared"]
    assert [n.call_index for n in shared] == [2, 1, 0]
    files = {r.payload for n in shared for r in n.tensors}
    # Three calls' grad_outputs and grad_inputs, none overwritten; the first call's input needs no grad.
    assert len(files) == 5
    assert [r.slot for r in shared[2].tensors] == ["grad_outputs.0"]
    assert shared[2].values == {"grad_inputs": [None]}


def test_hooks_are_removed_and_the_summary_has_no_payload_paths(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    _capture_backward(model, tmp_path / "t", torch.randn(2, 4))
    for module in model.modules():
        assert not module._backward_hooks and not module._backward_pre_hooks
    summary = json.loads(next((tmp_path / "t").glob("*_SUMMARY.json")).read_text())
    assert summary["backward"] and not _keys_named("value", summary["backward"])


def _keys_named(name: str, value) -> list:
    if isinstance(value, dict):
        return [k for k in value if k == name] + [x for v in value.values() for x in _keys_named(name, v)]
    if isinstance(value, list):
        return [x for v in value for x in _keys_named(name, v)]
    return []


def test_align_names_the_first_module_whose_gradient_diverges(tmp_path):
    model, inputs = tiny_llama(layers=2)
    ids = inputs["input_ids"]

    def run(out, hook=None):
        fresh, _ = tiny_llama(layers=2)
        target = fresh.model.layers[0].mlp.down_proj
        handle = target.register_full_backward_hook(hook) if hook else None
        with tracediff.capture(fresh, out, backward=True):
            fresh(input_ids=ids, labels=ids).loss.backward()
        if handle:
            handle.remove()

    run(tmp_path / "a")
    run(tmp_path / "b", hook=lambda module, grad_in, grad_out: (grad_in[0] * 1.01,))

    result = tracediff.align(tmp_path / "a", tmp_path / "b")
    assert not result.passed
    first = result.first_backward_divergence
    assert first is not None
    assert (first.module_path_b, first.tensor, first.origin) == (
        "LlamaForCausalLM.model.layers.0.mlp.down_proj", "grad_inputs.0", "introduced")
    assert first is result.first_divergence  # the forward pass is identical
    forward_rows = result.table[~result.table.tensor.str.startswith("grad")]
    assert (forward_rows.status == "identical").all()
    assert tracediff.align(tmp_path / "a", tmp_path / "a").passed


def _llama_grads(*, capture_to=None, backward=False, noop_backward_hooks=False) -> list[torch.Tensor]:
    model, inputs = tiny_llama(layers=1)
    ids = inputs["input_ids"]
    handles = [m.register_full_backward_hook(lambda *args: None) for m in model.modules()] \
        if noop_backward_hooks else []
    if capture_to is not None:
        with tracediff.capture(model, capture_to, backward=backward):
            model(input_ids=ids, labels=ids).loss.backward()
    else:
        model(input_ids=ids, labels=ids).loss.backward()
    for handle in handles:
        handle.remove()
    return [p.grad.clone() for p in model.parameters()]


def test_forward_capture_leaves_gradients_bit_identical(tmp_path):
    for plain, captured in zip(_llama_grads(), _llama_grads(capture_to=tmp_path / "t")):
        assert torch.equal(plain, captured)


def test_backward_capture_changes_gradients_only_as_full_backward_hooks_do(tmp_path):
    # PyTorch's full backward hooks alone reorder some gradient accumulations (last-bit
    # differences); recording through them must add nothing on top of that.
    hooked = _llama_grads(noop_backward_hooks=True)
    recorded = _llama_grads(capture_to=tmp_path / "t", backward=True)
    for with_hooks, captured, plain in zip(hooked, recorded, _llama_grads()):
        assert torch.equal(with_hooks, captured)
        torch.testing.assert_close(captured, plain)


def test_cli_capture_backward_records_gradients(tmp_path, capsys):
    from tracediff.cli.main import main

    script = tmp_path / "spec.py"
    script.write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()), torch.randn(2, 4)\n"
    )
    assert main(["capture", f"{script}:build", "--out", str(tmp_path / "t"), "--backward"]) == 0
    trace = tracediff.load_trace(tmp_path / "t")
    assert [n.relative_path for n in trace.backward] == ["", "1", "0"]
    assert main(["align", str(tmp_path / "t"), str(tmp_path / "t")]) == 0
