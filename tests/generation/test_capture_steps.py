"""Capturing ``model.generate``: every forward pass is a numbered decode step; ``steps=`` keeps some in full."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tracediff
from tracediff import format as fmt
from tracediff.cli.main import main
from tracediff.errors import TraceFormatError, UsageError

from . import ports
from .conftest import capture_generation


def _tree(folder: Path) -> dict:
    return json.loads(next(folder.glob(f"*{fmt.FULL_SUFFIX}")).read_text())


def _roots(folder: Path) -> list[dict]:
    tree = _tree(folder)
    return [tree, *tree.get(fmt.SUBSEQUENT_CALLS, [])]


def test_generate_numbers_its_forward_passes_from_the_prefill(tmp_path: Path) -> None:
    model = ports.llama()
    session = capture_generation(model, tmp_path / "t")
    roots = _roots(tmp_path / "t")
    assert [root[fmt.STEP] for root in roots] == list(range(ports.NEW_TOKENS))
    lengths = [root["inputs"]["kwargs"]["input_ids"]["shape"] for root in roots]
    assert lengths == ["torch.Size([1, 6])"] + ["torch.Size([1, 1])"] * (ports.NEW_TOKENS - 1)
    assert session.metadata["options"]["steps"] == {"selected": None, "recorded": 5, "full": [0, 1, 2, 3, 4],
                                                    "others": "stats"}
    assert tracediff.load_trace(tmp_path / "t").root_steps == [0, 1, 2, 3, 4]
    assert "generate" not in model.__dict__  # the wrapper is gone


def test_a_forward_outside_generate_has_no_step(tmp_path: Path) -> None:
    model = ports.llama()
    with torch.no_grad(), tracediff.capture(model, tmp_path / "t") as session:
        model(ports.prompt())
    assert fmt.STEP not in _tree(tmp_path / "t")
    assert session.metadata["options"]["steps"] is None


@pytest.mark.parametrize(("steps", "full"), [([0, -1], [0, 4]), ("1,-2", [1, 3]), ([-1], [4]), ([2, 9], [2])])
def test_steps_keeps_full_tensors_only_for_the_selected_steps(tmp_path: Path, steps: object, full: list[int]) -> None:
    session = capture_generation(ports.llama(), tmp_path / "t", steps=steps)
    roots = _roots(tmp_path / "t")
    with_payloads = [root[fmt.STEP] for root in roots if fmt.VALUE in root["outputs"]["logits"]]
    assert with_payloads == full
    assert all("stats" in root["outputs"]["logits"] for root in roots)  # the others keep their statistics
    assert session.metadata["options"]["steps"]["full"] == full
    referenced = {entry for root in roots for entry in _values(root)}
    written = {path.name for path in (tmp_path / "t").glob("*.safetensors")}
    assert referenced == written and session.files == len(written)  # no payload left over, none missing


def _values(node: object) -> list[str]:
    if isinstance(node, dict):
        if fmt.is_tensor_entry(node):
            return [node[fmt.VALUE][2:]] if isinstance(node.get(fmt.VALUE), str) else []
        return [v for key, item in node.items() if key != fmt.SUBSEQUENT_CALLS for v in _values(item)]
    if isinstance(node, list):
        return [v for item in node for v in _values(item)]
    return []


@pytest.mark.parametrize("writers", [0, 2])
def test_journal_lines_name_only_payloads_on_disk_when_steps_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writers: int
) -> None:
    from tracediff.capturing.journal import Journal

    missing: list[str] = []
    append = Journal._append

    def checked(self: Journal, line: bytes) -> None:
        entry = json.loads(line)
        node = entry.get(fmt.JOURNAL_NODE)
        missing.extend(name for name in _values(node) if not (self.path.parent / name).is_file())
        append(self, line)

    monkeypatch.setattr(Journal, "_append", checked)
    capture_generation(ports.llama(), tmp_path / "t", steps=[0, -1], writers=writers)  # steps 1 to 3 dropped
    assert missing == []


@pytest.mark.parametrize(("steps", "writers"), [([0, -1], 0), ([0, -1], 2), ([1], 0)])
def test_other_steps_tree_keeps_the_call_tree_and_tokens_but_no_statistics(
    tmp_path: Path, steps: list[int], writers: int
) -> None:
    """other_steps="tree": the steps left out keep every call and each tensor's shape, dtype and device, and
    their tokens; the selected steps are written as with the default, statistics included."""
    session = capture_generation(ports.llama(), tmp_path / "tree", steps=steps, other_steps="tree", writers=writers)
    capture_generation(ports.llama(), tmp_path / "stats", steps=steps, writers=writers)
    tree, stats = _roots(tmp_path / "tree"), _roots(tmp_path / "stats")
    full = session.metadata["options"]["steps"]["full"]
    assert session.metadata["options"]["steps"]["others"] == "tree"
    assert full == [s if s >= 0 else ports.NEW_TOKENS + s for s in steps]
    for left, right in zip(tree, stats):
        assert _calls(left) == _calls(right)  # the same call tree
        assert left.get(fmt.TOKENS) == right.get(fmt.TOKENS)
        entries, kept = _entries(left), _entries(right)
        assert [(e[fmt.SHAPE], e[fmt.DTYPE], e[fmt.DEVICE]) for e in entries] == \
               [(e[fmt.SHAPE], e[fmt.DTYPE], e[fmt.DEVICE]) for e in kept]
        if left[fmt.STEP] in full:  # written as by default: the same statistics and payload names
            assert entries == kept
        else:
            assert all(set(e) == {fmt.SHAPE, fmt.DTYPE, fmt.DEVICE, fmt.STATS} for e in entries)
            assert [e[fmt.STATS] for e in entries] == [{"numel": e[fmt.STATS]["numel"]} for e in kept]
    referenced = {entry for root in tree for entry in _values(root)}
    assert referenced == {path.name for path in (tmp_path / "tree").glob("*.safetensors")}
    result = tracediff.align(tmp_path / "stats", tmp_path / "tree")  # the steps written compare exactly
    assert {row.step for row in result.rows if row.status == "identical" and not row.approximate} >= set(full)


def test_other_steps_needs_a_selection_and_a_known_choice(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="other_steps='none': expected one of stats, tree"):
        capture_generation(ports.llama(), tmp_path / "t", steps=[0], other_steps="none")
    code = main(["capture", _spec(tmp_path), "--out", str(tmp_path / "u"), "--generate", "--other-steps", "tree"])
    assert code == 2


def _calls(node: dict) -> list[str]:
    return [node.get(fmt.MODULE_PATH, ""), *(p for child in node.get(fmt.CHILDREN, []) for p in _calls(child))]


def _entries(node: object) -> list[dict]:
    if isinstance(node, dict):
        if fmt.is_tensor_entry(node):
            return [node]
        return [e for key, item in node.items() if key not in (fmt.SUBSEQUENT_CALLS, fmt.TOKENS)
                for e in _entries(item)]
    if isinstance(node, list):
        return [e for item in node for e in _entries(item)]
    return []


def test_a_selected_step_reads_back_like_a_full_capture(tmp_path: Path) -> None:
    capture_generation(ports.llama(), tmp_path / "all")
    capture_generation(ports.llama(), tmp_path / "some", steps=[0, -1])
    result = tracediff.align(tmp_path / "all", tmp_path / "some")
    assert result.passed
    exact = {row.step for row in result.rows if not row.approximate and row.status == "identical"}
    approximate = {row.step for row in result.rows if row.approximate}
    assert {0, 4} <= exact and approximate == {1, 2, 3}


@pytest.mark.parametrize("steps", ["0,x", "", [0.5]])
def test_a_bad_step_selection_is_a_usage_error(tmp_path: Path, steps: object) -> None:
    with pytest.raises(UsageError, match="expected"):
        capture_generation(ports.llama(), tmp_path / "t", steps=steps)
    assert not (tmp_path / "t").exists()


def test_a_step_that_is_not_a_count_is_refused_in_one_line(tmp_path: Path) -> None:
    capture_generation(ports.llama(), tmp_path / "t")
    path = next((tmp_path / "t").glob(f"*{fmt.FULL_SUFFIX}"))
    tree = json.loads(path.read_text())
    tree[fmt.SUBSEQUENT_CALLS][0][fmt.STEP] = -1
    path.write_text(json.dumps(tree))
    with pytest.raises(TraceFormatError) as caught:
        tracediff.load_trace(tmp_path / "t")
    assert str(caught.value) == f"{path}: LlamaForCausalLM: 'step' is -1; expected a whole number, 0 or more"


def _spec(tmp_path: Path) -> str:
    script = tmp_path / "gen.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "from tests.generation import ports\n"
        "def build():\n"
        "    return ports.llama(), {'input_ids': ports.prompt(), 'min_new_tokens': 3, 'do_sample': False}\n")
    return f"{script}:build"


def test_the_cli_captures_a_generation_with_selected_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t"
    code = main(["capture", _spec(tmp_path), "--out", str(out), "--generate", "--max-new-tokens", "3",
                 "--steps", "0,-1"])
    assert code == 0
    assert "in 3 decode steps (2 in full)" in capsys.readouterr().out
    roots = _roots(out)
    assert [root[fmt.STEP] for root in roots] == [0, 1, 2]
    assert [fmt.VALUE in root["outputs"]["logits"] for root in roots] == [True, False, True]


def test_the_cli_refuses_steps_without_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["capture", _spec(tmp_path), "--out", str(tmp_path / "t"), "--steps", "0"])
    assert code == 2
    assert capsys.readouterr().err.strip() == ("tracediff capture: error: steps and max_new_tokens concern the "
                                               "forward passes of model.generate: add generate=True (--generate)")


def test_each_attention_records_its_own_layer_of_the_cache_it_reads(tmp_path: Path) -> None:
    model = ports.llama()
    capture_generation(model, tmp_path / "t", steps=[1])
    trace = tracediff.load_trace(tmp_path / "t")
    attention = [node for node in trace.nodes() if node.relative_path.endswith("self_attn")]
    per_step = {(node.relative_path, node.call_index): {r.slot: r for r in node.tensors if "cache" in r.slot}
                for node in attention}
    assert all(not per_step[(f"model.layers.{i}.self_attn", 0)] for i in (0, 1))  # the prefill: an empty cache
    heads = model.config.num_key_value_heads
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    for step in (1, 2):
        cache = per_step[("model.layers.1.self_attn", step)]
        assert set(cache) == {"inputs.kwargs.cache.keys", "inputs.kwargs.cache.values"}
        keys = cache["inputs.kwargs.cache.keys"]
        assert keys.shape == (1, heads, ports.PROMPT + step - 1, head_dim)  # the past, before this step's token
        assert keys.has_payload == (step == 1) and "mean" in keys.stats


def test_steps_from_the_last_are_written_at_once_when_generate_cannot_stop_early(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exactly NEW_TOKENS tokens (min_new_tokens = max_new_tokens): the last step is known in advance, so no
    step is held (copied) in case it is the last; the trace is the same as when steps are held."""
    from tracediff.capturing import decode_steps

    held = []
    monkeypatch.setattr(decode_steps._HeldStep, "submit", lambda self, *a, **k: held.append(self.step) or 0)
    session = capture_generation(ports.llama(), tmp_path / "t", steps=[0, -1], other_steps="tree")
    assert held == [] and session.metadata["options"]["steps"]["full"] == [0, ports.NEW_TOKENS - 1]
    roots = _roots(tmp_path / "t")
    assert [root[fmt.STEP] for root in roots if fmt.VALUE in root["outputs"]["logits"]] == [0, ports.NEW_TOKENS - 1]


