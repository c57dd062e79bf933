"""``tracediff.capture``: call indices, payload naming, parent outputs, deduplication, typed args, outputs."""

from __future__ import annotations

import datetime
import json
import platform
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import tracediff
from tests.capturing.helpers import files, find, metadata, nodes, payload, tensor_entries, trace_json
from tests.models import (
    Chain,
    Containers,
    EmitAll,
    KwargsModel,
    OutputKinds,
    Recursive,
    SharedLoop,
    seeded,
    toy_input,
)


def _payloads(folder: Path) -> set[str]:
    return {name for name in files(folder) if name.endswith(".safetensors")}


def test_every_node_has_call_index_and_type_on_llama(tiny_llama, tmp_path: Path) -> None:
    model, inputs = tiny_llama
    with tracediff.capture(model, tmp_path) as session:
        model(**inputs)
    tree = trace_json(tmp_path)
    all_nodes = list(nodes(tree))
    assert session.complete and session.calls == len(all_nodes)
    assert all(isinstance(n["call_index"], int) for n in all_nodes)
    types = {n["module_path"]: n["module_type"] for n in all_nodes}
    assert types["LlamaForCausalLM"] == "LlamaForCausalLM"
    assert types["LlamaForCausalLM.model.layers.2.mlp.down_proj"] == "Linear"
    # Every module that has a forward ran once, and is in the tree (no pruning by default).
    expected = {"LlamaForCausalLM" + (f".{name}" if name else "") for name, m in model.named_modules()
                if not isinstance(m, nn.ModuleList)}
    assert set(types) == expected
    assert all(n["call_index"] == 0 for n in all_nodes)
    # Parents keep their outputs: the decoder layers and the root.
    assert find(tree, "LlamaForCausalLM.model.layers.1")[0]["outputs"]["stats"]["numel"] == 6 * 16
    assert "logits" in tree["outputs"]


def test_shared_layer_gets_call_indices_and_its_own_payload_per_call(tmp_path: Path) -> None:
    model, x = seeded(SharedLoop), toy_input()
    with tracediff.capture(model, tmp_path):
        model(x)
    tree = trace_json(tmp_path)
    calls = find(tree, "SharedLoop.shared")
    assert [c["call_index"] for c in calls] == [0, 1, 2]
    assert [c["outputs"]["value"] for c in calls] == [
        "./SharedLoop.shared_outputs.safetensors",
        "./SharedLoop.shared@1_outputs.safetensors",
        "./SharedLoop.shared@2_outputs.safetensors",
    ]
    assert calls[1]["inputs"]["args"][0]["value"] == "./SharedLoop.shared@1_inputs_args_0.safetensors"
    # Each file holds that call's data, recomputed here step by step.
    with torch.no_grad():
        h = x
        for call in calls:
            assert torch.equal(payload(tmp_path, call["inputs"]["args"][0]), h)
            y = model.shared(h)
            assert torch.equal(payload(tmp_path, call["outputs"]), y)
            h = torch.tanh(y)
        assert torch.equal(payload(tmp_path, tree["outputs"]), model.head(h))


def test_recursion_nests_calls_of_one_path(tmp_path: Path) -> None:
    model, x = seeded(Recursive), toy_input()
    with tracediff.capture(model, tmp_path):
        out = model(x, depth=2)
    tree = trace_json(tmp_path)
    chain = [tree]
    while chain[-1].get("children"):
        chain.append(chain[-1]["children"][-1])
    assert [(n["module_path"], n["call_index"]) for n in chain] == [
        ("Recursive", 0), ("Recursive", 1), ("Recursive", 2), ("Recursive.step", 2)]
    assert [n["inputs"].get("kwargs") for n in chain[:3]] == [
        {"depth": {"py_type": "int", "py_value": 2}},
        {"depth": {"py_type": "int", "py_value": 1}},
        {"depth": {"py_type": "int", "py_value": 0}},
    ]
    assert [c["call_index"] for c in find(tree, "Recursive.step")] == [0, 1, 2]
    # The innermost call's output is the model's output, recorded once.
    assert chain[1]["outputs"] == chain[2]["outputs"] == tree["outputs"]
    assert torch.equal(payload(tmp_path, tree["outputs"]), out)


