"""The tokens two generations chose, step by step: where B would have chosen another token than A.

Each decode step of a trace captured around transformers' ``generate`` holds
the token it chose and its greedy token, the one with the highest score
(``Trace.root_tokens``, ``docs/trace-format.md`` 2.2). While both sides read
the same tokens, their greedy tokens can be compared step by step: a step
where B's differs from A's is where B *would have chosen* another token
(greedy decoding would have taken it; sampling draws from the scores that make
it the favourite).

* With teacher forcing (B captured with ``teacher_forcing=A``), B reads A's
  tokens at every step, so every step is compared, and generation goes on
  after the first different choice.
* Without it, the steps are compared up to the first one where the two sides
  actually chose other tokens (``parted_at``): from there on they read
  different sequences, and their tokens say nothing about the port.

The position of a choice is that of the token whose next-token scores made
it (the last position the step reads); the chosen token goes one further.
"""

from __future__ import annotations

from ..trace.load import Trace
from ..trace.model import StepTokens
from .decode_steps import sequence_starts
from .lm_results import TokenAlignment, TokenChoice


def _steps(trace: Trace) -> dict[int, tuple[int, StepTokens]]:
    """``{step: (root index, tokens)}`` of the first generation's steps that hold tokens."""
    out: dict[int, tuple[int, StepTokens]] = {}
    for i, (step, tokens) in enumerate(zip(trace.root_steps, trace.root_tokens)):
        if step is None or tokens is None or step in out:
            continue
        out[step] = (i, tokens)
    return out


def compare_tokens(a: Trace, b: Trace) -> TokenAlignment | None:
    """The greedy tokens of A and B compared where both read the same tokens; None when a side has none."""
    steps_a, steps_b = _steps(a), _steps(b)
    common = sorted(set(steps_a) & set(steps_b))
    if not common:
        return None
    forced = all(steps_b[step][1].forced for step in common)
    prompt_a, prompt_b = (steps[0][1].prompt if 0 in steps else None for steps in (steps_a, steps_b))
    if prompt_a is not None and prompt_b is not None and prompt_a != prompt_b:
        return TokenAlignment(forced, (), (), parted_at=0 if not forced else None)
    starts = sequence_starts(b)
    compared: list[int] = []
    choices: list[TokenChoice] = []
    parted_at = None
    for step in common:
        index, tokens_b = steps_b[step]
        tokens_a = steps_a[step][1]
        if len(tokens_a.argmax) != len(tokens_b.argmax):
            break
        compared.append(step)
        start, length = starts.get(index, (None, None))
        position = start + length - 1 if start is not None and length is not None else None
        for row, (token_a, token_b) in enumerate(zip(tokens_a.argmax, tokens_b.argmax)):
            if token_a != token_b:
                choices.append(TokenChoice(step, row, position, token_a, token_b))
        if not tokens_b.forced and tokens_a.chosen != tokens_b.chosen:
            parted_at = step  # the next steps read other tokens
            break
    return TokenAlignment(forced, tuple(compared), tuple(choices), parted_at)