def test_steps_from_the_last_are_held_when_an_end_of_sequence_token_may_stop_generate(tmp_path: Path) -> None:
    from tracediff.capturing.decode_steps import planned_forward_passes

    model = ports.llama()
    model.generation_config.eos_token_id = ports.VOCAB - 1
    kwargs = ports.generate_kwargs(min_new_tokens=0)
    assert planned_forward_passes(model, kwargs) is None
    assert planned_forward_passes(model, ports.generate_kwargs()) == ports.NEW_TOKENS
    assert planned_forward_passes(model, ports.generate_kwargs(num_beams=2)) is None
    with torch.no_grad(), tracediff.capture(model, tmp_path / "t", steps=[0, -1]) as session:
        out = model.generate(ports.prompt(), **kwargs)
    last = out.shape[1] - ports.prompt().shape[1] - 1
    assert session.metadata["options"]["steps"]["full"] == sorted({0, last})


def test_a_generation_that_ends_elsewhere_than_planned_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracediff.capturing import decode_steps

    monkeypatch.setattr(decode_steps, "planned_forward_passes", lambda model, kwargs: ports.NEW_TOKENS + 2)
    with pytest.warns(UserWarning, match=f"generate made {ports.NEW_TOKENS} forward passes where "
                                         f"{ports.NEW_TOKENS + 2} were planned"):
        session = capture_generation(ports.llama(), tmp_path / "t", steps=[0, -1])
    assert session.metadata["options"]["steps"]["full"] == [0]  # the real last step was not written in full
