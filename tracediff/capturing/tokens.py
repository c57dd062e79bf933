"""The tokens of each decode step, and teacher forcing: feeding the port the reference's tokens.

Inside ``tracediff.capture``, a transformers ``generate`` gets one more logits
processor, appended after its own: at each step it records the token with the
highest score (``argmax``, what greedy decoding picks), and the token the
step chose is read from the sequence once it is known. Both go on the step's
top-level call as ``tokens`` (``docs/trace-format.md``, 2.2); step 0 also
keeps the prompt and the vocabulary size.

With ``capture(model, out, teacher_forcing="traces/ref")`` the processor then
replaces the scores by ones that allow only the reference's token of that
step, so the port reads the reference's tokens step by step, whatever it
would have chosen (sampled or not), and generation stops after the
reference's number of tokens. The port's own greedy choice stays in
``argmax``; ``align`` reports the steps where it differs from the
reference's (:mod:`tracediff.alignment.token_choices`)::

    with torch.no_grad(), tracediff.capture(port, "traces/port", teacher_forcing="traces/ref"):
        port.generate(input_ids, max_new_tokens=256, do_sample=True)

A reference without recorded tokens, of another vocabulary size, or generated
from another prompt or batch is refused before anything runs
(``TeacherForcingError``, one line naming the reference). Beam search records
no tokens and cannot be teacher-forced.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import format as fmt
from ..errors import TeacherForcingError
from ..trace.load import load_trace


@dataclass(frozen=True)
class ReferenceTokens:
    """The tokens a reference generation chose, step by step (its first generation)."""

    path: Path
    chosen: tuple[tuple[int, ...], ...]  # per step, one token per sequence
    prompt: tuple[tuple[int, ...], ...] | None
    vocab_size: int | None

    @property
    def steps(self) -> int:
        return len(self.chosen)

    @property
    def batch(self) -> int:
        return len(self.chosen[0])


def read_reference_tokens(path: str | Path) -> ReferenceTokens:
    """The chosen tokens of the first generation in the trace at ``path``.

    Raises ``TeacherForcingError`` when it holds none (captured without
    ``generate``, or before tokens were recorded), and the reader's
    ``TraceFormatError`` when it is not a trace.
    """
    trace = load_trace(path)
    where = Path(path)
    if 0 not in trace.root_steps:
        raise TeacherForcingError(f"{where}: holds no generated tokens (no decode steps: not captured around "
                                  "generate); capture the reference with generate (tracediff capture --generate)")
    first = trace.root_steps.index(0)
    chosen: list[tuple[int, ...]] = []
    prompt, vocab = None, None
    for i in range(first, len(trace.roots)):
        tokens = trace.root_tokens[i] if i < len(trace.root_tokens) else None
        if trace.root_steps[i] != i - first or tokens is None:
            break
        if i == first:
            prompt, vocab = tokens.prompt, tokens.vocab_size
        chosen.append(tokens.chosen)
    if not chosen:
        raise TeacherForcingError(f"{where}: holds no generated tokens (its decode steps have no 'tokens': "
                                  "captured by an older tracediff, with beam search or not by transformers' "
                                  "generate); capture the reference again")
    if len({len(step) for step in chosen}) != 1:
        raise TeacherForcingError(f"{where}: its decode steps hold tokens for different numbers of sequences")
    return ReferenceTokens(where, tuple(chosen), prompt, vocab)


def is_transformers_generation(model: nn.Module) -> bool:
    """True for a model whose ``generate`` is transformers' (never imports transformers itself)."""
    module = sys.modules.get("transformers")
    mixin = getattr(module, "GenerationMixin", None) if module is not None else None
    return mixin is not None and isinstance(model, mixin)


def vocabulary_size(model: nn.Module) -> int | None:
    """The number of scores the model gives each next token: its output embedding's rows, else its config's."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim == 2:
        return int(weight.shape[0])
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return size if type(size) is int else None


def check_forcing_model(forcing: ReferenceTokens, model: nn.Module) -> None:
    """Refuse a model that cannot be fed ``forcing``'s tokens (not transformers' generate, another vocabulary)."""
    if not is_transformers_generation(model):
        raise TeacherForcingError(f"{forcing.path}: teacher forcing feeds tokens through transformers' generate; "
                                  f"{type(model).__name__} has no such generate")
    port = vocabulary_size(model)
    _refuse_another_vocabulary(forcing, port, f" ({type(model).__name__})")
    top = max(max(step) for step in forcing.chosen)
    if port is not None and top >= port:
        raise TeacherForcingError(f"{forcing.path}: the reference chose token {top}, beyond the port's vocabulary "
                                  f"of {port}: teacher forcing needs one tokenizer and vocabulary")


def _refuse_another_vocabulary(forcing: ReferenceTokens, port: int | None, who: str = "") -> None:
    if forcing.vocab_size is not None and port is not None and port != forcing.vocab_size:
        raise TeacherForcingError(f"{forcing.path}: the reference scored {forcing.vocab_size} tokens per step and "
                                  f"the port{who} scores {port}: teacher forcing needs one tokenizer and vocabulary")


def check_forcing_prompt(forcing: ReferenceTokens, input_ids: Any) -> None:
    """Refuse a prompt other than the reference's (another tokenizer, text or batch), when both are known."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        return
    if input_ids.shape[0] != forcing.batch:
        raise TeacherForcingError(f"{forcing.path}: the reference generated {forcing.batch} sequences and the port "
                                  f"is given {input_ids.shape[0]}: teacher forcing needs the same prompt")
    if forcing.prompt is not None:
        port = tuple(tuple(row) for row in input_ids.tolist())
        if port != forcing.prompt:
            raise TeacherForcingError(f"{forcing.path}: the reference generated from another prompt "
                                      f"({_head(forcing.prompt)}; the port's: {_head(port)}): teacher forcing "
                                      "needs the same prompt and tokenizer")


