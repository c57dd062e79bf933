"""Generated tokens in the trace, teacher forcing, and the report of where the port would have chosen another token."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import tracediff
from tracediff import format as fmt
from tracediff.cli.main import main
from tracediff.errors import TeacherForcingError, TraceFormatError

from . import ports

ROOT = Path(__file__).resolve().parents[2]


def _generate(model: torch.nn.Module, out: Path, *, seed: int = 0, teacher_forcing: Path | None = None,
              **extra: Any) -> Any:
    torch.manual_seed(seed)  # the sampler's draws
    options = {"teacher_forcing": teacher_forcing} if teacher_forcing is not None else {}
    with torch.no_grad(), tracediff.capture(model, out, **options):
        return model.generate(ports.prompt(), **ports.generate_kwargs(**extra))


def _tokens(folder: Path) -> list[dict[str, Any]]:
    tree = json.loads(next(folder.glob(f"*{fmt.FULL_SUFFIX}")).read_text())
    return [root.get(fmt.TOKENS) for root in [tree, *tree.get(fmt.SUBSEQUENT_CALLS, [])]]


@pytest.fixture(scope="module")
def sampled(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Sampled generations of the tiny Llama (reference: seed 0), captured once each by name."""
    root = tmp_path_factory.mktemp("forcing")
    builders: dict[str, tuple[Callable[[], torch.nn.Module], int, bool]] = {
        "reference": (ports.llama, 0, False),
        "other_draws": (ports.llama, 1, False),  # the same model, another seed: other tokens from step 0
        "other_draws_forced": (ports.llama, 1, True),
        "rotary_offset_forced": (lambda: ports.rotary_offset(ports.llama()), 1, True),
        "mask_off_by_one_forced": (lambda: ports.mask_off_by_one(ports.llama()), 1, True),
    }
    made: dict[str, Path] = {}

    def trace(name: str) -> Path:
        if name not in made:
            build, seed, forced = builders[name]
            made[name] = root / name
            _generate(build(), made[name], seed=seed, do_sample=True,
                      teacher_forcing=trace("reference") if forced else None)
        return made[name]

    return trace


def test_generate_records_the_chosen_and_the_greedy_token_of_each_step(tmp_path: Path) -> None:
    sequences = _generate(ports.llama(), tmp_path / "t")
    tokens = _tokens(tmp_path / "t")
    generated = sequences[0, ports.PROMPT:].tolist()
    assert [step[fmt.TOKENS_CHOSEN] for step in tokens] == [[token] for token in generated]
    assert [step[fmt.TOKENS_ARGMAX] for step in tokens] == [[token] for token in generated]  # greedy
    assert tokens[0][fmt.TOKENS_PROMPT] == ports.prompt().tolist()
    assert tokens[0][fmt.TOKENS_VOCAB_SIZE] == ports.VOCAB
    assert all(fmt.TOKENS_PROMPT not in step and fmt.TOKENS_VOCAB_SIZE not in step for step in tokens[1:])
    assert all(fmt.TOKENS_FORCED not in step for step in tokens)
    loaded = tracediff.load_trace(tmp_path / "t")
    assert [t.chosen for t in loaded.root_tokens if t is not None] == [(token,) for token in generated]


def test_a_sampled_step_keeps_its_draw_and_its_greedy_token_apart(sampled: Callable[[str], Path]) -> None:
    tokens = _tokens(sampled("reference"))
    assert len(tokens) == ports.NEW_TOKENS
    assert any(step[fmt.TOKENS_CHOSEN] != step[fmt.TOKENS_ARGMAX] for step in tokens)


def test_sampled_generations_part_at_their_first_draw_without_teacher_forcing(
        sampled: Callable[[str], Path]) -> None:
    reference, other = _tokens(sampled("reference")), _tokens(sampled("other_draws"))
    parted = next(k for k, (a, b) in enumerate(zip(reference, other)) if a[fmt.TOKENS_CHOSEN] != b[fmt.TOKENS_CHOSEN])
    result = tracediff.align(sampled("reference"), sampled("other_draws"))
    assert not result.passed  # the same model: only the tokens it read differ
    assert result.steps is not None and result.steps.first_diverging_step == parted + 1
    assert result.tokens is not None and not result.tokens.forced and result.tokens.parted_at == parted


