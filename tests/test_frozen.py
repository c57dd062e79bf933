"""``frozen_builder`` and drafts: the fast construction of frozen slotted dataclasses (tensor records, rows, views)."""

from __future__ import annotations

import dataclasses

import pytest

from tracediff.trace.frozen import draft_builder, freeze, frozen_builder, replaced
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


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    x: int
    label: str = ""


class PointDraft(Point):
    __slots__ = ()
    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__
    label: str


def test_a_draft_is_open_until_frozen_then_refuses_every_change() -> None:
    draft = draft_builder(PointDraft)(1)
    draft.label = "set by a later stage"
    assert type(draft) is PointDraft and (draft.x, draft.label) == (1, "set by a later stage")
    (point,) = freeze([draft], Point)
    assert point is draft and type(point) is Point and point == Point(1, "set by a later stage")
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.label = "changed after it was handed out"  # type: ignore[misc]
    with pytest.raises((dataclasses.FrozenInstanceError, TypeError)):  # TypeError: the slotted class's own check
        point.__class__ = PointDraft  # re-opening a frozen value is refused too
    with pytest.raises(TypeError):
        freeze([Point(2)], Point)  # not a draft


def test_replaced_copies_into_the_same_class_and_leaves_the_original() -> None:
    point = Point(1, "a")
    copy = replaced(point, label="b")
    assert type(copy) is Point and copy == Point(1, "b") and point.label == "a"
    draft = replaced(draft_builder(PointDraft)(1), label="c")
    assert type(draft) is PointDraft and draft.label == "c"
    with pytest.raises(TypeError, match="no field 'y'"):
        replaced(point, y=2)


def test_a_draft_class_must_add_nothing_but_settable_fields() -> None:
    class Slotted(Point):
        __slots__ = ("extra",)
        __setattr__ = object.__setattr__
        __delattr__ = object.__delattr__

    class Closed(Point):
        __slots__ = ()

    class HalfOpen(Point):  # the frozen __delattr__ would make every store slow
        __slots__ = ()
        __setattr__ = object.__setattr__

    for cls in (Slotted, Closed, HalfOpen):
        with pytest.raises(TypeError):
            draft_builder(cls)