def test_containers_keep_parent_outputs_and_module_types(tmp_path: Path) -> None:
    model, x = seeded(Containers), toy_input()
    with tracediff.capture(model, tmp_path):
        out = model(x)
    tree = trace_json(tmp_path)
    assert [c["module_path"] for c in tree["children"]] == [
        "Containers.blocks.0", "Containers.blocks.1", "Containers.blocks.2", "Containers.heads.cls",
        "Containers.heads.reg"]
    block = find(tree, "Containers.blocks.1")[0]
    assert block["module_type"] == "Sequential"
    assert [c["module_type"] for c in block["children"]] == ["Linear", "ReLU"]
    assert torch.equal(payload(tmp_path, block["outputs"]), model.blocks[1](model.blocks[0](x)).detach())
    assert set(tree["outputs"]) == {"cls", "reg"}
    for key in ("cls", "reg"):
        assert torch.equal(payload(tmp_path, tree["outputs"][key]), out[key].detach())


def test_tensor_passed_between_modules_is_written_once(tmp_path: Path) -> None:
    model, x = seeded(Chain), toy_input()
    with tracediff.capture(model, tmp_path) as session:
        model(x)
    tree = trace_json(tmp_path)
    a, b = find(tree, "Chain.a")[0], find(tree, "Chain.b")[0]
    assert a["outputs"] == b["inputs"]["args"][0]
    assert a["outputs"]["value"] == "./Chain.a_outputs.safetensors"
    assert tree["inputs"]["args"][0] == a["inputs"]["args"][0]
    assert tree["outputs"]["value"] == b["outputs"]["value"] == "./Chain.b_outputs.safetensors"
    assert _payloads(tmp_path) == {"Chain_inputs_args_0.safetensors", "Chain.a_outputs.safetensors",
                                   "Chain.b_outputs.safetensors"}
    assert session.files == 3
    assert session.payload_bytes == sum(t["stats"]["numel"] * 4 for t in (tree["inputs"]["args"][0],
                                                                         a["outputs"], b["outputs"]))


def test_tensor_changed_in_place_is_written_again(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True)), toy_input()
    with tracediff.capture(model, tmp_path):
        out = model(x)
    tree = trace_json(tmp_path)
    linear, relu = tree["children"]
    before = payload(tmp_path, linear["outputs"])
    assert relu["inputs"]["args"][0]["value"] == linear["outputs"]["value"]  # same tensor, not yet changed
    assert relu["outputs"]["value"] != linear["outputs"]["value"]
    assert (before < 0).any()
    assert torch.equal(payload(tmp_path, relu["outputs"]), out.detach())
    assert torch.equal(before.clamp(min=0), out.detach())


def test_typed_non_tensor_arguments(tmp_path: Path) -> None:
    class Marker:
        pass

    model, x = seeded(KwargsModel), toy_input()
    mask = torch.tensor([[True, False, True, True], [True, True, True, False]])
    with tracediff.capture(model, tmp_path):
        model(x, scale=0.5, mode="mul", sizes=(2, 3), mask=mask, extra=Marker())
    kwargs = trace_json(tmp_path)["inputs"]["kwargs"]
    assert kwargs["scale"] == {"py_type": "float", "py_value": 0.5}
    assert kwargs["mode"] == {"py_type": "str", "py_value": "mul"}
    assert kwargs["sizes"] == {"py_type": "tuple", "py_value": [2, 3]}
    assert kwargs["extra"]["py_type"] == "Marker"
    assert re.fullmatch(r"<.*Marker object at 0xXXXXXXXX>", kwargs["extra"]["repr"])
    assert kwargs["mask"]["dtype"] == "torch.bool"
    assert kwargs["mask"]["stats"] == {"numel": 8, "min": 0, "max": 1, "zeros": 2}
    assert torch.equal(payload(tmp_path, kwargs["mask"]), mask)


def test_plain_python_arguments_keep_the_args_kwargs_layout(tmp_path: Path) -> None:
    class Full(nn.Module):
        def forward(self, n: int, fill: float = 0.0) -> torch.Tensor:
            return torch.full((n,), fill)

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.full = Full()

        def forward(self) -> torch.Tensor:
            return self.full(3, fill=1.5) + self.full(2 + 1)

    model = Outer()
    with tracediff.capture(model, tmp_path):
        model()
    tree = trace_json(tmp_path)
    assert tree["inputs"] == {}
    first, second = find(tree, "Outer.full")
    assert first["inputs"] == {"args": [{"py_type": "int", "py_value": 3}],
                               "kwargs": {"fill": {"py_type": "float", "py_value": 1.5}}}
    assert second["inputs"] == {"args": [{"py_type": "int", "py_value": 3}]}


