"""Rendering an ``Alignment`` as a console table, Markdown, CSV or JSON.

JSON is strict (parsable by any JSON reader): NaN becomes ``null`` and
infinities become the strings ``"inf"`` and ``"-inf"``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..alignment.result import Alignment, TensorComparison
from .grid import grid
from .matching import (
    argument_lines,
    pairing_counts,
    row_label,
    suggestion_lines,
    unmatched_lines,
    unrecorded_note,
)
from .strict_json import strict_json_value
from .text import markdown_text, printable
from .verdicts import baseline_line, focus_row, ignored_lines, origin_note, source_lines

_SHOWN = ["order", "module_path_b", "tensor", "shape_b", "dtype_b", "max_abs_err", "max_rel_err", "cosine",
          "mismatch_fraction", "noise_ratio", "growth", "status", "origin"]
_HEADERS = ["#", "module (B)", "tensor", "shape", "dtype", "max abs", "max rel", "cosine", "mismatch", "x noise",
            "growth", "status", "origin"]


def render_json(result: Alignment) -> str:
    return json.dumps(strict_json_value(result.to_dict()), indent=2, allow_nan=False, default=str)


def render_csv(result: Alignment) -> str:
    return str(result.table.to_csv(index=False))


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value) or "scalar"
    if isinstance(value, str) and value.startswith("torch."):
        return value[len("torch."):]
    return str(value)


def _cells(row: TensorComparison, first: TensorComparison | None, sources: frozenset[int] = frozenset()) -> list[str]:
    data: dict[str, Any] = row.to_dict()
    data["shape_b"] = row.shape_b
    if not math.isnan(row.cosine):
        data["cosine"] = f"{row.cosine:.6f}"
    if row.approximate:
        data["status"] = f"{row.status} (stats)"
    if row.op is not None:  # an op row: the op, its index in the module call, then its slot
        data["tensor"] = f"{row.op.removeprefix('torch.')} #{row.op_index} {row.tensor}"
    data["tensor"] = row_label(row, data["tensor"])
    marker = ">>" if first is not None and row.order == first.order else ("S" if row.order in sources else "")
    return [marker] + [_fmt(data[key]) for key in _SHOWN]


def incomplete_lines(result: Alignment) -> list[str]:
    """One line per incomplete trace, saying why it does not cover the whole forward."""
    return [f"INCOMPLETE trace {side}: {why}" for side, why in (("A", result.incomplete_a), ("B", result.incomplete_b))
            if why]


def _imported(kind: str | None) -> str:
    return f", imported from a dump of kind {kind}" if kind else ""


def headline(result: Alignment) -> list[str]:
    """The summary lines shared by the table and Markdown outputs."""
    s = result.summary()
    statuses = ", ".join(f"{n} {status}" for status, n in sorted(s["statuses"].items())) or "nothing"
    how = "by structure" if result.structural else "by name"
    lines = [
        f"A: {result.trace_a} ({result.model_a}{_imported(result.importer_a)})",
        f"B: {result.trace_b} ({result.model_b}{_imported(result.importer_b)})",
        f"matched {s['matched_nodes']} module calls {how}{pairing_counts(result)}; "
        f"compared {s['compared']} tensors: {statuses}"
        + (f" ({s['approximate']} from statistics only)" if s["approximate"] else ""),
    ]
    lines += unmatched_lines(result)
    verdict = baseline_line(result)
    if verdict:
        lines.append(verdict)
    lines += incomplete_lines(result)
    lines += step_lines(result)
    lines += shard_lines(result)
    first = result.first_divergence
    if first is None:
        unreadable = len(result.unreadable)
        disagree = sum(finding.failing for finding in result.shard_findings)
        lines.append("PASSED: every compared tensor is within tolerance" if result.passed
                     else f"NOT PASSED: {unreadable} tensor(s) could not be read" if unreadable
                     else f"NOT PASSED: the ranks disagree on {disagree} replicated tensor(s)" if disagree
                     else f"UNDECIDED: {result.reason}")
    else:
        lines.append(f"FIRST DIVERGENCE ({first.origin}): {first.describe()}")
        if first.rank is not None:
            lines.append(f"  rank {first.rank}'s shard is the first out of tolerance")
        if first.input_err is not None and first.amplification is not None:
            lines.append(f"  what flowed into this call had max_abs_err={first.input_err:.3g}; "
                         f"amplification={_fmt(first.amplification)}")
        note = origin_note(first) if first.origin == "between modules" else unrecorded_note(first)
        if note:
            lines.append(f"  {note}")
        source = result.likely_source
        if source is not None:
            lines.append(f"LIKELY SOURCE: {source.module_path_b} (call {source.call_index}): {source.reason}")
            lines += [f"  {line}" for line in source.evidence]
        backward = result.first_backward_divergence
        if backward is not None and backward is not first:
            lines.append(f"FIRST GRADIENT DIVERGENCE ({backward.origin}): {backward.describe()}")
    return lines


def step_lines(result: Alignment) -> list[str]:
    """The decode steps compared and the first diverging one, then the next-token verdicts that differ."""
    steps = result.steps
    if steps is None:
        return []
    compared = f"{steps.compared[0]}-{steps.compared[-1]}" if len(steps.compared) > 1 else \
        ", ".join(str(s) for s in steps.compared) or "none"
    lines = [f"decode steps: compared {compared} (A holds {steps.steps_a}, B {steps.steps_b})"
             + (f"; first diverging step {steps.first_diverging_step} ({len(steps.diverged)} of "
                f"{len(steps.compared)} steps diverge)" if steps.first_diverging_step is not None
                else "; every step within tolerance")]
    lines += token_lines(result)
    for verdict in result.logits:
        if verdict.flips or max(verdict.kl, default=0.0) > 0:
            lines.append("  " + logits_line(verdict))
    return lines


def token_lines(result: Alignment, *, limit: int = 3) -> list[str]:
    """The generated tokens: teacher forcing or where the two sides parted, then where B would have chosen
    another token than A (the first ``limit``)."""
    tokens = result.tokens
    if tokens is None:
        return []
    steps = len(tokens.compared)
    if tokens.forced:
        head = (f"teacher forcing: B read A's tokens; B would have chosen another token at {len(tokens.choices)} "
                f"of {steps} steps" if tokens.choices else
                f"teacher forcing: B read A's tokens; B would have chosen A's token at every step ({steps})")
    elif tokens.parted_at is not None:
        head = (f"generated tokens: A and B chose other tokens at step {tokens.parted_at}; later steps read other "
                f"tokens (capture B with --teacher-forcing A to feed it A's tokens)")
    else:
        head = f"generated tokens: A and B chose the same tokens at every step compared ({steps})"
    lines = [head]
    for choice in tokens.choices[:limit]:
        lines.append("  " + choice.describe())
    if len(tokens.choices) > limit:
        lines.append(f"  ... and {len(tokens.choices) - limit} more")
    return lines


def logits_line(verdict: Any) -> str:
    """One logits verdict: KL, top-k agreement, and the first argmax flip with its margin."""
    where = f"step {verdict.step}" if verdict.step is not None else verdict.module_path_b
    agreement = ", ".join(f"top-{k} {v:.2f}" for k, v in verdict.topk_agreement.items())
    text = f"{where} {verdict.tensor}: KL max {max(verdict.kl, default=0.0):.3g}; {agreement}"
    if verdict.flips:
        flip = verdict.flips[0]
        benign = {True: ", benign: within the noise floor", False: ", beyond the noise floor", None: ""}[flip.benign]
        text += (f"; {len(verdict.flips)} argmax flip(s), first at position {flip.position}: {flip.token_a} -> "
                 f"{flip.token_b} (reference margin {flip.margin:.3g}{benign})")
    return text


def _window(result: Alignment, all_rows: bool, context: int, focus: int = 0) -> list[TensorComparison]:
    rows = list(result.rows)
    if all_rows:
        return rows
    first = focus_row(result, focus)
    if first is None:
        return [r for r in rows if r.status not in ("identical", "close")][: 2 * context + 1]
    i = rows.index(first)
    return rows[max(0, i - context): i + context + 1]


def shard_lines(result: Alignment, *, limit: int = 5) -> list[str]:
    """The shards' own findings: the first ``limit`` where ranks disagree on a replica, then the unplaced."""
    failing = [f for f in result.shard_findings if f.failing]
    unplaced = [f for f in result.shard_findings if not f.failing]
    lines = [f"RANKS DISAGREE ({f.kind}) in {f.describe()}" for f in failing[:limit]]
    if len(failing) > limit:
        lines.append(f"  ... and {len(failing) - limit} more where the ranks disagree (--format json lists all)")
    lines += [f"not placed, not compared: {f.describe()}" for f in unplaced[:limit]]
    if len(unplaced) > limit:
        lines.append(f"  ... and {len(unplaced) - limit} more tensors not placed")
    return lines


