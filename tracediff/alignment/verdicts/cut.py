"""One computation cut at two points: a call's output that differs by design, accepted on the evidence after it.

transformers' Gemma 2 scales the token embedding inside ``embed_tokens``; mlx-lm scales right after it, in
the model's own code. ``embed_tokens``' outputs then differ, while the next call's input agrees. The
evidence is the dataflow: on one side the call's output flows unchanged into a later compared input (the
same payload), on the other side that input is another value (code between changed it), and the two
inputs agree. The output's row is then accepted, with a note naming the input that agrees; a real mistake
in the call shows in that input too, and is not accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..pair import Pair
from ..rows import RowDraft


def accept_cut_elsewhere(rows: Sequence[RowDraft], pairs: Sequence[Pair], *, sharded: bool = False) -> set[int]:
    """Accept each diverged output row whose value one side passes on unchanged to an input that agrees;
    returns the rows accepted.

    An accepted row's difference is by design: what flows on is the input that agrees, so the sources'
    rules count no error of its own (:func:`tracediff.alignment.verdicts.sources.find_sources`' ``explained``).

    ``sharded``: a side is a multi-rank trace, whose records name rank 0's shard: a gather between two calls
    gives one global value a new payload there, so payloads say nothing of code that changed a value, and no
    row is accepted this way."""
    accepted: set[int] = set()
    if sharded:
        return accepted
    # agreeing input rows by payload, on each side: the only rows an output can flow into unchanged (this
    # pass changes output rows alone, so the index stays true while it runs)
    by_a: dict[str, list[int]] = {}
    by_b: dict[str, list[int]] = {}
    for later, pair in enumerate(pairs):
        la, lb = pair.record_a, pair.record_b
        if rows[later].within_tolerance is True and la.slot.startswith("inputs"):
            if la.payload is not None:
                by_a.setdefault(la.payload, []).append(later)
            if lb.payload is not None:
                by_b.setdefault(lb.payload, []).append(later)
    for index, row in enumerate(rows):
        ra, rb = pairs[index].record_a, pairs[index].record_b
        if row.within_tolerance is not False or not ra.slot.startswith("outputs") or row.transform is not None:
            continue
        candidates = set(by_a.get(ra.payload, ()) if ra.payload is not None else ()) | set(
            by_b.get(rb.payload, ()) if rb.payload is not None else ())
        for later in sorted(candidates):
            la, lnode_b, lb = pairs[later].record_a, pairs[later].node_b, pairs[later].record_b
            flows_a = la.payload is not None and la.payload == ra.payload and lb.payload != rb.payload
            flows_b = lb.payload is not None and lb.payload == rb.payload and la.payload != ra.payload
            if flows_a or flows_b:
                side, other = ("A", "B") if flows_a else ("B", "A")
                where = f"{lnode_b.module_path} {lb.slot}"
                row.within_tolerance, row.status = True, "close"
                row.reason = (f"cut at another point: {side}'s output flows unchanged into {where}, which agrees "
                              f"with {other}'s value there ({other}'s code after this call does what {side} "
                              "does inside it)")
                accepted.add(index)
                break
    return accepted
