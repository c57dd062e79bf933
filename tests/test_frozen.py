"""``frozen_builder``: the fast constructor of frozen slotted dataclasses (tensor records, rows, views)."""

from __future__ import annotations

import dataclasses

import pytest

from tracediff.trace.frozen import frozen_builder
from tracediff.trace.model import TensorRecord


def test_builds_what_the_class_builds_defaults_included() -> None:
    build = frozen_builder(TensorRecord)
    fast = build(slot="outputs", order=3, shape=(2,), dtype="torch.float32", stats={"mean": 0.5})
    plain = TensorRecord(slot="outputs", order=3, shape=(2,), dtype="torch.float32", stats={"mean": 0.5})
    assert type(fast) is TensorRecord and fast == plain and hash(fast.shape) == hash(plain.shape)
    assert [getattr(fast, f.name) for f in dataclasses.fields(TensorRecord)] == \
        [getattr(plain, f.name) for f in dataclasses.fields(TensorRecord)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.slot = "inputs"  # type: ignore[misc]
    with pytest.raises(TypeError):
        build(slot="outputs")  # required fields stay required


def test_refuses_what_it_cannot_build_faithfully() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("negative")

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        items: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Base:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Derived(Base):  # its slot layout is not its own: the twin could not match it
        y: int = 0

    for cls in (NoSlots, Checked, Factory, Derived):
        with pytest.raises(TypeError):
            frozen_builder(cls)
