"""The frozen results of the language-model verdicts, held by an ``Alignment``.

The decode steps (:mod:`tracediff.alignment.decode_steps`), the next-token and
per-position verdicts (:mod:`tracediff.alignment.lm_verdicts`) and the token
choices (:mod:`tracediff.alignment.token_choices`) compute these; the
``Alignment`` of :mod:`tracediff.alignment.result` holds them. They live in a
module of their own, which imports nothing of ``alignment``, so that the result
and the modules that compute its parts do not import each other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class StepAlignment:
    """The decode steps of an alignment of two generation traces."""

    steps_a: int
    steps_b: int
    compared: tuple[int, ...]
    selected: int | None  # ``align(..., step=K)``
    diverged: tuple[int, ...]  # steps holding a row out of tolerance, in order
    note: str | None = None  # why fewer steps were compared than a trace holds

    @property
    def first_diverging_step(self) -> int | None:
        return self.diverged[0] if self.diverged else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["compared"], out["diverged"] = list(self.compared), list(self.diverged)
        out["first_diverging_step"] = self.first_diverging_step
        return out


@dataclass(frozen=True)
class FlipVerdict:
    """A position where B picks another next token than A."""

    position: int
    token_a: int
    token_b: int
    margin: float  # A's top-1 minus top-2 logit there
    benign: bool | None  # within twice the noise floor (None: no baseline)

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "token_a": self.token_a, "token_b": self.token_b, "margin": self.margin,
                "benign": self.benign}


@dataclass(frozen=True)
class LogitsVerdict:
    """The next-token verdict of one logits row (``order``: the row's)."""

    order: int
    module_path_b: str
    tensor: str
    step: int | None
    kl: tuple[float, ...]
    topk_agreement: dict[int, float]
    flips: tuple[FlipVerdict, ...]

    @property
    def harmful_flips(self) -> tuple[FlipVerdict, ...]:
        return tuple(flip for flip in self.flips if flip.benign is not True)

    def to_dict(self) -> dict[str, Any]:
        return {"order": self.order, "module_path_b": self.module_path_b, "tensor": self.tensor, "step": self.step,
                "kl": list(self.kl), "kl_max": max(self.kl, default=0.0),
                "topk_agreement": {str(k): v for k, v in self.topk_agreement.items()},
                "flips": [flip.to_dict() for flip in self.flips]}


@dataclass(frozen=True)
class PositionStrip:
    """The error of one tensor pair (the first divergence) at each token position, relative to its tolerance.

    ``ratios[i]`` is the largest ``|a - b| / (atol + rtol * |a|)`` among the
    elements at position ``start + i``: above 1 is out of tolerance.
    """

    order: int  # the row
    start: int  # the absolute position of ``ratios[0]``
    ratios: tuple[float, ...]

    @property
    def first(self) -> int | None:
        """The first absolute position out of tolerance (None: none)."""
        return next((self.start + i for i, r in enumerate(self.ratios) if r > 1), None)

    def to_dict(self) -> dict[str, Any]:
        return {"order": self.order, "start": self.start, "ratios": list(self.ratios), "first": self.first}


@dataclass(frozen=True)
class TokenChoice:
    """A step where B, reading the same tokens as A, would have chosen another next token."""

    step: int
    sequence: int  # the sequence of the batch
    position: int | None  # the position whose next-token scores chose it
    token_a: int  # A's greedy token
    token_b: int  # B's greedy token

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sequence": self.sequence, "position": self.position, "token_a": self.token_a,
                "token_b": self.token_b}

    def describe(self, side: str = "the port") -> str:
        where = f", position {self.position}" if self.position is not None else ""
        row = f", sequence {self.sequence}" if self.sequence else ""
        return (f"{side} would have chosen token {self.token_b} at step {self.step}{where}{row} "
                f"(the reference: {self.token_a})")


@dataclass(frozen=True)
class TokenAlignment:
    """The generated tokens of two traces compared step by step (steps whose tokens both traces hold)."""

    forced: bool  # B was fed A's tokens (teacher forcing)
    compared: tuple[int, ...]  # steps whose greedy tokens were compared (both sides read the same tokens)
    choices: tuple[TokenChoice, ...]  # where B's greedy token differs from A's
    parted_at: int | None = None  # without teacher forcing: the first step where A and B chose other tokens

    @property
    def first_choice(self) -> TokenChoice | None:
        return self.choices[0] if self.choices else None

    def to_dict(self) -> dict[str, Any]:
        return {"forced": self.forced, "compared": list(self.compared),
                "choices": [choice.to_dict() for choice in self.choices], "parted_at": self.parted_at}