def render_table(result: Alignment, *, all_rows: bool = False, context: int = 5, tablefmt: str = "simple",
                 focus: int = 0) -> str:
    """Summary, first divergence, and the rows around it (every row with ``all_rows``).

    ``focus=N`` centres the rows on error source N+1 instead of the first divergence (rows marked ``S``
    are sources, ``>>`` the first divergence); the top 5 sources are listed, every one with ``all_rows``.
    """
    lines = headline(result) + source_lines(result, all_sources=all_rows) + ignored_lines(result)
    shown = _window(result, all_rows, context, focus)
    first = result.first_divergence
    sources = frozenset(r.order for r in result.sources)
    if shown:
        table = _table([_cells(r, first, sources) for r in shown], [""] + _HEADERS, tablefmt)
        lines += ["", table]
        if not all_rows and len(shown) < len(result.rows):
            lines.append(f"({len(shown)} of {len(result.rows)} rows shown; --all shows every row)")
    lines += argument_lines(result)
    lines += suggestion_lines(result)
    lines += [f"warning: {w}" for w in result.warnings]
    return printable("\n".join(lines), keep_newlines=True) + "\n"  # no terminal escapes from trace names


def render_markdown(result: Alignment, *, all_rows: bool = False, context: int = 5, focus: int = 0) -> str:
    extra = source_lines(result, all_sources=all_rows) + ignored_lines(result)
    head = "\n".join([f"- {markdown_text(line)}" for line in headline(result)]
                     + [f"- {markdown_text(line.strip())}" for line in extra])
    shown = _window(result, all_rows, context, focus)
    first = result.first_divergence
    sources = frozenset(r.order for r in result.sources)
    table = grid([[markdown_text(cell) for cell in _cells(r, first, sources)] for r in shown],
                 [""] + _HEADERS, markdown=True) if shown else ""
    return f"{head}\n\n{table}\n"


def _table(rows: list[list[str]], headers: list[str], tablefmt: str) -> str:
    if tablefmt in ("simple", "github"):
        return grid(rows, headers, markdown=tablefmt == "github")
    from tabulate import tabulate  # any other of tabulate's formats, on request only
    return str(tabulate(rows, headers=headers, tablefmt=tablefmt, disable_numparse=True))
