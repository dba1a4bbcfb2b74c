"""The page's stylesheet and its one script, inline so that the report opens offline as a single file.

The script builds the sample table from the JSON data block with ``textContent`` and DOM attributes only, never
``innerHTML``: model output stays text. It filters by a text search (task id, prompt, completion, parsed answer,
reference, reasons), verdict, step range and stage, sorts, and shows :data:`PAGE_ROWS` rows a page.
"""

from __future__ import annotations

__all__ = ["PAGE_ROWS", "SCRIPT", "STYLE"]

PAGE_ROWS = 100
"""Sample rows shown per page of the table."""

STYLE = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --bg2: #f5f7fa; --ok: #1b7f3b; --bad: #b3261e;
        --warn: #8a5a00; --info: #2a5db0; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); margin: 0 auto;
       padding: 16px 24px 48px; max-width: 1600px; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); }
h3 { font-size: 14px; margin: 16px 0 6px; }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0; }
.facts dt { color: var(--muted); } .facts dd { margin: 0; word-break: break-all; }
.notes { background: #fff8e6; border: 1px solid #f0d9a0; padding: 8px 12px; border-radius: 4px; }
.notes li { margin: 2px 0; }
table.grid { border-collapse: collapse; margin: 6px 0 14px; }
table.grid caption { text-align: left; color: var(--muted); padding: 2px 0; white-space: nowrap; }
table.grid th, table.grid td { border: 1px solid var(--line); padding: 3px 8px; text-align: left; vertical-align: top; }
table.grid th { background: var(--bg2); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; } td.num { white-space: nowrap; }
.up { color: var(--ok); } .down { color: var(--bad); }
.chart svg { max-width: 100%; height: auto; }
pre { background: var(--bg2); padding: 8px 10px; overflow: auto; max-height: 36em; font-size: 12px; }
details > summary { cursor: pointer; color: var(--info); margin: 6px 0; }
.controls { display: flex; flex-wrap: wrap; gap: 8px 14px; align-items: center; margin: 8px 0;
            position: sticky; top: 0; background: #fff; padding: 6px 0; z-index: 1; }
.controls input[type=search] { width: 24em; padding: 3px 6px; } .controls input[type=number] { width: 6em; }
#samples-count { color: var(--muted); }
table.samples { border-collapse: collapse; width: 100%; table-layout: fixed; font-size: 13px; }
table.samples th, table.samples td { border-bottom: 1px solid var(--line); padding: 4px 6px; vertical-align: top;
                                     text-align: left; overflow-wrap: anywhere; }
table.samples th { background: var(--bg2); position: sticky; top: 44px; }
table.samples .text { white-space: pre-wrap; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px;
                      max-height: 14em; overflow: auto; display: block; }
table.samples col.c-step { width: 4.5em; } table.samples col.c-stage { width: 6em; }
table.samples col.c-prompt { width: 20%; } table.samples col.c-text { width: 32%; }
table.samples col.c-verdict { width: 17em; } table.samples col.c-num { width: 7.5em; }
.task { color: var(--muted); font-size: 11px; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px; font-weight: 600; color: #fff; }
.v-correct { background: var(--ok); } .v-incorrect { background: var(--bad); } .v-scored { background: var(--info); }
.v-ungradeable { background: var(--warn); } .v-unjudged { background: #777; }
.why { color: var(--muted); font-size: 11px; }
.pager { margin: 8px 0; display: flex; gap: 10px; align-items: center; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  function $(id) { return document.getElementById(id); }
  var data = JSON.parse($("report-data").textContent);
  var rows = data.rows, groups = data.groups, comps = data.components, parts = data.parts, PAGE = data.page;
  var box = $("filter-text"), verdict = $("filter-verdict"), lo = $("filter-step-min"), hi = $("filter-step-max");
  var stage = $("filter-stage"), order = $("filter-sort"), body = $("samples-body"), count = $("samples-count");
  var prev = $("page-prev"), next = $("page-next"), where = $("page-where");
  var shown = [], page = 0;
  rows.forEach(function (r, i) {
    var g = groups[r.g];
    r.i = i;
    r.hay = [g.task, g.prompt, g.answer, r.text, r.parsed, r.reason].concat(r.why).join("\n").toLowerCase();
  });
  function fmt(x) {
    if (x === null || x === undefined) return "";
    return Math.abs(x) >= 1000 ? x.toFixed(0) : x.toFixed(3);
  }
  function bound(input) {
    var v = input.value.trim();
    if (v === "") return null;
    v = Number(v);
    return isNaN(v) ? null : v;
  }
  function add(parent, tag, text, cls, title) {
    var e = document.createElement(tag);
    if (text) e.textContent = text;
    if (cls) e.className = cls;
    if (title) e.title = title;
    parent.appendChild(e);
    return e;
  }
  function byNumber(key, sign) {
    return function (x, y) {
      var a = x[key], b = y[key];
      if (a === null && b === null) return x.i - y.i;
      if (a === null) return 1;
      if (b === null) return -1;
      return sign * (a - b) || x.i - y.i;
    };
  }
  var sorters = {
    "step-asc": function (x, y) { return x.i - y.i; },
    "step-desc": function (x, y) { return y.i - x.i; },
    "adv-desc": byNumber("adv", -1), "adv-asc": byNumber("adv", 1),
    "reward-desc": byNumber("reward", -1), "reward-asc": byNumber("reward", 1)
  };
  function keep(r, q, v, a, b, s) {
    var g = groups[r.g];
    if (v && r.verdict !== v) return false;
    if (s !== "" && String(g.part) !== s) return false;
    if (a !== null && (g.step === null || g.step < a)) return false;
    if (b !== null && (g.step === null || g.step > b)) return false;
    return !q || r.hay.indexOf(q) !== -1;
  }
  function rowElement(r) {
    var g = groups[r.g], tr = document.createElement("tr"), td;
    tr.className = "sample";
    add(tr, "td", g.step === null ? "" : String(g.step), "num");
    if (parts.length > 1) add(tr, "td", parts[g.part] || "");
    td = add(tr, "td");
    add(td, "div", g.task, "task");
    add(td, "div", g.prompt, "text");
    add(add(tr, "td"), "div", r.text, "text");
    td = add(tr, "td");
    add(td, "span", r.verdict, "badge v-" + r.verdict, r.reason);
    var answer = [];
    if (r.parsed) answer.push("parsed " + r.parsed);
    if (g.answer) answer.push("reference " + g.answer);
    if (answer.length) add(td, "span", " " + answer.join(" · "), "why");
    if (r.reason) add(td, "div", r.reason, "why");
    add(tr, "td", fmt(r.reward), "num");
    add(tr, "td", fmt(r.adv), "num");
    comps.forEach(function (name, k) { add(tr, "td", fmt(r.comp[k]), "num", r.why[k]); });
    if (data.format) add(tr, "td", r.fmt === null ? "" : (r.fmt ? "ok" : "bad"));
    if (data.decisions) {
      add(add(tr, "td"), "div", r.dec.map(function (d) {
        return "@" + d[0] + " " + JSON.stringify(d[1]) + "  H=" + fmt(d[2]);
      }).join("\n"), "text");
    }
    return tr;
  }
  function draw() {
    var pages = Math.max(1, Math.ceil(shown.length / PAGE));
    page = Math.max(0, Math.min(page, pages - 1));
    var start = page * PAGE, end = Math.min(shown.length, start + PAGE), frag = document.createDocumentFragment();
    for (var k = start; k < end; k++) frag.appendChild(rowElement(shown[k]));
    while (body.firstChild) body.removeChild(body.firstChild);
    body.appendChild(frag);
    count.textContent = shown.length + " of " + rows.length + " trajectories match";
    where.textContent = shown.length ? "rows " + (start + 1) + "–" + end + ", page " + (page + 1) + " of " + pages : "";
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  }
  function update() {
    var q = box.value.trim().toLowerCase(), v = verdict.value, a = bound(lo), b = bound(hi);
    var s = stage ? stage.value : "";
    shown = rows.filter(function (r) { return keep(r, q, v, a, b, s); });
    shown.sort(sorters[order.value] || sorters["step-asc"]);
    page = 0;
    draw();
  }
  [box, lo, hi].forEach(function (e) { e.addEventListener("input", update); });
  [verdict, order, stage].forEach(function (e) { if (e) e.addEventListener("change", update); });
  prev.addEventListener("click", function () { page -= 1; draw(); });
  next.addEventListener("click", function () { page += 1; draw(); });
  update();
  document.body.setAttribute("data-ready", "1");
})();
"""