def test_teacher_forcing_feeds_the_reference_tokens_and_the_steps_align(sampled: Callable[[str], Path]) -> None:
    reference, forced = _tokens(sampled("reference")), _tokens(sampled("other_draws_forced"))
    assert [step[fmt.TOKENS_CHOSEN] for step in forced] == [step[fmt.TOKENS_CHOSEN] for step in reference]
    assert all(step[fmt.TOKENS_FORCED] is True for step in forced)
    result = tracediff.align(sampled("reference"), sampled("other_draws_forced"))
    assert result.passed
    assert result.tokens is not None and result.tokens.forced and result.tokens.choices == ()
    assert result.tokens.compared == tuple(range(ports.NEW_TOKENS))
    metadata = json.loads((sampled("other_draws_forced") / fmt.METADATA_FILE).read_text())
    assert metadata["options"]["teacher_forcing"] == {"reference": str(sampled("reference")),
                                                      "steps": ports.NEW_TOKENS}


def test_teacher_forcing_stops_after_the_reference_tokens(sampled: Callable[[str], Path], tmp_path: Path) -> None:
    sequences = _generate(ports.llama(), tmp_path / "t", teacher_forcing=sampled("reference"),
                          max_new_tokens=2 * ports.NEW_TOKENS, min_new_tokens=2 * ports.NEW_TOKENS)
    assert sequences.shape[1] == ports.PROMPT + ports.NEW_TOKENS
    assert tracediff.load_trace(tmp_path / "t").root_steps == list(range(ports.NEW_TOKENS))


def test_a_decode_only_bug_is_still_named_at_its_step_and_module_under_teacher_forcing(
        sampled: Callable[[str], Path]) -> None:
    result = tracediff.align(sampled("reference"), sampled("rotary_offset_forced"))
    first = result.first_divergence
    assert first is not None
    assert (first.step, first.position, first.module_path_b, first.tensor, first.origin) == \
        (1, 6, "LlamaForCausalLM.model.rotary_emb", "outputs.0", "introduced")
    assert all(row.passed for row in result.rows if row.step == 0)


def _own_choices(model: torch.nn.Module, sequence: torch.Tensor) -> list[int]:
    """The model's greedy token at each step when fed ``sequence``'s tokens one by one through its cache."""
    with torch.no_grad():
        out = model(sequence[:, :ports.PROMPT], attention_mask=torch.ones(1, ports.PROMPT, dtype=torch.long),
                    use_cache=True)
        choices = [int(out.logits[0, -1].argmax())]
        for k in range(1, ports.NEW_TOKENS):
            length = ports.PROMPT + k
            out = model(sequence[:, length - 1:length], cache=out.past_key_values, use_cache=True,
                        attention_mask=torch.ones(1, length, dtype=torch.long))
            choices.append(int(out.logits[0, -1].argmax()))
    return choices


