"""Op-level capture: op nodes under their module call, filters, no double recording, clean exit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tracediff
from tests.capturing.helpers import find, metadata, nodes, trace_json
from tests.format.conformance import check_folder
from tests.models import Chain, SharedLoop
from tracediff.cli.main import main
from tracediff.errors import UsageError


def _ops(node: dict) -> list[dict]:
    return [child for child in node.get("children", []) if "op" in child]


def _modules(node: dict) -> list[dict]:
    return [child for child in node.get("children", []) if "op" not in child]


class Block(nn.Module):
    """Own ops around two submodule calls, a view and a shape query in between."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x)) * 2.0
        y = y.view(-1, 4).reshape(x.shape[0], x.size(1))
        return F.softmax(self.b(y) + x, dim=-1)


def test_ops_are_children_of_their_module_call_in_call_order(tmp_path: Path) -> None:
    model, x = Block().eval(), torch.randn(3, 4)
    with tracediff.capture(model, tmp_path, ops=True) as session:
        model(x)
    tree = trace_json(tmp_path)
    kinds = [c.get("op") or c["module_path"] for c in tree["children"]]
    assert kinds == ["Block.a", "torch.relu", "torch.Tensor.mul", "Block.b", "torch.Tensor.add",
                     "torch.nn.functional.softmax"]
    own = _ops(tree)
    assert [op["op_index"] for op in own] == [0, 1, 2, 3]
    assert all(op["module_path"] == "Block" and op["call_index"] == 0 for op in own)
    mul = own[1]
    assert mul["inputs"]["args"][1] == {"py_type": "float", "py_value": 2.0}
    assert mul["inputs"]["args"][0]["value"] == own[0]["outputs"]["value"]  # one payload, shared
    assert tree["outputs"]["value"] == own[3]["outputs"]["value"]
    (linear,) = _ops(next(node for node in find(tree, "Block.a") if "op" not in node))
    assert linear["op"] == "torch.nn.functional.linear"
    assert session.ops == 6  # 4 in Block, one F.linear in each Linear
    assert metadata(tmp_path)["options"]["ops"] == {"include": None, "exclude": [], "inside": [], "min_numel": 0}


def test_no_op_is_recorded_twice(tmp_path: Path) -> None:
    model, x = Chain().eval(), torch.randn(2, 4)
    with tracediff.capture(model, tmp_path, ops=True):
        model(x)
    tree = trace_json(tmp_path)
    assert _ops(tree) == []  # Chain's own code only calls submodules
    op_nodes = [op for node in nodes(tree) for op in _ops(node)]
    assert [(op["module_path"], op["op"]) for op in op_nodes] == [
        ("Chain.a", "torch.nn.functional.linear"), ("Chain.b", "torch.nn.functional.linear")]
    outputs = [op["outputs"]["value"] for op in op_nodes]
    assert len(outputs) == len(set(outputs))


def test_ops_inside_a_module_called_several_times_keep_call_indices(tmp_path: Path) -> None:
    model, x = SharedLoop().eval(), torch.randn(2, 4)
    with tracediff.capture(model, tmp_path, ops=True):
        model(x)
    tree = trace_json(tmp_path)
    calls = [node for node in find(tree, "SharedLoop.shared") if "op" not in node]
    assert [[(op["call_index"], op["op_index"]) for op in _ops(call)] for call in calls] == [[(0, 0)], [(1, 0)],
                                                                                              [(2, 0)]]
    assert [op["op"] for op in _ops(tree)] == ["torch.tanh"] * 3
    assert [op["op_index"] for op in _ops(tree)] == [0, 1, 2]
    payloads = [_ops(call)[0]["outputs"]["value"] for call in calls]
    assert payloads == ["./SharedLoop.shared_op0_linear_outputs.safetensors",
                        "./SharedLoop.shared@1_op0_linear_outputs.safetensors",
                        "./SharedLoop.shared@2_op0_linear_outputs.safetensors"]
    trace = tracediff.load_trace(tmp_path)
    loaded = [node for node in trace.nodes() if node.module_path == "SharedLoop.shared"]
    assert [(n.call_index, [(o.op, o.op_index, o.call_index) for o in n.ops]) for n in loaded] == [
        (k, [("torch.nn.functional.linear", 0, k)]) for k in range(3)]