def test_metadata_records_versions_model_devices_dtypes_and_options(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = EmitAll([torch.zeros(3), torch.ones(2, dtype=torch.float64)])
    with tracediff.capture(model, tmp_path, tensors="summary") as session:
        model(torch.ones(1))
    meta = metadata(tmp_path)
    assert meta == session.metadata
    assert meta["format_version"] == "1.8"
    assert meta["tracediff_version"] == tracediff.__version__
    assert meta["torch_version"] == torch.__version__
    assert meta["transformers_version"] == transformers.__version__
    assert meta["python_version"] == platform.python_version()
    assert meta["model_class"] == "tests.models.EmitAll" and meta["model_name"] == "EmitAll"
    assert meta["devices"] == ["cpu"]
    assert meta["dtypes"] == ["torch.float32", "torch.float64"]
    assert (meta["world_size"], meta["rank"]) == (1, 0)
    assert meta["options"] == {"tensors": "summary", "prune_layers": False, "verify": False, "ranks": 0,
                               "full_dtensor": False, "backward": False, "ops": None, "payload_pipeline": None,
                               "teacher_forcing": None, "steps": None, "compiled": "modules"}
    assert meta["complete"] is True and meta["error"] is None and meta["capture_failure"] is None
    assert meta["calls"] == session.calls == 3
    assert meta["payload_files"] == meta["payload_bytes"] == 0
    assert meta["verification"] is None
    created = datetime.datetime.fromisoformat(meta["created"])
    assert abs(datetime.datetime.now(datetime.timezone.utc) - created) < datetime.timedelta(minutes=5)


def test_repeated_top_level_calls_are_subsequent_calls(tmp_path: Path) -> None:
    model = seeded(Chain)
    x1, x2 = toy_input(1), toy_input(2)
    with tracediff.capture(model, tmp_path):
        out1 = model(x1)
        out2 = model(x2)
    tree = trace_json(tmp_path)
    (later,) = tree["subsequent_calls"]
    assert (tree["call_index"], later["call_index"]) == (0, 1)
    assert later["outputs"]["value"] == "./Chain.b@1_outputs.safetensors"
    assert later["inputs"]["args"][0]["value"] == "./Chain@1_inputs_args_0.safetensors"
    assert torch.equal(payload(tmp_path, tree["outputs"]), out1.detach())
    assert torch.equal(payload(tmp_path, later["outputs"]), out2.detach())


def test_returns_the_same_object_and_keeps_autograd(tmp_path: Path) -> None:
    sentinel = {}

    class Remember(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Chain()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            sentinel["out"] = self.inner(x)
            return sentinel["out"]

    torch.manual_seed(0)
    model, x = Remember(), toy_input()
    with tracediff.capture(model, tmp_path):
        out = model(x)
    assert out is sentinel["out"]
    assert out.requires_grad and out.grad_fn is not None
    out.square().sum().backward()
    captured_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(captured_grads, model.parameters()))


def _module_state(model: nn.Module) -> dict[str, object]:
    return {name: (sorted(m.__dict__), m._forward_hooks.copy(), m._forward_pre_hooks.copy(),
                   m.__dict__.get("forward")) for name, m in model.named_modules()}


def test_model_is_restored_exactly(tmp_path: Path) -> None:
    model = seeded(Containers)
    model.blocks[0].forward = model.blocks[0].forward  # an instance attribute of its own: kept as is
    before = _module_state(model)
    global_hooks = (dict(nn.modules.module._global_forward_hooks), dict(nn.modules.module._global_forward_pre_hooks))
    with tracediff.capture(model, tmp_path):
        assert all("forward" in m.__dict__ for m in model.modules())
        model(toy_input())
    assert _module_state(model) == before
    assert (dict(nn.modules.module._global_forward_hooks), dict(nn.modules.module._global_forward_pre_hooks)) == \
        global_hooks


def test_model_is_restored_when_forward_raises(tmp_path: Path) -> None:
    from tests.models import FailsInside

    model = seeded(FailsInside)
    before = _module_state(model)
    with pytest.raises(ValueError), tracediff.capture(model, tmp_path):
        model(toy_input())
    assert _module_state(model) == before


def test_summary_mode_writes_no_payloads(tmp_path: Path) -> None:
    model, x = seeded(Chain), toy_input()
    with tracediff.capture(model, tmp_path, tensors="summary") as session:
        model(x)
    assert _payloads(tmp_path) == set() and session.files == 0 and session.payload_bytes == 0
    entries = list(tensor_entries(trace_json(tmp_path)))
    assert entries and all("value" not in e and e["stats"]["numel"] > 0 for e in entries)
    assert trace_json(tmp_path) == trace_json(tmp_path, "SUMMARY")


def test_repr_mode_writes_the_lines_transformers_writes(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model, x = seeded(Chain), toy_input()
    torch.set_printoptions(sci_mode=False, linewidth=60)  # the lines must not depend on these
    with tracediff.capture(model, tmp_path / "native", tensors="repr"):
        model(x)
    torch.set_printoptions(profile="default")
    assert _payloads(tmp_path / "native") == set()
    with transformers.model_addition_debugger_context(model, debug_path=str(tmp_path / "hf"), use_repr=True):
        model(x)
    ours, theirs = trace_json(tmp_path / "native"), trace_json(tmp_path / "hf")
    assert find(ours, "Chain.a")[0]["outputs"]["value"] == find(theirs, "Chain.a")[0]["outputs"]["value"]
    lines = find(ours, "Chain.b")[0]["outputs"]["value"]
    assert lines[0].startswith("tensor([[") and re.search(r"\de[+-]\d\d", lines[0])


@pytest.mark.parametrize("kind", OutputKinds.KINDS)
def test_output_kinds(kind: str, tmp_path: Path) -> None:
    if kind == "model_output":
        pytest.importorskip("transformers")
    model, x = OutputKinds(kind), toy_input()
    with tracediff.capture(model, tmp_path):
        out = model(x)
    encoded = trace_json(tmp_path)["outputs"]
    y = model.proj(x).detach()
    if kind == "none":
        assert out is None and encoded == {"py_type": "NoneType", "py_value": None}
        return
    if kind == "tensor":
        assert torch.equal(payload(tmp_path, encoded), y)
        return
    if kind in ("tuple", "list"):
        first, second = encoded
        assert second["value"] == "./OutputKinds_outputs_1.safetensors"
    elif kind == "dict":
        assert list(encoded) == ["y", "z"]
        first, second = encoded["y"], encoded["z"]
        assert second["value"] == "./OutputKinds_outputs_z.safetensors"
    elif kind == "model_output":
        assert list(encoded) == ["last_hidden_state", "hidden_states"]
        first = encoded["last_hidden_state"]
        assert encoded["hidden_states"][0] == first  # the same tensor, once
        second = encoded["hidden_states"][1]
        assert second["value"] == "./OutputKinds_outputs_hidden_states_1.safetensors"
    else:
        assert list(encoded) == ["first", "second", "label"]
        assert encoded["label"] == {"py_type": "str", "py_value": "pair"}
        first, second = encoded["first"], encoded["second"]
        assert second["value"] == "./OutputKinds_outputs_second.safetensors"
    assert first["value"] == "./OutputKinds.proj_outputs.safetensors"  # the leaf's output, reused
    assert torch.equal(payload(tmp_path, first), y)
    assert torch.equal(payload(tmp_path, second), y * 2)


def test_prune_layers_keeps_first_and_last_layer(tiny_llama, tmp_path: Path) -> None:
    model, inputs = tiny_llama
    with tracediff.capture(model, tmp_path, prune_layers=True):
        model(**inputs)
    layers = [n["module_path"] for n in find(trace_json(tmp_path), "LlamaForCausalLM.model")[0]["children"]
              if n["module_path"].split(".")[-1].isdigit()]
    assert layers == ["LlamaForCausalLM.model.layers.0", "LlamaForCausalLM.model.layers.2"]
    assert metadata(tmp_path)["options"]["prune_layers"] is True


def test_summary_json_is_full_json_without_values(tmp_path: Path) -> None:
    model = seeded(SharedLoop)
    with tracediff.capture(model, tmp_path):
        model(toy_input())
    full, summary = trace_json(tmp_path), trace_json(tmp_path, "SUMMARY")
    assert "value" not in json.dumps(summary).replace('"py_value"', "")
    for entry in tensor_entries(full):
        entry.pop("value")
    assert full == summary


def test_rejects_unknown_tensor_mode(tmp_path: Path) -> None:
    with pytest.raises(tracediff.UsageError, match=r"^tensors='all': expected one of full, summary, repr$"):
        with tracediff.capture(seeded(Chain), tmp_path, tensors="all"):  # type: ignore[arg-type]
            pass
    assert not tmp_path.joinpath("tracediff_metadata.json").exists()


def test_keys_that_sanitize_to_the_same_file_name_keep_their_own_payloads(tmp_path: Path) -> None:
    class TwoKeys(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"a b": x + 1, "a_b": x + 2}

    model, x = TwoKeys(), torch.zeros(2)
    with tracediff.capture(model, tmp_path):
        model(x)
    outputs = trace_json(tmp_path)["outputs"]
    assert torch.equal(payload(tmp_path, outputs["a b"]), x + 1)
    assert torch.equal(payload(tmp_path, outputs["a_b"]), x + 2)
