"""Alignments built from a real one, for report tests: with hostile names, and with thousands of rows."""

from __future__ import annotations

from dataclasses import replace

from tracediff.alignment.result import Alignment, ArgumentDiff, Unmatched

# Module names can hold anything; each of these runs script if inserted as HTML or breaks out of the JSON block.
PAYLOADS = (
    '<img src=x onerror="window.__xss=1">',
    "</script><script>window.__xss=2</script>",
    "\u2028\"'&amp;<!--",
)


def hostile(result: Alignment) -> Alignment:
    """``result`` with every B path, one tensor slot, unmatched nodes, values and warnings made hostile."""
    rows = []
    for row in result.rows:
        payload = PAYLOADS[row.order % len(PAYLOADS)]
        rows.append(replace(row, module_path_b=f"{row.module_path_b}.{payload}", reason=row.reason + payload,
                            tensor=row.tensor if row.order else payload, module_type=payload))
    return replace(
        result, rows=tuple(rows), model_b=PAYLOADS[0], trace_b=PAYLOADS[1],
        unmatched_a=(Unmatched(PAYLOADS[0], 0), Unmatched("x", 1, PAYLOADS[1])),
        unmatched_b=(Unmatched(PAYLOADS[1], 0),),
        argument_diffs=(ArgumentDiff(PAYLOADS[0], PAYLOADS[1], 0, "inputs.kwargs.mode", PAYLOADS[2], PAYLOADS[0],
                                     "value differs"),),
        warnings=(PAYLOADS[1],), suggested_rename=((PAYLOADS[0], PAYLOADS[1]),),
    )


def scaled(result: Alignment, copies: int) -> Alignment:
    """``result``'s rows repeated ``copies`` times as if the model had ``copies`` times the layers."""
    rows = []
    for k in range(copies):
        for row in result.rows:
            rows.append(replace(row, order=len(rows),
                                module_path_b=row.module_path_b.replace(".layers.", f".layers.{k}_"),
                                module_path_a=row.module_path_a.replace(".blocks.", f".blocks.{k}_")))
    return replace(result, rows=tuple(rows))
