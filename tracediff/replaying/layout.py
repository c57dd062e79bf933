"""Calling B's module in B's own argument layout, filled with A's paired values.

A port's modules rarely take the reference's arguments: transformers' attention takes
``hidden_states=`` where a research block passes ``x`` by position, plus a mask and rotary tables the
reference computed elsewhere; fair-esm's layers take ``[T, B, C]``. B's own forward on A's top-level
inputs (the shadow run) recorded what each of B's calls received. A call is replayed with exactly that,
each tensor that pairs with one of A's (the pairing ``align`` uses) replaced by A's recorded value, in
B's dtype, device and layout; what has no partner in A keeps B's own value. B's outputs are then read
back under A's slots.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..alignment.pairing.slots import Parameters, pair_tensors
from ..compare.masks import MASKED_AT, as_masks
from ..trace.model import Node, TensorRecord
from ..trace.payload import payload_of
from .inputs import cast, substitute

Loader = Callable[[TensorRecord], torch.Tensor]


def layouts_differ(node_a: Node, node_b: Node) -> bool:
    """Do A and B pass this call's inputs under different slots (or shapes)?"""
    return {(t.slot, t.shape) for t in node_a.inputs()} != {(t.slot, t.shape) for t in node_b.inputs()}


def inputs_in_b_layout(node_a: Node, node_b: Node, b_inputs: tuple[tuple[Any, ...], dict[str, Any]],
                       load: Loader, parameters: Parameters = (None, None)
                       ) -> tuple[tuple[Any, ...], dict[str, Any], dict[str, str]]:
    """B's own ``(args, kwargs)`` of this call with A's paired tensors in place, and A's output slot -> B's."""
    pairs, _, _ = pair_tensors(node_a, node_b, parameters=parameters)
    from_a = {b.slot: a for a, b in pairs if b.slot.startswith("inputs")}
    outputs = {a.slot: b.slot for a, b in pairs if a.slot.startswith("outputs")}

    def fill(slot: str, own: torch.Tensor) -> torch.Tensor:
        record = from_a.get(slot)
        if record is None or record.payload is None:
            return own
        loaded = load(record)
        mask = in_b_convention(loaded, own)
        if mask is not None:  # a mask written otherwise: A's masked positions, in B's convention
            return mask
        value = fitted(loaded, own)
        if value is None:
            return own
        return cast(value, own.dtype if own.is_floating_point() else None, own.device)

    args, kwargs = b_inputs
    return (substitute(tuple(args), fill, "inputs.args"), substitute(dict(kwargs), fill, "inputs.kwargs"),
            outputs)


def in_b_convention(value: torch.Tensor, own: torch.Tensor) -> torch.Tensor | None:
    """A's attention mask ``value`` written as B's own mask ``own`` is written (boolean keep or drop, additive,
    0/1, B's shape), when the two are masks in other conventions (:mod:`tracediff.compare.masks`); None
    otherwise. A mask masking the same positions is B's own value unchanged."""
    pair = as_masks(payload_of(value.detach().cpu()), payload_of(own.detach().cpu()))
    if pair is None:
        return None
    if pair.same:
        return own
    masked = torch.from_numpy(np.ascontiguousarray(pair.a))
    if tuple(masked.shape) != tuple(own.shape):
        if masked.numel() != own.numel():
            return None
        masked = masked.reshape(own.shape)
    masked = masked.to(own.device)
    if pair.convention_b == "boolean keep":
        return ~masked
    if pair.convention_b == "boolean drop":
        return masked
    if pair.convention_b == "0/1 keep":
        return (~masked).to(own.dtype)
    fill = own.min() if bool((own <= MASKED_AT).any()) else torch.finfo(own.dtype).min
    return torch.zeros_like(own).masked_fill(masked, fill)


def output_partners(node_a: Node, node_b: Node, parameters: Parameters = (None, None)) -> dict[str, str]:
    """A's output slot -> B's, as ``align`` pairs them (``outputs`` with ``outputs.0`` of an attention that
    returns its weights too)."""
    pairs, _, _ = pair_tensors(node_a, node_b, parameters=parameters)
    return {a.slot: b.slot for a, b in pairs if a.slot.startswith("outputs")}


def fitted(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
    """``value`` laid out as ``like``: as is, reshaped (dimensions of size 1), or the permutation closest to
    ``like``'s values (``[T, B, C]`` into ``[B, T, C]``); None when the sizes differ."""
    if tuple(value.shape) == tuple(like.shape):
        return value
    if value.numel() != like.numel():
        return None
    if [d for d in value.shape if d != 1] == [d for d in like.shape if d != 1]:
        return value.reshape(like.shape)
    best, best_err = None, float("inf")
    if value.dim() <= 5:
        target = like.detach().to("cpu", torch.float64)
        for order in itertools.permutations(range(value.dim())):
            candidate = value.permute(order)
            if tuple(candidate.shape) != tuple(like.shape):
                continue
            err = float((candidate.to(torch.float64) - target).abs().max()) if like.numel() else 0.0
            if err < best_err:
                best, best_err = candidate, err
    return best.contiguous() if best is not None else None


def bound_to(forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
             ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """A's top-level ``(args, kwargs)`` for a ``forward`` that does not take them as they are: the keywords
    it does not know become its next positional arguments (``input_ids=`` into ``forward(tokens)``); None
    when nothing changes or its signature cannot be read."""
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    known = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    kept = {key: value for key, value in kwargs.items() if key in known}
    spare = [value for key, value in kwargs.items() if key not in known and isinstance(value, torch.Tensor)]
    if not spare:
        return None
    return (*args, *spare), kept
