"""Rendering an ``Alignment`` as one self-contained HTML report.

The file opens offline (no network, no external resource: the CSS and JS of
``report.css`` / ``report.js`` are inlined) and holds, from the top: the
verdict and the first divergence; the error of every compared tensor along
execution order (max-abs and max-relative error on a log scale, the atol
line, the first divergence marked; an SVG drawn in the page); B's call tree
coloured by error, in collapsible ``<details>``; the full table, sortable and
filterable, 100 rows a page; unmatched nodes, differing non-tensor values,
warnings and suggested rename rules.

The rows travel as one JSON document inside the page (strings interned,
floats rounded to 5 significant digits), so a trace of thousands of tensors
stays a file of a few hundred kilobytes. Every text from the traces is
escaped: HTML text through ``html.escape``, the JSON with ``<``, ``>``, ``&``
and line separators as ``\\u`` escapes, and the page's script inserts it
with ``textContent`` only.

Limitations: the plot and the table need JavaScript (a ``<noscript>`` note
says so); the call tree and the lists do not. The tree is rebuilt from B's
module paths, so a module called several times is one entry (its worst call).
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .._version import __version__
from ..alignment.result import TABLE_COLUMNS, Alignment, TensorComparison
from .alignment import step_lines, token_lines
from .verdicts import baseline_line, origin_note

_LIST_LIMIT = 1000
_VALUE_CHARS = 200
_OK = ("identical", "close")


def render_html(result: Alignment, *, title: str | None = None) -> str:
    """The report as one HTML document (a ``str``; write it with UTF-8)."""
    first = result.first_divergence
    heading = title or f"{result.model_b} vs {result.model_a}"
    verdict = "PASSED" if result.passed else "DIVERGED" if first is not None else \
        "UNDECIDED" if result.verdict == "undecided" else "NOT PASSED"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
        f"<title>{_e(verdict)}: {_e(heading)} · tracediff</title>",
        f"<style>{_static('report.css')}</style></head>",
        f'<body data-ready="0" data-verdict="{_e(verdict.lower())}">',
        _header(result, heading, verdict, first),
        _nav(result),
        '<section id="plot"><h2>Error along execution order</h2>'
        '<p class="hint">Each point is one compared tensor, in B\'s execution order. '
        "Hover for details, click to show it in the table.</p>"
        '<div class="legend plot-legend"><span><span class="swatch sw-abs"></span>max abs error</span>'
        '<span><span class="swatch sw-rel"></span>max rel error</span>'
        '<span><span class="swatch sw-tol"></span>atol</span>'
        '<span><span class="swatch sw-first"></span>first divergence</span>'
        '<span><span class="swatch sw-noise"></span>noise band (K &times; the baseline\'s noise floor)</span>'
        '<span><span class="swatch sw-source"></span>error source</span>'
        '<span><span class="dot sev3"></span>out of tolerance</span></div>'
        '<div id="plot-area" class="plot"></div>'
        "<noscript><p class=\"warn\">The plot and the table need JavaScript.</p></noscript></section>",
        _steps_section(result),
        _tree_section(result, first),
        _table_section(),
        _lists_section(result),
        f'<footer>tracediff {_e(__version__)} · A: {_e(result.trace_a)} · B: {_e(result.trace_b)}</footer>',
        f'<script type="application/json" id="tracediff-data">{_data_json(result)}</script>',
        f"<script>{_static('report.js')}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _static(name: str) -> str:
    # The static files hold no "</" (a test checks), so they cannot close their own element.
    return resources.files("tracediff.render").joinpath(name).read_text(encoding="utf-8")


def _num(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.3g}"


# --- header ------------------------------------------------------------------------------------------


def _header(result: Alignment, heading: str, verdict: str, first: TensorComparison | None) -> str:
    s = result.summary()
    chips = [f'<span class="chip">{s["compared"]} tensors compared</span>',
             f'<span class="chip">{s["matched_nodes"]} module calls matched '
             f'{"by structure" if result.structural else "by name"}</span>']
    for status, n in sorted(s["statuses"].items()):
        chips.append(f'<span class="chip st-{_e(status)}">{n} {_e(status)}</span>')
    if s["approximate"]:
        chips.append(f'<span class="chip">{s["approximate"]} from statistics only</span>')
    if result.unmatched_a or result.unmatched_b:
        chips.append(f'<span class="chip">{len(result.unmatched_a)} only in A, {len(result.unmatched_b)} only in B'
                     "</span>")
    if first is not None:
        where = _e(first.module_path_b)
        if first.op is not None:  # an op row: "torch.Tensor.mul #13 inside model.layers.1.self_attn"
            where = f"{_e(first.op)} #{_e(first.op_index)} inside {where}"
        if first.module_path_a != first.module_path_b:
            where += f' <span class="muted">(A: {_e(first.module_path_a)})</span>'
        call = f" call {first.call_index_b}" if first.call_index_b else ""
        amplification = ""
        comes_out = first.tensor.split(".", 1)[0] in ("outputs", "grad_inputs")  # forward or backward
        if comes_out and first.input_err == 0:
            amplification = ("<li>what flowed into this call is identical in both traces: the difference starts "
                             "here</li>")
        elif comes_out and first.input_err is not None:
            amplification = (f"<li>what flowed into this call differed by at most {_e(_num(first.input_err))}; "
                             f"this call amplified that {_e(_num(first.amplification))}&times;</li>")
        detail = (
            f'<div id="first-divergence" class="first" data-order="{first.order}">'
            f'<div class="label">First divergence · {_e(first.origin or "")}</div>'
            f'<div class="where"><code>{where}</code>{_e(call)} <code class="slot">{_e(first.tensor)}</code></div>'
            f"<ul><li>max abs error <b>{_e(_num(first.max_abs_err))}</b>, max rel error "
            f"<b>{_e(_num(first.max_rel_err))}</b>, cosine {_e(_num(first.cosine))}; {_e(first.reason)}</li>"
            f"<li>tolerance atol={_e(_num(first.atol))} rtol={_e(_num(first.rtol))}; would pass with "
            f"atol&ge;{_e(_num(first.required_atol))} or rtol&ge;{_e(_num(first.required_rtol))}</li>"
            f"{amplification}</ul>{_position_strip(result)}"
            '<a href="#table" class="jump" data-order-link="first">show in the table</a></div>'
        )
    elif result.passed:
        detail = '<div id="first-divergence" class="first ok">Every compared tensor is within tolerance.</div>'
    elif result.unreadable:
        detail = (f'<div id="first-divergence" class="first na">{len(result.unreadable)} tensor(s) could not be '
                  "read; see the table (status unreadable).</div>")
    elif disagree := sum(finding.failing for finding in result.shard_findings):
        detail = (f'<div id="first-divergence" class="first">The ranks disagree on {disagree} replicated '
                  'tensor(s); see <a href="#shards">Shards</a>.</div>')
    else:
        detail = f'<div id="first-divergence" class="first na">Undecided: {_e(result.reason or "")}</div>'

    return (f'<header class="verdict {"pass" if result.passed else "fail"}">'
            f'<div class="title"><span class="badge">{_e(verdict)}</span><h1>{_e(heading)}</h1></div>'
            f'<div class="traces"><div><b>A</b> (reference) <code>{_e(result.trace_a)}</code> '
            f'<span class="muted">{_e(result.model_a)}</span></div>'
            f'<div><b>B</b> <code>{_e(result.trace_b)}</code> <span class="muted">{_e(result.model_b)}</span></div>'
            f'</div><div class="chips">{"".join(chips)}</div>{detail}{_verdict_html(result)}</header>')


def _verdict_html(result: Alignment) -> str:
    """The baseline verdict, the warnings about noise, and every error source with its growth."""
    parts = []
    line = baseline_line(result)
    if line:
        parts.append(f'<p class="baseline">{_e(line)}</p>')
    parts += [f'<p class="warn">{_e(w)}</p>' for w in result.warnings if "rounding noise" in w]
    if result.sources:
        unit = "the noise floor" if result.baseline else "the tolerance"
        items = []
        for row in result.sources:
            note = origin_note(row)
            noise = f", {_num(row.noise_ratio)}&times; noise floor" if row.noise_ratio is not None else ""
            op = f"<code>{_e(row.op)}</code> #{_e(row.op_index)} inside " if row.op is not None else ""
            items.append(f'<li data-order="{row.order}">{op}<code>{_e(row.module_path_b)}</code> '
                         f'<code class="slot">{_e(row.tensor)}</code> ({_e(row.origin or "")}): growth '
                         f"<b>{_e(_num(row.growth))}</b>, max abs error {_e(_num(row.max_abs_err))}{noise}"
                         + (f'<div class="muted">{_e(note)}</div>' if note else "") + "</li>")
        parts.append(f'<div id="sources" class="sources"><div class="label">Error sources ({len(result.sources)}) '
                     f"· growth = error over what flowed in, in units of {_e(unit)}</div><ol>{''.join(items)}</ol>"
                     "</div>")
    return "".join(parts)


def _nav(result: Alignment) -> str:
    links = [("plot", "Plot"), ("tree", "Call tree"), ("table", "Table")]
    if result.unmatched_a or result.unmatched_b:
        links.append(("unmatched", "Unmatched"))
    if result.shard_findings:
        links.append(("shards", "Shards"))
    if result.argument_diffs:
        links.append(("arguments", "Non-tensor values"))
    if result.warnings or result.suggested_rename:
        links.append(("notes", "Notes"))
    return "<nav>" + "".join(f'<a href="#{key}">{label}</a>' for key, label in links) + "</nav>"


# --- the call tree of B ------------------------------------------------------------------------------


@dataclass
class _TreeNode:
    path: str
    name: str
    first_order: float = math.inf
    rows: int = 0
    worst: float = 0.0  # largest max_abs_err / atol over this node's own rows
    max_abs: float = 0.0
    diverged: int = 0
    bad_status: str | None = None
    introduced: bool = False
    source: bool = False
    first: bool = False
    only_b: bool = False
    module_type: str | None = None
    op: str | None = None  # an op node (op-level capture): shown under its module, in a collapsed group
    op_index: int | None = None
    calls: set[int] = field(default_factory=set)
    children: list[_TreeNode] = field(default_factory=list)
    subtree_worst: float = 0.0
    introduced_below: bool = False
    subtree_diverged: int = 0
    contains_first: bool = False


def _build_tree(result: Alignment, first: TensorComparison | None) -> list[_TreeNode]:
    nodes: dict[str, _TreeNode] = {}
    source_orders = {row.order for row in result.sources}

    def node(path: str) -> _TreeNode:
        if path not in nodes:
            nodes[path] = _TreeNode(path=path, name=path)
        return nodes[path]

    for row in result.rows:
        n = node(row.module_path_b if row.op is None else f"{row.module_path_b}.#{row.op_index} {row.op}")
        n.op, n.op_index = row.op, row.op_index
        n.rows += 1
        n.first_order = min(n.first_order, row.order)
        n.calls.add(row.call_index_b)
        n.module_type = n.module_type or row.module_type
        if not math.isnan(row.max_abs_err):
            n.max_abs = max(n.max_abs, row.max_abs_err)
            if row.diverged:
                n.worst = max(n.worst, row.max_abs_err / row.atol if row.atol > 0 else math.inf)
        if row.diverged:
            n.diverged += 1
            n.introduced = n.introduced or row.origin == "introduced"
        elif row.status not in _OK:
            n.bad_status = row.status
        if first is not None and row.order == first.order:
            n.first = True
        n.source = n.source or row.order in source_orders
    for unmatched in result.unmatched_b:
        if unmatched.tensor is None:
            node(unmatched.module_path).only_b = True
    # Parent: the longest proper dotted prefix that is a node itself. Sorted by components, a node comes right
    # after its ancestors, so a stack of open ancestors finds it in time linear in the path lengths (not quadratic
    # in their depth, as trying every prefix would be).
    roots: list[_TreeNode] = []
    ancestors: list[_TreeNode] = []
    for path in sorted(nodes, key=lambda p: p.split(".")):
        n = nodes[path]
        while ancestors and not path.startswith(ancestors[-1].path + "."):
            ancestors.pop()
        if not ancestors:
            roots.append(n)
        else:
            n.name = path[len(ancestors[-1].path) + 1:]
            ancestors[-1].children.append(n)
        ancestors.append(n)
    for root in roots:
        _finish(root)
    return sorted(roots, key=lambda n: n.first_order)


def _finish(n: _TreeNode) -> None:
    for child in n.children:
        _finish(child)
        if child.only_b and not child.rows:
            child.first_order = min((c.first_order for c in child.children), default=math.inf)
    n.children.sort(key=lambda c: c.first_order)
    n.subtree_worst = max([n.worst] + [c.subtree_worst for c in n.children])
    n.subtree_diverged = n.diverged + sum(c.subtree_diverged for c in n.children)
    n.contains_first = n.first or any(c.contains_first for c in n.children)
    n.introduced_below = any(c.introduced or c.introduced_below for c in n.children)
    if n.children and n.first_order == math.inf:
        n.first_order = min(c.first_order for c in n.children)


def _severity(n: _TreeNode) -> str:
    if n.diverged:
        return "sev3" if n.worst >= 1e3 else "sev2" if n.worst >= 10 else "sev1"
    if n.bad_status:
        return "na"
    if n.only_b and not n.rows:
        return "onlyb"
    return "exact" if n.max_abs == 0 else "close"


def _tree_html(n: _TreeNode, depth: int) -> str:
    badges = []
    if n.first:
        badges.append('<span class="tag first-tag">first divergence</span>')
    elif n.introduced and not n.introduced_below:
        badges.append('<span class="tag intro">introduced</span>')
    if n.source:
        badges.append('<span class="tag source">error source</span>')
    if n.only_b:
        badges.append('<span class="tag onlyb">only in B</span>')
    if n.bad_status:
        badges.append(f'<span class="tag na">{_e(n.bad_status)}</span>')
    calls = f' <span class="muted">×{len(n.calls)} calls</span>' if len(n.calls) > 1 else ""
    kind = f' <span class="type">{_e(n.module_type)}</span>' if n.module_type and n.op is None else ""
    err = f'<span class="err">{_e(_num(n.max_abs))}</span>' if n.rows else '<span class="err"></span>'
    # an op's title filters the table on its rows: "{module path} {op} #{index}"
    title = n.path if n.op is None else f"{n.path.rsplit('.#', 1)[0]} {n.op} #{n.op_index}"
    label = (f'<span class="dot {_severity(n)}"></span><span class="name" title="{_e(title)}">{_e(n.name)}'
             f"</span>{kind}{calls}{''.join(badges)}{err}")
    if not n.children:
        return f'<div class="leaf {_severity(n)}">{label}</div>'
    open_attr = " open" if depth < 1 or n.contains_first else ""
    below = "".join(_tree_html(c, depth + 1) for c in n.children if c.op is None)
    ops = [c for c in n.children if c.op is not None]
    if ops:  # the module's own ops, collapsed unless the first divergence is one of them
        group_open = " open" if any(c.contains_first for c in ops) else ""
        worst = max(ops, key=lambda c: (c.diverged > 0, c.worst))
        below = (f'<details{group_open} class="ops {_severity(worst)}"><summary><span class="muted">{len(ops)} ops'
                 f'</span></summary>{"".join(_tree_html(c, depth + 1) for c in ops)}</details>') + below
    summary_note = (f' <span class="muted sub">{n.subtree_diverged} diverged inside</span>'
                    if n.subtree_diverged and not n.contains_first and not n.diverged else "")
    return (f'<details{open_attr} class="{_severity(n)}"><summary>{label}{summary_note}'
            f"</summary>{below}</details>")


def _tree_section(result: Alignment, first: TensorComparison | None) -> str:
    roots = _build_tree(result, first)
    legend = ('<div class="legend"><span><span class="dot exact"></span>identical</span>'
              '<span><span class="dot close"></span>within tolerance</span>'
              '<span><span class="dot sev1"></span>out of tolerance (&lt;10× atol)</span>'
              '<span><span class="dot sev2"></span>10–1000× atol</span>'
              '<span><span class="dot sev3"></span>&ge;1000× atol</span>'
              '<span><span class="dot na"></span>not comparable</span>'
              '<span><span class="dot onlyb"></span>only in B</span></div>')
    body = "".join(_tree_html(root, 0) for root in roots) or '<p class="muted">No module calls.</p>'
    return (f'<section id="tree"><h2>Call tree of B</h2><p class="hint">Coloured by each module\'s own largest '
            f"error; the number is its largest max-abs error. Paths to the first divergence are open.</p>"
            f'{legend}<div class="tree">{body}</div></section>')


# --- table, lists ------------------------------------------------------------------------------------


def _table_section() -> str:
    return ('<section id="table"><h2>Compared tensors</h2>'
            '<div class="controls"><input id="filter" type="search" placeholder="filter: words must all appear '
            '(module, tensor, status, type, origin)" aria-label="filter rows">'
            '<label><input type="checkbox" id="only-bad"> out of tolerance only</label>'
            '<label><input type="checkbox" id="all-columns"> all columns</label></div>'
            '<div class="table-wrap"><table id="rows"><thead></thead><tbody></tbody></table></div>'
            '<div class="pager"><button id="prev" type="button">&larr; previous</button>'
            '<span id="page-info"></span><button id="next" type="button">next &rarr;</button></div></section>')


def _value(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 3] + "..."


def _list_table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows[:_LIST_LIMIT])
    more = f'<p class="muted">{len(rows) - _LIST_LIMIT} more not shown.</p>' if len(rows) > _LIST_LIMIT else ""
    return f'<div class="table-wrap"><table class="list"><thead><tr>{head}</tr></thead><tbody>{body}</tbody>' \
           f"</table></div>{more}"


_STRIP_CELLS = 256


def _position_strip(result: Alignment) -> str:
    """One cell per token position of the first diverging tensor, coloured by its error over the tolerance, the
    first position out of tolerance marked (positions share a cell, by their worst, past ``_STRIP_CELLS``)."""
    strip = result.position_strip
    if strip is None or not strip.ratios:
        return ""
    n = len(strip.ratios)
    per_cell = -(-n // _STRIP_CELLS)
    first = strip.first
    cells = []
    for i in range(0, n, per_cell):
        ratio = max(strip.ratios[i:i + per_cell])
        low, high = strip.start + i, strip.start + min(i + per_cell, n) - 1
        where = f"position {low}" if low == high else f"positions {low}-{high}"
        level = ("exact" if ratio == 0 else "close" if ratio <= 1 else "sev1" if ratio <= 10
                 else "sev2" if ratio <= 100 else "sev3")
        marked = first is not None and low <= first <= high
        cells.append(f'<span class="cell {level}{" first-bad" if marked else ""}" '
                     f'title="{_e(where)}: {_e(_num(ratio))} &times; tolerance"></span>')
    end = strip.start + n - 1
    note = f"first out of tolerance: position {first}" if first is not None else "every position within tolerance"
    return (f'<div class="strip" id="position-strip"><span class="strip-label">error per position '
            f"{strip.start}&ndash;{end} ({_e(note)})</span>"
            f'<div class="cells">{"".join(cells)}</div></div>')


def _steps_section(result: Alignment) -> str:
    """Generation traces: the decode steps compared, the first diverging one, and each logits verdict."""
    if result.steps is None:
        return ""
    rows = [[v.step, v.module_path_b, v.tensor, _num(max(v.kl, default=0.0)),
             ", ".join(f"top-{k} {a:.2f}" for k, a in v.topk_agreement.items()), len(v.flips),
             "; ".join(f"position {f.position}: {f.token_a} -> {f.token_b} (margin {f.margin:.3g}"
                       + {True: ", benign)", False: ", beyond noise)", None: ")"}[f.benign] for f in v.flips[:3])]
            for v in result.logits]
    return ('<section id="steps"><h2>Decode steps</h2>'
            + "".join(f"<p>{_e(line.strip())}</p>" for line in step_lines(result)[:1] + token_lines(result))
            + _list_table(["step", "module (B)", "tensor", "KL max", "top-k agreement", "argmax flips",
                           "first flips"], rows) + "</section>")


def _lists_section(result: Alignment) -> str:
    out = []
    if result.unmatched_a or result.unmatched_b:
        parts = ['<section id="unmatched"><h2>Unmatched</h2><p class="hint">Calls (or tensors of matched calls) '
                 "present in one trace only. A rename map (<code>--map</code>) lines up modules whose names "
                 "differ.</p>"]
        for label, items in (("Only in A", result.unmatched_a), ("Only in B", result.unmatched_b)):
            if items:
                rows = [[u.module_path, u.call_index, u.tensor or "(whole call)"] for u in items]
                parts.append(f"<details open><summary>{_e(label)} ({len(items)})</summary>"
                             f"{_list_table(['module', 'call', 'tensor'], rows)}</details>")
        out.append("".join(parts) + "</section>")
    if result.shard_findings:
        rows = [[f.side, f.kind, f.module_path, f.call_index, f.tensor, "" if f.rank is None else f.rank, f.detail]
                for f in result.shard_findings]
        out.append('<section id="shards"><h2>Shards</h2><p class="hint">What the ranks of a sharded trace said on '
                   "their own: replicas they disagree on (these fail the verdict), tensors left unplaced (not "
                   "compared).</p>" + _list_table(["trace", "kind", "module", "call", "tensor", "rank", "detail"],
                                                  rows) + "</section>")
    if result.argument_diffs:
        rows = [[d.module_path_b, d.call_index, d.slot, _value(d.value_a), _value(d.value_b), d.detail]
                for d in result.argument_diffs]
        out.append('<section id="arguments"><h2>Non-tensor values that differ</h2>'
                   + _list_table(["module (B)", "call", "slot", "A", "B", "detail"], rows) + "</section>")
    if result.warnings or result.suggested_rename:
        notes = "".join(f'<li class="warn">{_e(w)}</li>' for w in result.warnings)
        rename = ""
        if result.suggested_rename:
            lines = ",\n".join("  " + json.dumps(list(rule)) for rule in result.suggested_rename)
            rules = '{"rename": [\n' + lines + "\n]}"
            rename = ("<p>Suggested rename rules (A &rarr; B); save them with <code>--suggest-map FILE</code> and "
                      f"check them:</p><pre>{_e(rules)}</pre>")
        out.append(f'<section id="notes"><h2>Notes</h2><ul>{notes}</ul>{rename}</section>')
    return "".join(out)


# --- embedded data -----------------------------------------------------------------------------------


def _compact(value: Any, strings: dict[str, int]) -> Any:
    if value is None or isinstance(value, bool) or isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        rounded = float(f"{value:.5g}")
        return int(rounded) if rounded.is_integer() and abs(rounded) < 1e15 else rounded
    if isinstance(value, (tuple, list)):
        value = "x".join(str(v) for v in value) or "scalar"
    text = str(value)
    if text not in strings:
        strings[text] = len(strings)
    return [strings[text]]  # a one-element list marks an interned string


# The symmetric aliases repeat call_index and tensor: the page would show each of those columns twice.
_PAGE_COLUMNS = [column for column in TABLE_COLUMNS if column not in ("call_index_a", "tensor_b")]


def _data_json(result: Alignment) -> str:
    strings: dict[str, int] = {}
    rows = [[_compact(getattr(row, column), strings) for column in _PAGE_COLUMNS] for row in result.rows]
    first = result.first_divergence
    data = {"columns": _PAGE_COLUMNS, "strings": list(strings), "rows": rows,
            "first": first.order if first is not None else None,
            "sources": [row.order for row in result.sources], "noise_factor": result.noise_factor}
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    for raw, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text