def _head(prompt: Sequence[Sequence[int]]) -> str:
    first = list(prompt[0]) if prompt else []
    shown = ", ".join(str(t) for t in first[:8]) + (", ..." if len(first) > 8 else "")
    return f"{len(first)} tokens: {shown}"


def prompt_ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``input_ids`` a ``generate(*args, **kwargs)`` call starts from (None when passed otherwise)."""
    for key in ("input_ids", "inputs"):
        if key in kwargs:
            return kwargs[key]
    return args[0] if args else None


def _beams(model: nn.Module, kwargs: dict[str, Any]) -> int:
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    beams = kwargs.get("num_beams", getattr(config, "num_beams", 1))
    return beams if type(beams) is int else 1


class StepTokens:
    """One generation's token recorder: a logits processor plus, with teacher forcing, a stopping criterion.

    ``nodes`` is the list of the generation's top-level calls, in step order,
    filled by the step tracker as they start; the processor writes ``tokens``
    on the node of the step whose scores it receives.
    """

    def __init__(self, nodes: list[dict[str, Any]], forcing: ReferenceTokens | None) -> None:
        self.nodes = nodes
        self.forcing = forcing
        self.calls = 0
        self._pending: tuple[dict[str, Any], dict[str, Any], int] | None = None  # node, tokens, input length

    def install(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """The keywords to call ``generate`` with, this recorder added; None when tokens cannot be recorded."""
        if self.forcing is not None:
            check_forcing_prompt(self.forcing, prompt_ids(args, kwargs))
        reason = None
        if not is_transformers_generation(model):
            reason = "it is not transformers' generate"
        elif len(args) > 2:
            reason = "its logits processors are passed by position"
        elif _beams(model, kwargs) != 1:
            reason = "beam search chooses tokens across beams"
        if reason is not None:
            if self.forcing is not None:
                raise TeacherForcingError(f"{self.forcing.path}: cannot feed the reference's tokens: {reason}")
            return None
        from transformers import LogitsProcessorList, StoppingCriteriaList

        out = dict(kwargs)
        out["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or ()), self.scores])
        if self.forcing is not None:
            out["stopping_criteria"] = StoppingCriteriaList([*(kwargs.get("stopping_criteria") or ()), self.stop])
        return out

    def scores(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The logits processor: record this step's greedy token; with teacher forcing, allow only the reference's."""
        self.calls += 1
        if not self.nodes:
            return scores
        node = self.nodes[-1]
        step = node.get(fmt.STEP)
        self._settle(input_ids[:, -1].tolist() if input_ids.ndim == 2 else None)
        argmax = scores.argmax(dim=-1).tolist()
        tokens: dict[str, Any] = {fmt.TOKENS_ARGMAX: argmax}
        forcing = self.forcing
        if forcing is not None and isinstance(step, int) and step < forcing.steps:
            _refuse_another_vocabulary(forcing, int(scores.shape[-1]))
            tokens[fmt.TOKENS_FORCED] = True
            reference = torch.tensor(forcing.chosen[step], device=scores.device)
            scores = torch.full_like(scores, float("-inf"))
            scores[torch.arange(scores.shape[0], device=scores.device), reference] = 0.0
        if step == 0:
            tokens[fmt.TOKENS_PROMPT] = input_ids.tolist()
            tokens[fmt.TOKENS_VOCAB_SIZE] = int(scores.shape[-1])
        self._pending = (node, tokens, int(input_ids.shape[-1]))
        return scores

    def stop(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        """The stopping criterion of teacher forcing: done once every reference token was fed."""
        done = self.forcing is not None and self.calls >= self.forcing.steps
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

    def finish(self, output: Any) -> None:
        """``generate`` returned ``output``: the last step's chosen token is the one after its input."""
        sequences = output if isinstance(output, torch.Tensor) else getattr(output, "sequences", None)
        if self._pending is None or not isinstance(sequences, torch.Tensor) or sequences.ndim != 2:
            return
        length = self._pending[2]
        if sequences.shape[1] > length:
            self._settle(sequences[:, length].tolist())

    def _settle(self, chosen: list[int] | None) -> None:
        """Write the pending step's ``tokens`` now that the token it chose is known."""
        if self._pending is None or chosen is None:
            return
        node, tokens, _ = self._pending
        self._pending = None
        if len(chosen) == len(tokens[fmt.TOKENS_ARGMAX]):
            node[fmt.TOKENS] = {fmt.TOKENS_CHOSEN: chosen, **tokens}


def forcing_option(forcing: ReferenceTokens | None) -> dict[str, Any] | None:
    """The metadata's ``options.teacher_forcing``."""
    if forcing is None:
        return None
    return {fmt.TEACHER_FORCING_REFERENCE: str(forcing.path), fmt.TEACHER_FORCING_STEPS: forcing.steps}