def test_filters_select_ops_by_name_and_by_module(tmp_path: Path) -> None:
    model, x = Block().eval(), torch.randn(3, 4)

    def recorded(folder: Path, **options: object) -> list[tuple[str, str]]:
        with tracediff.capture(model, folder, **options):  # type: ignore[arg-type]
            model(x)
        return sorted((op["module_path"], op["op"]) for node in nodes(trace_json(folder)) for op in _ops(node))

    assert recorded(tmp_path / "include", ops=["relu", "torch.nn.functional.*"]) == [
        ("Block", "torch.nn.functional.softmax"), ("Block", "torch.relu"),
        ("Block.a", "torch.nn.functional.linear"), ("Block.b", "torch.nn.functional.linear")]
    assert ("Block", "torch.Tensor.view") in recorded(tmp_path / "views", ops=["view", "reshape"])
    assert recorded(tmp_path / "exclude", ops=True, ops_exclude=["linear", "*.Tensor.*"]) == [
        ("Block", "torch.nn.functional.softmax"), ("Block", "torch.relu")]
    assert recorded(tmp_path / "inside", ops_in="b") == [("Block.b", "torch.nn.functional.linear")]
    assert recorded(tmp_path / "numel", ops=True, ops_min_numel=13) == []


def test_ops_in_covers_the_submodules_of_a_matching_module(tmp_path: Path) -> None:
    model, x = nn.Sequential(Block(), Block()).eval(), torch.randn(3, 4)
    with tracediff.capture(model, tmp_path, ops_in="Sequential.1"):
        model(x)
    paths = {op["module_path"] for node in nodes(trace_json(tmp_path)) for op in _ops(node)}
    assert paths == {"Sequential.1", "Sequential.1.a", "Sequential.1.b"}


def test_an_ops_in_pattern_matching_no_module_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^ops_in pattern 'blok\.a' matches no module of Block$"):
        with tracediff.capture(Block(), tmp_path / "t", ops_in="blok.a"):
            pass
    assert not (tmp_path / "t").exists()


def test_outputs_and_autograd_are_untouched(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 4)
    expected = model(x)
    expected.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with tracediff.capture(model, tmp_path, ops=True):
        out = model(x)
    out.sum().backward()
    assert torch.equal(out, expected)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))


class Exploding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.tanh(self.inner(x))
        raise RuntimeError("boom after tanh")


def test_capture_with_ops_restores_everything_when_the_forward_raises(tmp_path: Path) -> None:
    model, x = Exploding(), torch.randn(2, 4)
    modes_before = torch._C._len_torch_function_stack()
    with pytest.raises(RuntimeError, match="boom after tanh"):
        with tracediff.capture(model, tmp_path, ops=True) as session:
            model(x)
    assert torch._C._len_torch_function_stack() == modes_before
    assert all("forward" not in module.__dict__ for module in model.modules())
    assert not session.complete and session.error is not None
    tree = trace_json(tmp_path)
    assert [op["op"] for op in _ops(tree)] == ["torch.tanh"]
    assert tree["error"]["type"] == "RuntimeError"
    files = set(tmp_path.iterdir())
    torch.relu(model.inner(x))  # nothing records any more
    assert set(tmp_path.iterdir()) == files


