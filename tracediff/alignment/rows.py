"""Rows built once: a draft per compared pair while ``align`` decides it, frozen before anyone sees it.

``align`` decides a row in stages: the comparison measures the pair
(:class:`tracediff.compare.measurement.Measurement`), then the stages after
it add what the rows around it say (op names, how the pair was found,
input error and origin, noise floor, growth, the verdict's reason). Each
row is a :class:`RowDraft` through those stages: the same fields and
properties as :class:`tracediff.alignment.result.TensorComparison`, and
the fields those stages decide can be set. :func:`freeze_rows` then turns
every draft into its ``TensorComparison`` in place, before ``align``
returns: a returned row is frozen and refuses every change
(``dataclasses.FrozenInstanceError``).

Why drafts and not a copy per stage: copying every row at each stage cost a
large trace more than all its comparisons, and building a frozen row once
at the end from facts gathered apart would copy each row once more. A draft
is built without ``__init__`` (:func:`tracediff.trace.frozen.draft_builder`)
and frozen by changing its class, which costs nothing per field.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..compare.measurement import Measurement
from ..trace.frozen import draft_builder, freeze
from .pair import Evidence, MatchedBy, Pair
from .result import TensorComparison


class RowDraft(TensorComparison):
    """A ``TensorComparison`` that ``align`` is still deciding: the fields below can be set, until
    :func:`freeze_rows`. Never handed out."""

    __slots__ = ()
    __setattr__ = object.__setattr__
    __delattr__ = object.__delattr__  # both: then the interpreter stores attributes inline, as on a plain object

    # the fields decided after the comparison (the others are as measured); types as in TensorComparison
    tensor_a: str
    within_tolerance: bool | None
    status: str
    reason: str
    input_err: float | None
    amplification: float | None
    origin: str | None
    noise_floor: float | None
    noise_ratio: float | None
    growth: float | None
    matched_by: str
    transform: str | None
    pairing: str
    op: str | None
    op_index: int | None
    step: int | None
    position: int | None
    positions_beyond: int | None
    pcc: float | None
    kl_max: float | None
    top1_agreement: float | None
    top5_agreement: float | None
    top10_agreement: float | None
    argmax_flips: int | None
    flip_margin: float | None


_build_draft = draft_builder(RowDraft)


def draft_row(order: int, pair: Pair, atol: float, rtol: float, m: Measurement) -> RowDraft:
    """The draft of row ``order``: who was compared (``pair``, how it was found and under which tolerance) and
    what comparing them found (``m``: status, reason, every metric)."""
    na, ra, nb, rb = pair.node_a, pair.record_a, pair.node_b, pair.record_b
    row = _draft_fields(order, na.module_path, nb.module_path, na.call_index, nb.call_index, rb.slot, ra.slot,
                        ra.shape, rb.shape, ra.dtype, rb.dtype, atol, rtol, nb.module_type or na.module_type, m)
    if pair.matched_by is not MatchedBy.NAME or pair.transform is not None or pair.evidence is not Evidence.NAME:
        row.matched_by = pair.matched_by.value
        row.transform = pair.transform_text
        row.pairing = pair.rests_on.value
    return row


def _draft_fields(order: int, module_path_a: str, module_path_b: str, call_index: int, call_index_b: int,
                  tensor: str, tensor_a: str, shape_a: tuple[int, ...] | None, shape_b: tuple[int, ...] | None,
                  dtype_a: str | None, dtype_b: str | None, atol: float, rtol: float, module_type: str | None,
                  m: Measurement) -> RowDraft:
    """A draft from its fields, passed to the builder by position, in the order of the class's fields: binding
    27 keywords cost more than building the row itself."""
    return _build_draft(order, module_path_a, module_path_b, call_index, call_index_b, tensor, tensor_a, shape_a,
                        shape_b, dtype_a, dtype_b, m.max_abs_err, m.max_rel_err, m.mean_abs_err, m.rms_err,
                        m.cosine, m.mismatch_fraction, m.nan_mismatch, m.inf_mismatch, atol, rtol, m.required_atol,
                        m.required_rtol, m.within_tolerance, m.approximate, m.status, m.reason, module_type)


def add_note(row: RowDraft, note: str) -> None:
    """Add ``note`` to the draft's reason (``"reason; note"``)."""
    row.reason = f"{row.reason}; {note}" if row.reason else note


def freeze_rows(drafts: Iterable[RowDraft]) -> list[TensorComparison]:
    """The finished rows: each draft becomes its ``TensorComparison`` in place, so a list or tuple holding
    drafts now holds the frozen rows."""
    return freeze(drafts, TensorComparison)
