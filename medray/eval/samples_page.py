"""samples.html: one self-contained page (inline CSS and JS, the data as JSON in a
<script type="application/json"> tag) that shows every item of a report's runs side by side.

Offline by construction: no external URL, and a Content-Security-Policy that forbids every
request (connect-src, img-src, ... 'none'), so nothing in it is ever sent anywhere. Rows are
rendered a page at a time (PAGE_SIZE), so 20,000 items stay quick to filter and search; all
text reaches the page through textContent, never as HTML.
"""

from __future__ import annotations

import json
from typing import Any

PAGE_SIZE = 100

TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none';
 style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; base-uri 'none';
 form-action 'none'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #d5d9e0;
 padding:8px 12px;z-index:2}
h1{font-size:16px;margin:0 0 6px}
.controls{display:flex;flex-wrap:wrap;gap:6px 12px;align-items:center}
.controls label{font-size:12px;color:#4a5263}
#filters{display:contents}
select,input,button{font:inherit;font-size:13px}
#search{min-width:260px}
#count{font-weight:600;margin-left:auto}
.pager{display:flex;gap:6px;align-items:center;padding:6px 12px}
table{border-collapse:collapse;width:100%;table-layout:fixed;background:#fff}
th,td{border-bottom:1px solid #e3e6eb;padding:6px 8px;vertical-align:top;text-align:left;
 overflow-wrap:anywhere;white-space:pre-wrap}
th{background:#eef0f4;font-size:12px;white-space:normal}
.meta{font-size:11px;color:#4a5263}
.chip{display:inline-block;background:#eef0f4;border-radius:3px;padding:0 4px;margin:1px 2px 1px 0}
ol.opts{margin:4px 0 0;padding-left:0;list-style:none}
details{margin-top:4px}
details .ctx{max-height:320px;overflow:auto;background:#fafbfc;border:1px solid #e3e6eb;
 padding:6px;font-size:12px}
.score{display:inline-block;border-radius:3px;padding:0 5px;margin-top:4px;font-size:12px;
 font-weight:600}
.right{background:#d6f5dc;color:#135c23}.partial{background:#fff1c7;color:#6b5200}
.wrong{background:#fbdada;color:#7c1515}.none{color:#8a91a0}
</style>
</head>
<body>
<header>
<h1>__TITLE__</h1>
<div class="controls" id="controls">
<input id="search" type="search" placeholder="search id, question, reference, answers"
 aria-label="search">
<span id="filters"></span>
<label>run <select id="run"></select></label>
<label>outcome <select id="outcome">
<option value="">any</option><option value="right">right</option>
<option value="partial">partial</option><option value="wrong">wrong</option>
<option value="all-wrong">wrong in every run</option></select></label>
<label>order <select id="sort"><option value="">as in the data</option>
<option value="asc">score, lowest first</option><option value="desc">score, highest first</option>
</select></label>
<span id="count" data-shown="0"></span>
</div>
</header>
<noscript>This page needs JavaScript to show the items.</noscript>
<div id="unread" class="meta"></div>
<table><thead><tr id="head"></tr></thead><tbody id="rows"></tbody></table>
<div class="pager"><button id="prev" type="button">previous</button>
<span id="page"></span><button id="next" type="button">next</button></div>
<script type="application/json" id="medray-data">__DATA__</script>
<script>
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("medray-data").textContent);
  const PAGE = __PAGE_SIZE__;
  const items = D.items, runs = D.runs;
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  };
  const state = {q: "", f: {}, run: 0, outcome: "", sort: "", page: 0};
  let shown = [];
  let hay = null;
  function haystack() {
    if (!hay) hay = items.map((it) => [it.id, it.q, it.ref, (it.opts || []).join(" "),
      it.r.map((a) => (a ? a[0] : "")).join(" ")].join("\n").toLowerCase());
    return hay;
  }
  // the filter selects: only the fields the items have
  for (const f of D.fields) {
    const counts = new Map();
    for (const it of items) {
      const v = it.f[f];
      if (v !== undefined) counts.set(v, (counts.get(v) || 0) + 1);
    }
    const label = el("label", null, f.replace("_", " ") + " ");
    const sel = el("select"); sel.dataset.field = f; sel.id = "filter-" + f;
    sel.appendChild(el("option", null, "all")).value = "";
    for (const v of [...counts.keys()].sort()) {
      sel.appendChild(el("option", null, v + " (" + counts.get(v) + ")")).value = v;
    }
    sel.addEventListener("change", () => { state.f[f] = sel.value; update(); });
    label.appendChild(sel); $("filters").appendChild(label);
  }
  for (const u of D.unread || []) $("unread").appendChild(el("div", null, "not shown: " +
    u.run + " (" + u.why + ")"));
  runs.forEach((r, j) => { $("run").appendChild(el("option", null, r.name)).value = String(j); });
  if (runs.length < 2) $("run").parentElement.style.display = "none";
  if (!runs.some((r) => r.kind === "generative")) {
    $("outcome").querySelector("[value=partial]").remove();
  }
  const head = $("head");
  head.appendChild(el("th", null, "item")).style.width = "12%";
  head.appendChild(el("th", null, "question")).style.width = "34%";
  head.appendChild(el("th", null, "reference")).style.width = "12%";
  for (const r of runs) {
    const th = el("th", null, r.name + (r.model ? " (" + r.model + ")" : ""));
    th.appendChild(el("div", "meta", r.metric));
    head.appendChild(th);
  }
  function keep(it) {
    for (const f in state.f) if (state.f[f] && it.f[f] !== state.f[f]) return false;
    const o = state.outcome;
    if (o === "all-wrong") return it.r.every((a) => !a || a[2] === "wrong") && it.r.some((a) => a);
    if (o) { const a = it.r[state.run]; if (!a || a[2] !== o) return false; }
    return true;
  }
  function update() {
    const q = state.q.trim().toLowerCase();
    const h = q ? haystack() : null;
    shown = [];
    for (let i = 0; i < items.length; i++) {
      if ((!h || h[i].includes(q)) && keep(items[i])) shown.push(i);
    }
    if (state.sort) {
      const j = state.run, sign = state.sort === "asc" ? 1 : -1;
      const score = (i) => { const a = items[i].r[j]; return a ? a[1] : null; };
      shown.sort((x, y) => {
        const a = score(x), b = score(y);
        if (a === null || b === null) return (a === null) - (b === null);
        return sign * (a - b) || x - y;
      });
    }
    state.page = 0; render();
  }
  function cell(a) {
    const td = el("td");
    if (!a) { td.appendChild(el("span", "none", "not in this run")); return td; }
    td.appendChild(el("div", "ans", a[0]));
    const note = a[3] ? " (non-conforming)" : "";
    td.appendChild(el("span", "score " + a[2], a[2] + " " + a[1] + note));
    return td;
  }
  function row(it) {
    const tr = el("tr", "item"); tr.dataset.id = it.id;
    const info = el("td"); info.appendChild(el("div", null, it.id));
    const meta = el("div", "meta");
    for (const f of D.fields) {
      if (it.f[f] !== undefined) meta.appendChild(el("span", "chip", it.f[f]));
    }
    info.appendChild(meta); tr.appendChild(info);
    const q = el("td"); q.appendChild(el("div", "q", it.q));
    if (it.opts) {
      const ol = el("ol", "opts");
      for (const o of it.opts) ol.appendChild(el("li", null, o));
      q.appendChild(ol);
    }
    if (it.ctx !== undefined && D.contexts[it.ctx] !== undefined) {
      const d = el("details"); d.appendChild(el("summary", null, "epicrisis (" + it.ctx + ")"));
      d.addEventListener("toggle", () => {  // the epicrisis enters the page when opened
        if (d.open && d.children.length < 2) d.appendChild(el("div", "ctx", D.contexts[it.ctx]));
      });
      q.appendChild(d);
    }
    tr.appendChild(q); tr.appendChild(el("td", null, it.ref));
    it.r.forEach((a) => tr.appendChild(cell(a)));
    return tr;
  }
  function render() {
    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    state.page = Math.min(state.page, pages - 1);
    const body = $("rows"), frag = document.createDocumentFragment();
    for (const i of shown.slice(state.page * PAGE, (state.page + 1) * PAGE)) {
      frag.appendChild(row(items[i]));
    }
    body.replaceChildren(frag);
    $("count").textContent = shown.length + " of " + items.length + " items";
    $("count").dataset.shown = String(shown.length);
    $("count").dataset.query = state.q;
    $("page").textContent = "page " + (state.page + 1) + " of " + pages;
    $("prev").disabled = state.page === 0; $("next").disabled = state.page >= pages - 1;
  }
  let timer = null;
  $("search").addEventListener("input", (e) => {
    clearTimeout(timer);
    timer = setTimeout(() => { state.q = e.target.value; update(); }, 120);
  });
  $("run").addEventListener("change", (e) => { state.run = Number(e.target.value); update(); });
  $("outcome").addEventListener("change", (e) => { state.outcome = e.target.value; update(); });
  $("sort").addEventListener("change", (e) => { state.sort = e.target.value; update(); });
  $("prev").addEventListener("click", () => { state.page--; render(); window.scrollTo(0, 0); });
  $("next").addEventListener("click", () => { state.page++; render(); window.scrollTo(0, 0); });
  update();
  document.body.dataset.ready = "1";
})();
</script>
</body>
</html>
"""


def embed_json(obj: Any) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' (so no '</script>' or '<!--'
    in clinical text can end or alter the element), nor U+2028/2029."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    for raw, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                     ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(raw, esc)
    return text


def render_page(data: dict[str, Any], title: str = "medray samples") -> str:
    """The page for `samples_data`'s dict (runs, fields, contexts, items)."""
    from html import escape

    return (TEMPLATE.replace("__TITLE__", escape(title))
            .replace("__PAGE_SIZE__", str(PAGE_SIZE))
            .replace("__DATA__", embed_json(data)))
