"""``tracediff capture SPEC --out DIR``, run in-process: exit codes, exact messages, inputs files."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tracediff.capturing.adapters import known_models
from tracediff.cli import commands
from tracediff.cli.main import main

MODELS = '''
import torch
from torch import nn


class Ref(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x, scale=1.0):
        return self.b(self.a(x)) * scale


class Port(Ref):
    """The same computation under another name, with its own example inputs."""


class WrapSensitive(Ref):
    def forward(self, x, scale=1.0):
        y = self.b(self.a(x))
        return y * 2 if "forward" in self.a.__dict__ else y


class Failing(Ref):
    def forward(self, x, scale=1.0):
        return self.b(self.a(x)).view(-1, 3)


def example(seed):
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(seed))


def ref():
    torch.manual_seed(0)
    return Ref(), (example(1),)


def port():
    torch.manual_seed(0)
    return Port(), {"x": example(2), "scale": 1.0}


def port_positional():
    torch.manual_seed(0)
    return Port(), example(2)


def wrap_sensitive():
    torch.manual_seed(0)
    return WrapSensitive(), (example(1),)


def failing():
    torch.manual_seed(0)
    return Failing(), (example(1),)


def returns_int():
    return 3


def returns_string_model():
    return "model", (example(1),)


def returns_list_inputs():
    return Ref(), [example(1)]


def raises():
    raise RuntimeError("no weights here\\nsecond line")
'''


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "specs" / "impls.py"
    path.parent.mkdir()
    path.write_text(MODELS)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_error(result: tuple[int, str, str], message: str) -> None:
    code, out, err = result
    assert (code, out) == (2, "")
    assert err == f"tracediff capture: error: {message}\n"


def test_script_spec_captures(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace"
    code, stdout, stderr = run(capsys, "capture", f"{script}:ref", "--out", str(out))
    assert (code, stderr) == (0, "")
    assert stdout == f"captured 3 module calls into {out} (4 payload files, 0.0 MB)\n"
    meta = json.loads((out / "tracediff_metadata.json").read_text())
    assert meta["complete"] and meta["model_name"] == "Ref" and meta["calls"] == 3
    tree = json.loads((out / "Ref_debug_tree_FULL_TENSORS.json").read_text())
    assert tree["outputs"]["stats"]["numel"] == 2 * 2


def test_module_spec_from_the_current_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "cli_spec_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "impls.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    code, stdout, _ = run(capsys, "capture", "cli_spec_pkg.impls:ref", "--out", "trace", "--tensors", "summary")
    assert code == 0 and stdout == "captured 3 module calls into trace (0 payload files, 0.0 MB)\n"
    assert str(tmp_path) not in sys.path
    for name in ("cli_spec_pkg", "cli_spec_pkg.impls"):
        sys.modules.pop(name, None)


def test_save_inputs_then_inputs_gives_bit_identical_inputs(script: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "inputs.safetensors"
    assert run(capsys, "capture", f"{script}:ref", "--out", str(tmp_path / "ref"), "--save-inputs", str(saved))[0] == 0
    with safe_open(str(saved), framework="pt") as f:
        assert list(f.keys()) == ["args.0"]
    code, _, _ = run(capsys, "capture", f"{script}:port_positional", "--out", str(tmp_path / "port"),
                     "--inputs", str(saved))
    assert code == 0
    ref_input = (tmp_path / "ref" / "Ref_inputs_args_0.safetensors").read_bytes()
    assert (tmp_path / "port" / "Port_inputs_args_0.safetensors").read_bytes() == ref_input
    ref_out = (tmp_path / "ref" / "Ref.b_outputs.safetensors").read_bytes()
    assert (tmp_path / "port" / "Port.b_outputs.safetensors").read_bytes() == ref_out  # same weights, same inputs


def test_inputs_with_keyword_layout(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "kw.safetensors"
    assert run(capsys, "capture", f"{script}:port", "--out", str(tmp_path / "a"), "--save-inputs", str(saved))[0] == 0
    with safe_open(str(saved), framework="pt") as f:
        assert list(f.keys()) == ["kwargs.x"]  # the float keyword stays with the SPEC
    assert run(capsys, "capture", f"{script}:port", "--out", str(tmp_path / "b"), "--inputs", str(saved))[0] == 0
    tree = json.loads((tmp_path / "b" / "Port_debug_tree_FULL_TENSORS.json").read_text())
    assert tree["inputs"]["kwargs"]["scale"] == {"py_type": "float", "py_value": 1.0}


def test_inputs_file_problems(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, out = f"{script}:ref", str(tmp_path / "trace")
    missing = tmp_path / "missing.safetensors"
    assert_error(run(capsys, "capture", spec, "--out", out, "--inputs", str(missing)),
                 f"{missing}: inputs file not found")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    code, stdout, stderr = run(capsys, "capture", spec, "--out", out, "--inputs", str(corrupt))
    assert (code, stdout) == (2, "") and stderr.count("\n") == 1
    assert stderr.startswith(f"tracediff capture: error: {corrupt}: not a readable safetensors file (")
    from safetensors.torch import save_file

    wrong = tmp_path / "wrong.safetensors"
    save_file({"kwargs.x": torch.zeros(2, 4), "args.1": torch.zeros(1)}, str(wrong))
    assert_error(run(capsys, "capture", spec, "--out", out, "--inputs", str(wrong)),
                 f"{wrong}: keys do not match the model's inputs (missing: ['args.0']; "
                 "unexpected: ['args.1', 'kwargs.x']; expected: ['args.0']); "
                 "map them with --inputs-map 'args.1=args.0'")
    assert not Path(out).exists()


@pytest.mark.parametrize(("function", "message"), [
    ("nothere", "{script}:nothere: {script} has no function 'nothere'"),
    ("returns_int", "{script}:returns_int: returns_int() must return (model, inputs), got int"),
    ("returns_string_model", "{script}:returns_string_model: the model returned by returns_string_model() "
                             f"is a str, not a {known_models()} model"),
    ("returns_list_inputs", "{script}:returns_list_inputs: inputs must be a tensor, a tuple of positional "
                            "arguments or a dict of keyword arguments, got list"),
    ("raises", "{script}:raises: calling raises() raised RuntimeError: no weights here"),
])
def test_spec_function_problems(function: str, message: str, script: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, "capture", f"{script}:{function}", "--out", str(tmp_path / "trace"))
    assert_error(result, message.format(script=script))
    assert not (tmp_path / "trace").exists()


def test_spec_that_does_not_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "trace")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_for_tracediff\n")
    assert_error(run(capsys, "capture", f"{broken}:build", "--out", out),
                 f"{broken}:build: importing {broken} raised ModuleNotFoundError: "
                 "No module named 'no_such_module_for_tracediff'")
    absent = tmp_path / "absent.py"
    assert_error(run(capsys, "capture", f"{absent}:build", "--out", out), f"{absent}:build: no such script {absent}")
    assert_error(run(capsys, "capture", "no_such_pkg_for_tracediff.mod:build", "--out", out),
                 "no_such_pkg_for_tracediff.mod:build: cannot import no_such_pkg_for_tracediff.mod "
                 "(ModuleNotFoundError: No module named 'no_such_pkg_for_tracediff')")
    assert_error(run(capsys, "capture", "just_a_name", "--out", out),
                 "just_a_name: expected package.module:function or path/to/script.py:function")


def test_script_with_dataclasses_and_postponed_annotations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "dc.py"
    spec.write_text(textwrap.dedent('''
        from __future__ import annotations
        import dataclasses
        import typing
        import torch

        @dataclasses.dataclass
        class Options:  # a string ClassVar annotation makes dataclasses look the module up in sys.modules
            kind: typing.ClassVar[str] = "linear"
            width: int = 4

        def build():
            torch.manual_seed(0)
            return torch.nn.Linear(Options().width, 2), torch.ones(1, 4)
    '''))
    code, stdout, stderr = run(capsys, "capture", f"{spec}:build", "--out", str(tmp_path / "t"))
    assert (code, stderr) == (0, "")


def test_out_dir_problems(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x.safetensors").write_bytes(b"")
    assert_error(run(capsys, "capture", f"{script}:ref", "--out", str(taken)),
                 f"{taken}: is not empty; refusing to overwrite a trace (use --overwrite)")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert_error(run(capsys, "capture", f"{script}:ref", "--out", str(a_file)), f"{a_file}: is a file, not a directory")
    under = a_file / "trace"
    assert_error(run(capsys, "capture", f"{script}:ref", "--out", str(under)),
                 f"{under}: cannot write here ({a_file} is not a writable directory)")
    assert run(capsys, "capture", f"{script}:ref", "--out", str(taken), "--overwrite")[0] == 0
    assert (taken / "x.safetensors").exists()  # not a file of an earlier trace: overwrite leaves it alone


def test_forward_that_raises(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace"
    assert_error(run(capsys, "capture", f"{script}:failing", "--out", str(out)),
                 f"{script}:failing: the forward raised RuntimeError in Failing (call 0): shape '[-1, 3]' is invalid "
                 f"for input of size 4; the partial trace is in {out}")
    meta = json.loads((out / "tracediff_metadata.json").read_text())
    assert meta["complete"] is False and meta["error"]["module_path"] == "Failing"


def test_verify(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run(capsys, "capture", f"{script}:ref", "--out", str(tmp_path / "ok"), "--verify")
    assert (code, stderr) == (0, "")
    assert stdout.splitlines()[1] == "verified: 1 outputs bit-identical to a run without capture"
    code, stdout, stderr = run(capsys, "capture", f"{script}:wrap_sensitive", "--out", str(tmp_path / "bad"),
                               "--verify")
    assert code == 1 and stdout.startswith("captured 3 module calls")
    assert stderr.startswith("verification failed: outputs: values differ (max abs difference ")
    assert stderr.count("\n") == 1


def test_bad_option_is_one_line_exit_2(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["capture", f"{script}:ref", "--out", str(tmp_path), "--tensors", "all"])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.err.count("\n") == 1
    assert captured.err.startswith("tracediff capture: error: argument --tensors: invalid choice: 'all'")


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = run(capsys)
    assert code == 2 and stdout == "" and "capture" in stderr


@pytest.mark.parametrize("command", [getattr(module, "COMMAND", module.__name__.rsplit(".", 1)[1])
                                     for module in commands.ALL])
def test_every_command_has_help_with_an_example(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert "example" in capsys.readouterr().out.lower()


def test_options_of_the_other_kind_of_spec_are_refused(script: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # a GGUF file is run by llama.cpp on --inputs: PyTorch's options would be silently ignored, so they are refused
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 24)
    inputs = tmp_path / "ids.safetensors"
    code = main(["capture", str(gguf), "--inputs", str(inputs), "--out", str(tmp_path / "o"), "--generate",
                 "--dtype", "bfloat16"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"tracediff capture: error: {gguf}: --generate, --dtype are for a SPEC run in PyTorch; a model file runs "
        "in its own runtime on --inputs")
    assert not (tmp_path / "o").exists()
    # and llama.cpp's options given with a PyTorch SPEC
    code = main(["capture", f"{script}:ref", "--out", str(tmp_path / "p"), "--kv-cache-type", "f32"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"tracediff capture: error: {script}:ref: --kv-cache-type is for a model file (tracediff capture "
        "model.gguf); a SPEC runs in PyTorch")
    assert not (tmp_path / "p").exists()
