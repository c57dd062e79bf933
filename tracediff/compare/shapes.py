"""Shapes that differ only by dimensions of size 1: ``[T]`` against ``[1, T]`` (no torch needed)."""

from __future__ import annotations


def squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape without its dimensions of size 1."""
    return tuple(d for d in shape if d != 1)


def squeezable(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> bool:
    """True when the shapes differ but agree once every dimension of size 1 is dropped."""
    return shape_a != shape_b and squeezed(shape_a) == squeezed(shape_b)


def squeeze_note(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> str:
    return f"compared after squeezing singleton dimensions: {list(shape_a)} vs {list(shape_b)}"
