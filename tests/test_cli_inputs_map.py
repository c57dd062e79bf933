"""``tracediff capture ... --inputs FILE --inputs-map 'args.0=kwargs.input_ids'``: inputs fed across styles."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.alignment.helpers import run_cli
from tracediff import UsageError
from tracediff.capturing.inputs_map import parse_inputs_map

SCRIPT = '''
import torch
from torch import nn


class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(10, 4)

    def forward(self, input_ids=None, attention_mask=None):
        return self.embed(input_ids)


def positional():  # research code: the ids as the first argument
    return Lookup(), (torch.tensor([[1, 2, 3]]),)


def keyword():  # transformers style: the ids by keyword, other example values
    return Lookup(), {"input_ids": torch.tensor([[7, 7, 7]])}


def two_inputs():
    return Lookup(), {"input_ids": torch.tensor([[7, 7, 7]]), "attention_mask": torch.ones(1, 3)}


def other_dtype():
    return Lookup(), {"input_ids": torch.tensor([[7, 7, 7]], dtype=torch.int32)}
'''


@pytest.fixture()
def saved(tmp_path: Path, capsys: Any) -> tuple[Path, Path]:
    script = tmp_path / "models.py"
    script.write_text(textwrap.dedent(SCRIPT))
    inputs = tmp_path / "inputs.safetensors"
    code, _, err = run_cli(["capture", f"{script}:positional", "--out", str(tmp_path / "ref"),
                            "--save-inputs", str(inputs)], capsys)
    assert (code, err) == (0, "")
    return script, inputs


def _fed_ids(trace: Path) -> list[int]:
    from tracediff import load_trace

    loaded = load_trace(trace)
    (record,) = [r for r in loaded.roots[0].tensors if r.slot.startswith("inputs")]
    return loaded.load(record).flatten().tolist()


def test_explicit_map_feeds_a_positional_input_as_a_keyword(saved: tuple[Path, Path], tmp_path: Path,
                                                          capsys: Any) -> None:
    script, inputs = saved
    out = tmp_path / "port"
    code, stdout, err = run_cli(["capture", f"{script}:keyword", "--out", str(out), "--inputs", str(inputs),
                                 "--inputs-map", "args.0=kwargs.input_ids"], capsys)
    assert (code, err) == (0, "") and "fed its only tensor" not in stdout
    assert _fed_ids(out) == [1, 2, 3]


def test_the_only_tensor_of_each_side_is_paired_and_said(saved: tuple[Path, Path], tmp_path: Path,
                                                         capsys: Any) -> None:
    script, inputs = saved
    out = tmp_path / "port"
    code, stdout, err = run_cli(["capture", f"{script}:keyword", "--out", str(out), "--inputs", str(inputs)], capsys)
    assert (code, err) == (0, "")
    assert stdout.splitlines()[0] == (f"tracediff capture: {inputs}: fed its only tensor args.0 as kwargs.input_ids, "
                                      "the model's only tensor input (same shape and dtype); --inputs-map "
                                      "'args.0=kwargs.input_ids' says so explicitly")
    assert _fed_ids(out) == [1, 2, 3]


@pytest.mark.parametrize("spec, extra, message", [
    ("two_inputs", [], "{inputs}: keys do not match the model's inputs (missing: ['kwargs.attention_mask', "
                       "'kwargs.input_ids']; unexpected: ['args.0']; expected: ['kwargs.attention_mask', "
                       "'kwargs.input_ids']); map them with --inputs-map 'args.0=kwargs.attention_mask'"),
    ("other_dtype", [], "{inputs}: keys do not match the model's inputs (missing: ['kwargs.input_ids']; "
                        "unexpected: ['args.0']; expected: ['kwargs.input_ids']); map them with --inputs-map "
                        "'args.0=kwargs.input_ids'"),
    ("keyword", ["--inputs-map", "args.0"], "inputs map: 'args.0' has no '='; expected FILE_KEY=MODEL_SLOT, "
                                            "e.g. 'args.0=kwargs.input_ids'"),
    ("keyword", ["--inputs-map", "args.0=input_ids"], "inputs map: 'input_ids' is not an input slot; expected "
                                                      "args.N or kwargs.NAME, e.g. 'args.0=kwargs.input_ids'"),
])
def test_inputs_that_do_not_line_up_exit_2(saved: tuple[Path, Path], tmp_path: Path, capsys: Any, spec: str,
                                           extra: list[str], message: str) -> None:
    script, inputs = saved
    out = tmp_path / "port"
    code, stdout, err = run_cli(["capture", f"{script}:{spec}", "--out", str(out), "--inputs", str(inputs), *extra],
                                capsys)
    assert (code, stdout) == (2, "")
    assert err == f"tracediff capture: error: {message.format(inputs=inputs)}\n"
    assert not out.exists()


def test_parse_inputs_map() -> None:
    assert parse_inputs_map(["args.0=kwargs.input_ids", " kwargs.m = kwargs.attention_mask "]) == \
        {"args.0": "kwargs.input_ids", "kwargs.m": "kwargs.attention_mask"}
    assert parse_inputs_map({"args.1": "args.0"}) == {"args.1": "args.0"}
    assert parse_inputs_map(None) == {}
    for bad, message in [(["args.x=kwargs.a"], "inputs map: args.x=kwargs.a: positional slots are args.N with N "
                                                "a number"),
                         (["args.0=kwargs.a", "args.0=kwargs.b"], "inputs map: args.0 is mapped twice"),
                         (["args.0=kwargs.a", "args.1=kwargs.a"], "inputs map: two keys of the file feed the same "
                                                                  "input of the model")]:
        with pytest.raises(UsageError) as e:
            parse_inputs_map(bad)
        assert str(e.value) == message
