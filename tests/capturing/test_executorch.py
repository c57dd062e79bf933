"""The ExecuTorch adapter (``tracediff/capturing/adapters/executorch*.py``): an ExecuTorch program run with
ETDump and a debug buffer, every instruction's output recorded with the module scopes its ETRecord gives it,
its op and dataflow; inputs fed by name; untrusted program and ETRecord files refused in one line.

``Tiny`` is exported once per module (portable kernels, and delegated to XNNPACK): an embedding, a bias given
as a second positional input, two residual blocks in a ``ModuleList`` (LayerNorm, Linear, ReLU) and a head,
with a keyword ``use_cache=False`` that the program keeps as a constant.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from tests.capturing.helpers import metadata, nodes, payload, trace_json
from tracediff import format as fmt

pytest.importorskip("executorch.runtime", reason="executorch is not installed (see README: pip install --no-deps "
                    "executorch==1.5.1 and its requirements)")

import tracediff  # noqa: E402
from tracediff.capturing.adapters.executorch_files import module_scopes  # noqa: E402
from tracediff.cli.main import main  # noqa: E402
from tracediff.errors import UsageError  # noqa: E402

IDS = torch.tensor([[1, 2, 7, 3]])


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.proj(self.norm(x)))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.layers, self.head = nn.Embedding(16, 8), nn.ModuleList([Block(), Block()]), nn.Linear(8, 16)

    def forward(self, input_ids: torch.Tensor, bias: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        hidden = self.embed(input_ids) + bias
        for layer in self.layers:
            hidden = layer(hidden)
        return self.head(hidden)


class Exported:
    """``Tiny`` (seeded), one bias, and its export as program bytes and an ETRecord file in ``folder``."""

    def __init__(self, folder: Path, *, xnnpack: bool = False) -> None:
        from executorch.exir import to_edge_transform_and_lower

        torch.manual_seed(0)
        self.model, self.bias = Tiny().eval(), torch.randn(8)
        partitioner: list[Any] = []
        if xnnpack:
            from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

            partitioner = [XnnpackPartitioner()]
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            exported = torch.export.export(self.model, (IDS, self.bias), {"use_cache": False})
            self.manager = to_edge_transform_and_lower(exported, partitioner=partitioner,
                                                       generate_etrecord=True).to_executorch()
        folder.mkdir(parents=True, exist_ok=True)
        self.program, self.etrecord = folder / "tiny.pte", folder / "etrecord.bin"
        self.program.write_bytes(self.manager.buffer)
        self.manager.get_etrecord().save(str(self.etrecord))
        with torch.no_grad():
            self.expected = self.model(IDS, self.bias)

    def inputs_file(self, folder: Path, tensors: dict[str, torch.Tensor] | None = None) -> Path:
        path = folder / "inputs.safetensors"
        save_file(tensors if tensors is not None else {"args.0": IDS, "args.1": self.bias}, str(path))
        return path


@pytest.fixture(scope="module")
def portable(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    return Exported(tmp_path_factory.mktemp("executorch-portable"))


@pytest.fixture(scope="module")
def captured(portable: Exported, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("executorch-trace") / "t"
    session = tracediff.capture_file(portable.program, out, inputs={"args.0": IDS, "args.1": portable.bias},
                                     options={"etrecord": portable.etrecord})
    assert session.complete
    return out


def _recorded(folder: Path) -> list[dict[str, Any]]:
    return [n for n in nodes(trace_json(folder)) if fmt.STEP not in n]


def test_every_output_is_recorded_with_its_scopes_op_and_sources(captured: Path) -> None:
    recorded = _recorded(captured)
    summary = [(n[fmt.MODULE_PATH].removeprefix("ExecuTorchProgram."), n[fmt.MODULE_TYPE], n.get(fmt.NODE_SCOPES))
               for n in recorded]
    block = [("norm.native_layer_norm", "aten.native_layer_norm.default", ["norm"])] * 3 + [
        ("proj.permute_copy", "aten.permute_copy.default", ["proj"]),
        ("proj.addmm", "aten.addmm.default", ["proj"]),
        ("relu", "aten.relu.default", []), ("add", "aten.add.Tensor", [])]
    layers = [(f"layers.{i}.{path}", op, [f"layers.{i}", *(f"layers.{i}.{s}" for s in scopes)])
              for i in (0, 1) for path, op, scopes in block]
    assert summary == [("embed.embedding", "aten.embedding.default", ["embed"]),
                       ("add", "aten.add.Tensor", None),  # the bias is added in Tiny.forward itself: no module
                       *layers,
                       ("head.permute_copy", "aten.permute_copy.default", ["head"]),
                       ("head.addmm", "aten.addmm.default", ["head"]),
                       ("head.view_copy", "aten.view_copy.default", ["head"])]
    embedding, add, norm = recorded[0], recorded[1], recorded[2]
    assert embedding[fmt.SOURCES] == [{"external": "p_embed_weight"}, {"external": "input_ids"}]
    assert add[fmt.SOURCES] == [{"module_path": "ExecuTorchProgram.embed.embedding", "call_index": 0},
                                {"external": "bias"}]
    assert norm[fmt.SOURCES][0] == {"module_path": "ExecuTorchProgram.add", "call_index": 0}
    addmm = recorded[6]  # layer 0's Linear reads the norm's output through a view that ran as no instruction
    assert addmm[fmt.SOURCES][1] == {"module_path": "ExecuTorchProgram.layers.0.norm.native_layer_norm",
                                     "call_index": 0}
    assert addmm[fmt.ATTRIBUTES] == {"instruction": 4, "kernel": "addmm.out", "debug_handle": 4,
                                     "edge_node": "aten_addmm_default"}


def test_the_recorded_values_are_the_programs(captured: Path, portable: Exported) -> None:
    recorded = _recorded(captured)
    logits = payload(captured, recorded[-1][fmt.OUTPUTS])
    assert torch.allclose(logits, portable.expected, rtol=1e-5, atol=1e-6)
    hidden = torch.nn.functional.embedding(IDS, portable.model.embed.weight.detach()) + portable.bias
    assert torch.equal(payload(captured, recorded[1][fmt.OUTPUTS]), hidden)


def test_the_metadata_names_the_runtime_its_kernels_and_the_exporter(captured: Path) -> None:
    import executorch.version

    found = metadata(captured)
    assert (found[fmt.FRAMEWORK], found[fmt.FRAMEWORK_VERSION]) == ("executorch", executorch.version.__version__)
    assert found["model_class"] == "Tiny"
    runtime = found[fmt.RUNTIME]
    assert (runtime["program"], runtime["etrecord"], runtime["method"]) == ("tiny.pte", "etrecord.bin", "forward")
    assert (runtime["kernels"], runtime["delegates"]) == (["portable"], {})
    assert runtime["exporter"]["name"] == "torch.export + executorch.exir"
    assert runtime["etdump"] == {"debug_events": 19, "with_data": 19, "recorded": 19, "without_module": 0,
                                 "delegate_inputs": 0}
    assert found["graph"]["scopes"] == "modules" and "aten.view_copy.default" in found["graph"]["views"]


def test_module_scopes_are_read_from_the_serialized_module_stack() -> None:
    stack = ("L__self__,,m.Tiny;L__self___layers_0,layers.0,m.Block;"
             "L__self___layers_0_proj,layers.0.proj,torch.nn.modules.linear.Linear")
    assert module_scopes(stack) == ("layers.0", "layers.0.proj")
    assert module_scopes("") == () and module_scopes(None) == ()


@pytest.mark.parametrize("inputs", [{"args.0": IDS, "args.1": "bias"}, {"input_ids": IDS, "bias": "bias"},
                                    {"kwargs.input_ids": IDS, "args.1": "bias"}], ids=["position", "name", "kwargs"])
def test_inputs_are_found_by_name_or_position(portable: Exported, tmp_path: Path, inputs: dict[str, Any]) -> None:
    given = {key: portable.bias if isinstance(value, str) else value for key, value in inputs.items()}
    session = tracediff.capture_file(portable.program, tmp_path / "t", inputs=given,
                                     options={"etrecord": portable.etrecord})
    assert session.complete
    assert torch.allclose(payload(tmp_path / "t", _recorded(tmp_path / "t")[-1][fmt.OUTPUTS]), portable.expected,
                          rtol=1e-5, atol=1e-6)


def test_a_program_manager_is_captured_with_its_own_etrecord(portable: Exported, tmp_path: Path) -> None:
    session = tracediff.capture_file(portable.manager, tmp_path / "t", inputs={"args.0": IDS, "args.1": portable.bias})
    assert session.complete
    assert len(_recorded(tmp_path / "t")) == 19


def test_the_command_line_captures_a_program(portable: Exported, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["capture", str(portable.program), "--etrecord", str(portable.etrecord), "--inputs",
                 str(portable.inputs_file(tmp_path)), "--out", str(tmp_path / "o")])
    assert code == 0, capsys.readouterr().err
    assert metadata(tmp_path / "o")[fmt.RUNTIME]["kernels"] == ["portable"]


def _refused(portable: Exported, tmp_path: Path, capsys: pytest.CaptureFixture[str], *, program: Path | None = None,
             etrecord: Path | None = None, inputs: dict[str, torch.Tensor] | None = None) -> str:
    argv = ["capture", str(program or portable.program), "--inputs", str(portable.inputs_file(tmp_path, inputs)),
            "--out", str(tmp_path / "o")]
    if etrecord is not False:
        argv[2:2] = ["--etrecord", str(etrecord or portable.etrecord)]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
    return err.removeprefix("tracediff capture: error: ").rstrip("\n")


def test_a_program_input_missing_from_the_file_is_named(portable: Exported, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    inputs = tmp_path / "inputs.safetensors"
    assert _refused(portable, tmp_path, capsys, inputs={"input_ids": IDS}) == (
        f"{inputs}: program input 'bias' is not in the file (it holds input_ids)")


def test_a_truncated_program_is_refused(portable: Exported, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    program = tmp_path / "cut.pte"
    program.write_bytes(portable.program.read_bytes()[:1000])
    assert _refused(portable, tmp_path, capsys, program=program).startswith(
        f"{program}: not a readable ExecuTorch program (")


def test_a_file_that_is_no_program_is_refused(portable: Exported, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    program = tmp_path / "text.pte"
    program.write_bytes(b"hello, this is not a program")
    assert _refused(portable, tmp_path, capsys, program=program) == (
        f"{program}: not an ExecuTorch program (no ET flatbuffer identifier at bytes 4-8; found b'o, t')")


def test_a_symlinked_program_is_refused(portable: Exported, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "link.pte"
    link.symlink_to(portable.program)
    assert _refused(portable, tmp_path, capsys, program=link) == (
        f"{link}: a symbolic link; refused (give the program file itself)")


def test_a_garbage_etrecord_is_refused(portable: Exported, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    etrecord = tmp_path / "garbage.bin"
    etrecord.write_bytes(b"\x00garbage" * 100)
    assert _refused(portable, tmp_path, capsys, etrecord=etrecord) == (
        f"{etrecord}: not an ETRecord (not a zip file: File is not a zip file)")


def test_an_etrecord_of_another_program_is_refused(portable: Exported, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from executorch.exir import to_edge_transform_and_lower

    other = to_edge_transform_and_lower(torch.export.export(nn.Linear(8, 8), (torch.randn(2, 8),)),
                                        generate_etrecord=True).to_executorch()
    etrecord = tmp_path / "other.bin"
    other.get_etrecord().save(str(etrecord))
    assert _refused(portable, tmp_path, capsys, etrecord=etrecord) == (
        f"{etrecord}: not the ETRecord of {portable.program} (it maps 2 instructions, the program's method "
        "'forward' has 15)")


def test_a_program_without_its_etrecord_is_refused(portable: Exported, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^.*tiny.pte: an ExecuTorch program is captured with its ETRecord "
                                         r"\(--etrecord FILE"):
        tracediff.capture_file(portable.program, tmp_path / "o", inputs={"args.0": IDS, "args.1": portable.bias})


# --- a program delegated to XNNPACK ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def delegated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Exported, Path]:
    exported = Exported(tmp_path_factory.mktemp("executorch-xnnpack"), xnnpack=True)
    out = exported.program.parent / "t"
    session = tracediff.capture_file(exported.program, out, inputs={"args.0": IDS, "args.1": exported.bias},
                                     options={"etrecord": exported.etrecord})
    assert session.complete
    return exported, out


def test_a_delegated_region_is_recorded_at_its_boundary(delegated: tuple[Exported, Path]) -> None:
    exported, out = delegated
    runtime = metadata(out)[fmt.RUNTIME]
    assert runtime["kernels"] == ["portable", "xnnpack"] and set(runtime["delegates"]) == {"XnnpackBackend"}
    recorded = _recorded(out)
    backend = [n for n in recorded if n[fmt.MODULE_TYPE] == "XnnpackBackend"]
    assert backend and all(n[fmt.ATTRIBUTES]["delegate"] == "XnnpackBackend" for n in backend)
    # layer 0's Linear, ReLU and residual add run in one delegate call that hands out the layer's output; the
    # last call runs layer 1's Linear, ReLU and add and the head: layer 1 and the head show no boundary, nor
    # does either Linear (their values stay inside the delegates)
    assert runtime["modules_not_shown"] == ["head", "layers.0.proj", "layers.1", "layers.1.proj"]
    layer = [n for n in backend if n.get(fmt.NODE_SCOPES) == ["layers.0"]]
    assert [n[fmt.ATTRIBUTES]["ops"] for n in layer] == [["aten.add.Tensor", "aten.linear.default",
                                                          "aten.relu.default"]]
    last = recorded[-1]
    assert (last[fmt.MODULE_PATH], last.get(fmt.NODE_SCOPES)) == ("ExecuTorchProgram.XnnpackBackend", None)
    assert last[fmt.ATTRIBUTES]["produced_by"] == "aten.linear.default"
    assert torch.allclose(payload(out, last[fmt.OUTPUTS]), exported.expected, rtol=1e-5, atol=1e-6)