def test_empty_outputs_and_excluded_views_leave_the_forward_alone(tmp_path: Path) -> None:
    class Weird(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.split(x, 1)[0] + torch.zeros(0).sum()

    model = Weird()
    with tracediff.capture(model, tmp_path, ops=True) as session:
        out = model(torch.ones(2, 3))
    assert torch.equal(out, torch.ones(1, 3)) and session.complete


def test_a_trace_with_ops_reads_as_a_standard_trace(tmp_path: Path) -> None:
    model, x = Block().eval(), torch.randn(3, 4)
    with tracediff.capture(model, tmp_path, ops=True):
        model(x)
    trace = tracediff.load_trace(tmp_path)
    assert [n.module_path for n in trace.nodes()] == ["Block", "Block.a", "Block.b"]
    root = trace.roots[0]
    assert [(o.op, o.op_index, o.module_path, o.call_index) for o in root.ops] == [
        ("torch.relu", 0, "Block", 0), ("torch.Tensor.mul", 1, "Block", 0), ("torch.Tensor.add", 2, "Block", 0),
        ("torch.nn.functional.softmax", 3, "Block", 0)]
    assert [t.slot for t in root.ops[1].tensors] == ["inputs.args.0", "outputs"]
    assert root.ops[1].values == {"inputs.args.1": 2.0}
    # a transformers-style reader sees extra children that carry module_path, inputs and outputs
    assert all({"module_path", "inputs", "outputs"} <= set(op) for op in _ops(trace_json(tmp_path)))
    check_folder(tmp_path)  # FULL, SUMMARY and metadata conform to the trace schema (op_node)
    (linear,) = _ops(next(n for n in nodes(trace_json(tmp_path)) if n["module_path"] == "Block.a" and "op" not in n))
    weight = {"py_type": "Parameter", "repr": "Parameter(shape=[4, 4], dtype=torch.float32)"}
    assert linear["inputs"]["args"][1] == weight  # described, not written again


SPEC = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.Linear(4, 4)

    def forward(self, x):
        return torch.sigmoid(self.second(torch.relu(self.first(x))))

def build():
    torch.manual_seed(0)
    return Net(), torch.randn(2, 4)
"""


def test_cli_ops_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "net.py"
    script.write_text(SPEC)
    code = main(["capture", f"{script}:build", "--out", str(tmp_path / "t"), "--ops-in", "first",
                 "--ops-include", "linear"])
    out = capsys.readouterr().out
    assert code == 0 and "captured 3 module calls and 1 ops into" in out
    assert [(n["module_path"], n["op"]) for node in nodes(trace_json(tmp_path / "t")) for n in _ops(node)] == [
        ("Net.first", "torch.nn.functional.linear")]
    assert main(["capture", f"{script}:build", "--out", str(tmp_path / "all"), "--ops"]) == 0
    tree = trace_json(tmp_path / "all")
    assert [op["op"] for op in _ops(tree)] == ["torch.relu", "torch.sigmoid"]
    capsys.readouterr()
    code = main(["capture", f"{script}:build", "--out", str(tmp_path / "bad"), "--ops-in", "secnd"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == ("tracediff capture: error: ops_in pattern 'secnd' matches no module of Net; "
                            "did you mean second?\n")


def test_show_lists_ops_under_their_module_call(tmp_path: Path) -> None:
    from tracediff.render.tree import render_tree
    from tracediff.show import show_trace

    model, x = Block().eval(), torch.randn(3, 4)
    with tracediff.capture(model, tmp_path, ops=True):
        model(x)
    view = show_trace(tmp_path)
    assert [(n.name, n.depth, n.op) for n in view.nodes] == [
        ("Block", 0, None), ("a", 1, None), ("#0 torch.nn.functional.linear", 2, "torch.nn.functional.linear"),
        ("#0 torch.relu", 1, "torch.relu"), ("#1 torch.Tensor.mul", 1, "torch.Tensor.mul"), ("b", 1, None),
        ("#0 torch.nn.functional.linear", 2, "torch.nn.functional.linear"),
        ("#2 torch.Tensor.add", 1, "torch.Tensor.add"),
        ("#3 torch.nn.functional.softmax", 1, "torch.nn.functional.softmax")]
    assert "; 3 calls and 6 ops" in render_tree(view).splitlines()[0]
    assert view.nodes[4].to_dict()["op"] == "torch.Tensor.mul" and "op" not in view.nodes[0].to_dict()


def test_an_in_place_op_records_its_input_before_it_changes(tmp_path: Path) -> None:
    class InPlace(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.clone()
            y.mul_(3.0)
            return y

    model, x = InPlace(), torch.ones(2, 2)
    with tracediff.capture(model, tmp_path, ops=True):
        model(x)
    clone, mul = _ops(trace_json(tmp_path))
    assert (clone["op"], mul["op"]) == ("torch.Tensor.clone", "torch.Tensor.mul_")
    assert mul["inputs"]["args"][0]["stats"]["mean"] == 1.0 and mul["outputs"]["stats"]["mean"] == 3.0