def test_the_report_names_where_the_port_would_have_chosen_another_token(
        sampled: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    reference = _tokens(sampled("reference"))
    sequence = torch.tensor([ports.prompt()[0].tolist() + [step[fmt.TOKENS_CHOSEN][0] for step in reference]])
    own_reference = _own_choices(ports.llama(), sequence)
    own_port = _own_choices(ports.mask_off_by_one(ports.llama()), sequence)
    expected = [(k, ports.PROMPT + k - 1, a, b) for k, (a, b) in enumerate(zip(own_reference, own_port)) if a != b]
    assert expected  # the bug moves the port's favourite at some step

    result = tracediff.align(sampled("reference"), sampled("mask_off_by_one_forced"))
    assert result.tokens is not None and result.tokens.forced
    assert [(c.step, c.position, c.token_a, c.token_b) for c in result.tokens.choices] == expected

    code = main(["align", str(sampled("reference")), str(sampled("mask_off_by_one_forced"))])
    out = capsys.readouterr().out
    assert code == 1
    assert (f"teacher forcing: B read A's tokens; B would have chosen another token at {len(expected)} of "
            f"{ports.NEW_TOKENS} steps") in out
    step, position, token_a, token_b = expected[0]
    assert f"  the port would have chosen token {token_b} at step {step}, position {position} (the reference: " \
           f"{token_a})" in out


def test_the_json_report_carries_the_token_choices(sampled: Callable[[str], Path], tmp_path: Path) -> None:
    import jsonschema

    out = tmp_path / "report.json"
    main(["align", str(sampled("reference")), str(sampled("mask_off_by_one_forced")), "--format", "json",
          "-o", str(out)])
    report = json.loads(out.read_text())
    result = tracediff.align(sampled("reference"), sampled("mask_off_by_one_forced"))
    assert result.tokens is not None and report["tokens"] == result.tokens.to_dict()
    assert report["tokens"]["forced"] is True and report["tokens"]["choices"]
    schema = json.loads((ROOT / "docs" / "schema" / "report.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(report)


def _spec(tmp_path: Path, body: str) -> str:
    script = tmp_path / "port.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.generation import ports\n"
        "def build():\n"
        f"    {body}\n")
    return f"{script}:build"


_PORT = "return ports.llama(), {'input_ids': ports.prompt(), 'min_new_tokens': 5, 'do_sample': False}"


def test_the_cli_captures_with_teacher_forcing(sampled: Callable[[str], Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    reference = sampled("reference")
    code = main(["capture", _spec(tmp_path, _PORT), "--out", str(tmp_path / "t"), "--generate",
                 "--max-new-tokens", "5", "--teacher-forcing", str(reference)])
    assert code == 0
    assert f"in 5 decode steps (5 in full), fed the 5 tokens of {reference} into" in capsys.readouterr().out
    assert tracediff.align(reference, tmp_path / "t").passed  # greedy port, sampled reference: the same tokens


def _forward_only(tmp_path: Path) -> Path:
    model = ports.llama()
    with torch.no_grad(), tracediff.capture(model, tmp_path / "forward"):
        model(ports.prompt())
    return tmp_path / "forward"


def _without_tokens(sampled: Callable[[str], Path], tmp_path: Path) -> Path:
    """The reference as a tracediff before tokens were recorded wrote it."""
    folder = tmp_path / "older"
    folder.mkdir()
    for path in sampled("reference").iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    for path in folder.glob("*_debug_tree_*.json"):
        tree = json.loads(path.read_text())
        for root in [tree, *tree.get(fmt.SUBSEQUENT_CALLS, [])]:
            root.pop(fmt.TOKENS, None)
        path.write_text(json.dumps(tree))
    return folder


@pytest.mark.parametrize(("case", "body", "message"), [
    ("no decode steps", _PORT, "{ref}: holds no generated tokens (no decode steps: not captured around generate); "
                               "capture the reference with generate (tracediff capture --generate)"),
    ("no tokens", _PORT, "{ref}: holds no generated tokens (its decode steps have no 'tokens': captured by an older "
                         "tracediff, with beam search or not by transformers' generate); capture the reference again"),
    ("another vocabulary", "model = ports.llama(); model.resize_token_embeddings(80); "
                           "return model, {'input_ids': ports.prompt()}",
     "{ref}: the reference scored 64 tokens per step and the port (LlamaForCausalLM) scores 80: teacher forcing "
     "needs one tokenizer and vocabulary"),
    ("another prompt", "return ports.llama(), {'input_ids': ports.prompt(seed=5)}",
     "{ref}: the reference generated from another prompt (6 tokens: 37, 43, 12, 8, 63, 9; the port's: 6 tokens: "
     "{other}): teacher forcing needs the same prompt and tokenizer"),
])
def test_a_reference_that_cannot_feed_the_port_exits_2_naming_it(
        sampled: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, body: str,
        message: str) -> None:
    reference = {"no decode steps": lambda: _forward_only(tmp_path),
                 "no tokens": lambda: _without_tokens(sampled, tmp_path)}.get(case, lambda: sampled("reference"))()
    other = ", ".join(str(t) for t in ports.prompt(seed=5)[0].tolist())
    assert ports.prompt()[0].tolist() == [37, 43, 12, 8, 63, 9]
    code = main(["capture", _spec(tmp_path, body), "--out", str(tmp_path / "t"), "--generate",
                 "--teacher-forcing", str(reference)])
    assert code == 2
    assert capsys.readouterr().err.strip() == \
        "tracediff capture: error: " + message.format(ref=reference, other=other)
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").glob("*.json"))  # nothing captured


def test_the_library_refuses_a_reference_of_another_vocabulary_before_capturing(
        sampled: Callable[[str], Path], tmp_path: Path) -> None:
    model = ports.gpt2()
    model.resize_token_embeddings(ports.VOCAB + 8)
    with pytest.raises(TeacherForcingError) as caught:
        with tracediff.capture(model, tmp_path / "t", teacher_forcing=sampled("reference")):
            pass
    assert str(caught.value).startswith(f"{sampled('reference')}: the reference scored 64 tokens per step")
    assert not (tmp_path / "t").exists()


def test_malformed_tokens_are_refused_in_one_line(sampled: Callable[[str], Path], tmp_path: Path) -> None:
    folder = _without_tokens(sampled, tmp_path)
    path = next(folder.glob(f"*{fmt.FULL_SUFFIX}"))
    tree = json.loads(path.read_text())
    tree[fmt.SUBSEQUENT_CALLS][0][fmt.TOKENS] = {fmt.TOKENS_CHOSEN: [3, 4], fmt.TOKENS_ARGMAX: [3]}
    path.write_text(json.dumps(tree))
    with pytest.raises(TraceFormatError) as caught:
        tracediff.load_trace(path)
    assert str(caught.value) == (f"{path}: LlamaForCausalLM: 'tokens' of step 1: 'chosen' and 'argmax' are not lists "
                                 "of token ids of one length")
