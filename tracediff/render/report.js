// tracediff HTML report: the error plot and the sortable, filterable, paginated table.
// Data comes from the JSON block #tracediff-data; text is only ever inserted with textContent.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var PAGE = 100;
  var data = JSON.parse(document.getElementById("tracediff-data").textContent);
  var columns = data.columns, strings = data.strings;

  function decode(v) {
    if (Array.isArray(v)) return strings[v[0]];
    if (v === "nan") return NaN;
    if (v === "inf") return Infinity;
    if (v === "-inf") return -Infinity;
    return v;
  }
  var rows = data.rows.map(function (r) {
    var o = {};
    for (var i = 0; i < columns.length; i++) o[columns[i]] = decode(r[i]);
    o._text = [o.module_path_a, o.module_path_b, o.tensor, o.tensor_a, o.status, o.module_type, o.origin,
      o.reason, o.dtype_b, o.op ? o.module_path_b + " " + o.op + " #" + o.op_index : ""].join(" ").toLowerCase();
    return o;
  });
  var byOrder = {};
  rows.forEach(function (r) { byOrder[r.order] = r; });

  // ---------------------------------------------------------------- formatting
  function fmt(v, col) {
    if (v === null || v === undefined) return "";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v === "number") {
      if (isNaN(v)) return "n/a";
      if (v === Infinity) return "inf";
      if (v === -Infinity) return "-inf";
      if (col === "cosine") return v.toFixed(6);
      if (Number.isInteger(v) && Math.abs(v) < 1e6) return String(v);
      if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e4)) return v.toExponential(2);
      return String(Number(v.toPrecision(3)));
    }
    var s = String(v);
    return s.indexOf("torch.") === 0 ? s.slice(6) : s;
  }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    if (attrs) Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // ---------------------------------------------------------------- table
  var SHOWN = ["order", "module_path_b", "tensor", "shape_b", "dtype_b", "max_abs_err", "max_rel_err", "cosine",
    "mismatch_fraction", "status", "origin"];
  var LABELS = {order: "#", module_path_b: "module (B)", module_path_a: "module (A)", tensor: "tensor",
    shape_b: "shape", dtype_b: "dtype", max_abs_err: "max abs", max_rel_err: "max rel", cosine: "cosine",
    mismatch_fraction: "mismatch", status: "status", origin: "origin"};
  var NUMERIC = {};
  columns.forEach(function (c) {
    NUMERIC[c] = rows.some(function (r) { return typeof r[c] === "number"; });
  });
  var state = {sort: "order", dir: 1, words: [], onlyBad: false, all: false, page: 0, open: {}, mark: null};
  var table = document.getElementById("rows");
  var thead = table.querySelector("thead"), tbody = table.querySelector("tbody");
  var filterBox = document.getElementById("filter");

  function visibleColumns() { return state.all ? columns : SHOWN; }

  function selected() {
    var out = rows.filter(function (r) {
      if (state.onlyBad && r.within_tolerance !== false && r.status !== "unreadable") return false;
      for (var i = 0; i < state.words.length; i++) if (r._text.indexOf(state.words[i]) < 0) return false;
      return true;
    });
    var col = state.sort, dir = state.dir;
    out.sort(function (a, b) {
      var x = a[col], y = b[col];
      var xm = x === null || x === undefined || (typeof x === "number" && isNaN(x));
      var ym = y === null || y === undefined || (typeof y === "number" && isNaN(y));
      if (xm || ym) return xm && ym ? a.order - b.order : (xm ? 1 : -1);  // missing values last
      var c = (typeof x === "number" && typeof y === "number") ? (x < y ? -1 : x > y ? 1 : 0)
        : String(x).localeCompare(String(y));
      return c !== 0 ? c * dir : a.order - b.order;
    });
    return out;
  }

  function renderHead() {
    thead.textContent = "";
    var tr = el("tr");
    visibleColumns().forEach(function (c) {
      var th = el("th", {"data-col": c, scope: "col", tabindex: "0", title: "sort by " + c},
        LABELS[c] || c.replace(/_/g, " "));
      if (NUMERIC[c]) th.className = "num";
      if (state.sort === c) {
        th.setAttribute("aria-sort", state.dir > 0 ? "ascending" : "descending");
        th.className += " sorted";
      }
      tr.appendChild(th);
    });
    thead.appendChild(tr);
  }

  function rowClass(r) {
    var cls = "st-" + r.status;
    if (r.order === data.first) cls += " first-row";
    if (r.order === state.mark) cls += " marked";
    return cls;
  }

  function renderBody() {
    var list = selected();
    var pages = Math.max(1, Math.ceil(list.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    var start = state.page * PAGE, slice = list.slice(start, start + PAGE);
    var cols = visibleColumns();
    tbody.textContent = "";
    slice.forEach(function (r) {
      var tr = el("tr", {"data-order": String(r.order), "class": rowClass(r), title: r.reason || ""});
      cols.forEach(function (c) {
        var td = el("td", NUMERIC[c] ? {"class": "num"} : null, fmt(r[c], c));
        tr.appendChild(td);
      });
      tbody.appendChild(tr);
      if (state.open[r.order]) tbody.appendChild(detailRow(r, cols.length));
    });
    var info = document.getElementById("page-info");
    info.textContent = list.length ? "rows " + (start + 1) + "\u2013" + (start + slice.length) + " of " +
      list.length + (list.length < rows.length ? " (filtered from " + rows.length + ")" : "") : "no matching rows";
    document.getElementById("prev").disabled = state.page === 0;
    document.getElementById("next").disabled = state.page >= pages - 1;
    table.setAttribute("data-rows", String(list.length));
  }

  function detailRow(r, span) {
    var tr = el("tr", {"class": "detail"}), td = el("td", {colspan: String(span)});
    var dl = el("dl");
    columns.forEach(function (c) {
      dl.appendChild(el("dt", null, c));
      dl.appendChild(el("dd", null, fmt(r[c], c)));
    });
    td.appendChild(dl);
    tr.appendChild(td);
    return tr;
  }

  function render() { renderHead(); renderBody(); }

  thead.addEventListener("click", function (ev) {
    var th = ev.target.closest("th");
    if (!th) return;
    var col = th.getAttribute("data-col");
    if (state.sort === col) state.dir = -state.dir;
    else { state.sort = col; state.dir = NUMERIC[col] && col !== "order" ? -1 : 1; }
    state.page = 0;
    render();
  });
  thead.addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && ev.target.closest("th")) ev.target.closest("th").click();
  });
  tbody.addEventListener("click", function (ev) {
    var tr = ev.target.closest("tr[data-order]");
    if (!tr) return;
    var order = Number(tr.getAttribute("data-order"));
    state.open[order] = !state.open[order];
    renderBody();
  });
  filterBox.addEventListener("input", function () {
    state.words = filterBox.value.toLowerCase().split(/\s+/).filter(Boolean);
    state.page = 0;
    renderBody();
  });
  document.getElementById("only-bad").addEventListener("change", function (ev) {
    state.onlyBad = ev.target.checked; state.page = 0; renderBody();
  });
  document.getElementById("all-columns").addEventListener("change", function (ev) {
    state.all = ev.target.checked; render();
  });
  document.getElementById("prev").addEventListener("click", function () { state.page -= 1; renderBody(); });
  document.getElementById("next").addEventListener("click", function () { state.page += 1; renderBody(); });

  function showInTable(order) {
    filterBox.value = ""; state.words = []; state.onlyBad = false;
    document.getElementById("only-bad").checked = false;
    state.sort = "order"; state.dir = 1; state.mark = order;
    state.page = Math.floor(rows.findIndex(function (r) { return r.order === order; }) / PAGE);
    if (state.page < 0) state.page = 0;
    render();
    var tr = tbody.querySelector('tr[data-order="' + order + '"]');
    if (tr) tr.scrollIntoView({block: "center"});
  }
  var firstLink = document.querySelector('[data-order-link="first"]');
  if (firstLink && data.first !== null) {
    firstLink.addEventListener("click", function (ev) { ev.preventDefault(); showInTable(data.first); });
  }
  document.querySelectorAll(".tree .name").forEach(function (name) {
    name.addEventListener("click", function (ev) {
      ev.preventDefault();
      filterBox.value = name.getAttribute("title");
      state.words = [filterBox.value.toLowerCase()]; state.page = 0;
      renderBody();
      document.getElementById("table").scrollIntoView();
    });
  });

  // ---------------------------------------------------------------- plot
  function band(r) {
    return data.noise_factor && typeof r.noise_floor === "number" ? r.noise_floor * data.noise_factor : null;
  }

  function drawPlot() {
    var area = document.getElementById("plot-area");
    var W = 1000, H = 320, L = 64, R = 16, T = 16, B = 44;
    var n = rows.length;
    var ordered = rows.slice().sort(function (a, b) { return a.order - b.order; });
    var positive = [];
    ordered.forEach(function (r) {
      [r.max_abs_err, r.max_rel_err, r.atol, band(r)].forEach(function (v) {
        if (typeof v === "number" && isFinite(v) && v > 0) positive.push(v);
      });
    });
    var lo = positive.length ? Math.floor(Math.log10(Math.min.apply(null, positive))) : -8;
    var hi = positive.length ? Math.ceil(Math.log10(Math.max.apply(null, positive))) : 0;
    if (hi <= lo) hi = lo + 1;
    var zeroBand = lo - 1;  // exact zeros sit one decade below the lowest error, labelled "0"
    var s = svg("svg", {viewBox: "0 0 " + W + " " + H, "class": "plot-svg", role: "img",
      "aria-label": "error of each compared tensor along execution order"});
    function X(i) { return L + (n <= 1 ? (W - L - R) / 2 : i * (W - L - R) / (n - 1)); }
    function Y(v) {
      var e = v === 0 ? zeroBand : v === Infinity ? hi : Math.log10(v);
      return T + (hi - e) * (H - T - B) / (hi - zeroBand);
    }
    var grid = svg("g", {"class": "grid"});
    var step = hi - lo > 12 ? 2 : 1;
    for (var e = lo; e <= hi; e += step) {
      grid.appendChild(svg("line", {x1: L, x2: W - R, y1: Y(Math.pow(10, e)), y2: Y(Math.pow(10, e))}));
      grid.appendChild(svg("text", {x: L - 6, y: Y(Math.pow(10, e)) + 4, "text-anchor": "end"}, "1e" + e));
    }
    grid.appendChild(svg("line", {x1: L, x2: W - R, y1: Y(0), y2: Y(0), "class": "zero"}));
    grid.appendChild(svg("text", {x: L - 6, y: Y(0) + 4, "text-anchor": "end"}, "0"));
    var ticks = Math.min(n, 8);
    for (var t = 0; t < ticks; t++) {
      var i = n <= 1 ? 0 : Math.round(t * (n - 1) / Math.max(1, ticks - 1));
      grid.appendChild(svg("text", {x: X(i), y: H - B + 18, "text-anchor": "middle"}, String(i)));
    }
    grid.appendChild(svg("text", {x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle", "class": "axis-label"},
      "compared tensor, in B's execution order"));
    s.appendChild(grid);

    function series(key, cls) {
      var d = "", pen = false;
      ordered.forEach(function (r, i) {
        var v = r[key];
        if (typeof v !== "number" || isNaN(v) || v < 0) { pen = false; return; }
        d += (pen ? "L" : "M") + X(i).toFixed(1) + " " + Y(v).toFixed(1);
        pen = true;
      });
      if (d) s.appendChild(svg("path", {d: d, "class": cls}));
    }
    if (data.noise_factor) {  // the noise band: everything below K x the baseline's floor is rounding noise
      var top = "", bottom = [];
      ordered.forEach(function (r, i) {
        var v = band(r);
        if (typeof v !== "number" || !(v > 0) || !isFinite(v)) return;
        top += (top ? "L" : "M") + X(i).toFixed(1) + " " + Y(v).toFixed(1);
        bottom.unshift("L" + X(i).toFixed(1) + " " + Y(0).toFixed(1));
      });
      if (top) s.appendChild(svg("path", {d: top + bottom.join("") + "Z", "class": "noise-band"}));
    }
    series("atol", "line tol");
    series("max_rel_err", "line rel");
    series("max_abs_err", "line abs");
    var marks = svg("g", {"class": "marks"});
    var dense = n > 600;
    ordered.forEach(function (r, i) {
      var v = r.max_abs_err;
      if (typeof v !== "number" || isNaN(v)) {
        marks.appendChild(svg("text", {x: X(i), y: T + 10, "text-anchor": "middle", "class": "na-mark"}, "\u00d7"));
        return;
      }
      if (r.within_tolerance === false) {
        marks.appendChild(svg("circle", {cx: X(i), cy: Y(v), r: dense ? 1.8 : 3, "class": "pt bad"}));
      } else if (!dense) {
        marks.appendChild(svg("circle", {cx: X(i), cy: Y(v), r: 2.2, "class": "pt ok"}));
      }
    });
    s.appendChild(marks);
    (data.sources || []).forEach(function (order) {
      var si = ordered.findIndex(function (r) { return r.order === order; });
      if (si < 0) return;
      var sx = X(si);
      s.appendChild(svg("path", {d: "M" + (sx - 5) + " " + (H - B) + "L" + (sx + 5) + " " + (H - B) + "L" + sx + " " +
        (H - B - 9) + "Z", "class": "source-mark"}));
    });
    if (data.first !== null) {
      var fi = ordered.findIndex(function (r) { return r.order === data.first; });
      var fx = X(fi), fr = ordered[fi];
      s.appendChild(svg("line", {x1: fx, x2: fx, y1: T, y2: H - B, "class": "first-line"}));
      var label = "first divergence: " + fr.module_path_b + " " + fr.tensor;
      var right = fx > (L + W - R) / 2;
      s.appendChild(svg("text", {x: right ? fx - 6 : fx + 6, y: T + 12, "text-anchor": right ? "end" : "start",
        "class": "first-label"}, label));
    }
    var guide = svg("line", {y1: T, y2: H - B, "class": "guide", visibility: "hidden"});
    s.appendChild(guide);
    var hit = svg("rect", {x: L, y: T, width: W - L - R, height: H - T - B, "class": "hit"});
    s.appendChild(hit);
    area.appendChild(s);
    var tip = el("div", {"class": "tip", hidden: ""});
    area.appendChild(tip);
    function nearest(ev) {
      var box = s.getBoundingClientRect();
      var x = (ev.clientX - box.left) * W / box.width;
      var i = n <= 1 ? 0 : Math.round((x - L) * (n - 1) / (W - L - R));
      return Math.max(0, Math.min(n - 1, i));
    }
    hit.addEventListener("mousemove", function (ev) {
      if (!n) return;
      var i = nearest(ev), r = ordered[i];
      guide.setAttribute("x1", X(i)); guide.setAttribute("x2", X(i)); guide.setAttribute("visibility", "visible");
      tip.textContent = "";
      tip.appendChild(el("b", null, "#" + r.order + " " + r.module_path_b));
      tip.appendChild(el("div", null, r.tensor + " \u00b7 " + r.status + (r.origin ? " (" + r.origin + ")" : "")));
      tip.appendChild(el("div", null, "max abs " + fmt(r.max_abs_err) + " \u00b7 max rel " + fmt(r.max_rel_err) +
        " \u00b7 atol " + fmt(r.atol)));
      if (r.noise_ratio !== null && r.noise_ratio !== undefined || r.growth !== null && r.growth !== undefined) {
        tip.appendChild(el("div", null, "noise ratio " + fmt(r.noise_ratio) + " \u00b7 growth " + fmt(r.growth)));
      }
      var box = area.getBoundingClientRect();
      tip.style.left = Math.min(ev.clientX - box.left + 12, box.width - 320) + "px";
      tip.style.top = (ev.clientY - box.top + 12) + "px";
      tip.hidden = false;
    });
    hit.addEventListener("mouseleave", function () { tip.hidden = true; guide.setAttribute("visibility", "hidden"); });
    hit.addEventListener("click", function (ev) { if (n) showInTable(ordered[nearest(ev)].order); });
  }

  if (rows.length) drawPlot();
  else document.getElementById("plot-area").appendChild(el("p", {"class": "muted"}, "No tensors were compared."));
  render();
  document.body.setAttribute("data-ready", "1");
})();
