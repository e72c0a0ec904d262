"""The HTML report of ``loopfuse audit --html``: one self-contained file.

Inline CSS and JavaScript, charts drawn as inline SVG, no request to anything when
opened (auditors open it offline, from mail or a ticket). The page draws everything
from the summary embedded as JSON (``AuditSummary.to_dict``, the same object the
terminal tables come from). Every number it shows carries a ``data-metric`` key, and
a script error is written into ``#report-errors`` and into the page title, so a
test (or a human) sees at once that something did not render.

The agents' strings reach the page only as JSON data and ``textContent``, each shown
through ``ops/plain`` first (:func:`render_html`, the one place): a bidi override or
any other control or format character is written as its escape (``\\u202e``), so a tool
named ``exec\\u202etxt.exe`` cannot pass for ``exe.txt``. Should an escaping bug ever let
markup through, the Content-Security-Policy still runs no script but the page's own
(allowed by its SHA-256, not by ``'unsafe-inline'``).
"""

from __future__ import annotations

import base64
import hashlib
import html
from typing import Any

import orjson

from loopfuse.streams.ops.plain import shown, shown_all

REPORT_CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#dde2ea; --bg:#f6f7fa; --card:#fff; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
       color:var(--fg); background:var(--bg); }
header { padding:18px 28px; background:#1d2330; color:#fff; }
header h1 { margin:0 0 4px; font-size:20px; }
header p { margin:0; color:#c5cbd6; }
main { padding:20px 28px; display:grid; gap:18px; grid-template-columns:repeat(2,minmax(0,1fr)); }
section { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:14px 16px; }
section.wide { grid-column:1 / -1; }
h2 { margin:0 0 10px; font-size:15px; }
.cards { display:flex; flex-wrap:wrap; gap:12px; }
.card { flex:1 1 120px; border:1px solid var(--line); border-radius:6px; padding:8px 12px; }
.card b { display:block; font-size:22px; }
.card span { color:var(--muted); font-size:12px; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { padding:4px 8px; border-bottom:1px solid var(--line); text-align:right; white-space:nowrap; }
th:first-child, td:first-child, th.text, td.text { text-align:left; }
td.text { white-space:normal; overflow-wrap:anywhere; min-width:90px; }
td.key { white-space:nowrap; text-align:left; }
svg.wide { width:100%; height:auto; }
th.sortable { cursor:pointer; user-select:none; }
th.sortable:hover { background:#eef1f6; }
th[aria-sort="ascending"]::after { content:" \\25B2"; }
th[aria-sort="descending"]::after { content:" \\25BC"; }
.legend { display:flex; flex-wrap:wrap; gap:12px; margin-top:6px; font-size:12px; color:var(--muted); }
.legend i { display:inline-block; width:10px; height:10px; margin-right:4px; border-radius:2px; }
svg text { font-size:11px; fill:var(--muted); }
.muted { color:var(--muted); }
#report-errors { display:none; grid-column:1 / -1; color:#a40000; background:#fff0f0;
                 border:1px solid #e5a0a0; padding:10px; white-space:pre-wrap; }
#report-errors.shown { display:block; }
.scroll { max-height:520px; overflow:auto; }
"""

_JS = r"""
(function () {
  "use strict";
  var errors = document.getElementById("report-errors");
  function fail(message) {
    errors.textContent += message + "\n";
    errors.className = "shown";
    document.title = "ERROR " + document.title;
  }
  window.addEventListener("error", function (e) { fail("script error: " + e.message); });

  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = {
    generic_repeat: "#4e79a7", known_poll_no_progress: "#f28e2b", ping_pong: "#59a14f",
    unknown_tool_repeat: "#e15759", global_circuit_breaker: "#b07aa1",
    compaction_loop_persisted: "#9c755f", sequence_gap: "#76b7b2"
  };
  var ACTION_COLORS = { warn: "#f2b447", block: "#e15759", abort: "#7a1f2b" };
  var COUNTS = ["total", "warn", "block", "abort", "allow", "shadow"];

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = String(text);
    return node;
  }
  function svg(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    for (var k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = String(text);
    return node;
  }
  function num(value, key) {
    return el("td", { "data-metric": key }, value);
  }
  function color(detector) {
    // own keys only: a detector named "constructor" is not Object's
    return Object.prototype.hasOwnProperty.call(COLORS, detector) ? COLORS[detector] : "#8a8f98";
  }
  // Times Date can write as YYYY-MM-DD (years 0 .. 9999). A loop event from before ts
  // was bounded can carry a later one (2**53-1 ms is year 287396; Date ends at 8.64e15
  // ms and then throws RangeError): such a time is shown as its number, not thrown.
  var MIN_MS = -62167219200000, MAX_MS = 253402300799999;
  function shownTime(ms) {
    return typeof ms === "number" && isFinite(ms) && ms >= MIN_MS && ms <= MAX_MS;
  }
  // A time no date can hold comes as its digits (a string): shown as its number.
  function time(ms) {
    if (ms === null || ms === undefined) return "-";
    if (!shownTime(ms)) return String(ms) + " ms";
    return new Date(ms).toISOString().replace("T", " ").slice(0, 19);
  }
  function tick(ms, bucketS) {
    if (!shownTime(ms)) return String(ms);
    var full = time(ms);
    return bucketS >= 86400 ? full.slice(0, 10) : full.slice(11);
  }
  function bucketWidth(bucketS) {
    return bucketS >= 86400 && bucketS % 86400 === 0 ? bucketS / 86400 + " d" : bucketS + " s";
  }

  function countTable(target, rows, first, prefix) {
    var table = el("table"), head = el("tr");
    head.appendChild(el("th", {}, first));
    COUNTS.forEach(function (c) { head.appendChild(el("th", {}, c)); });
    table.appendChild(head);
    rows.forEach(function (row) {
      var tr = el("tr");
      tr.appendChild(el("td", { "class": "text" }, row.name));
      COUNTS.forEach(function (c) { tr.appendChild(num(row[c], prefix + "." + row.name + "." + c)); });
      table.appendChild(tr);
    });
    target.appendChild(table);
  }

  function barChart(id, rows, note) {
    var holder = document.getElementById(id);
    var width = 520, rowH = 22, left = 170, height = Math.max(rows.length, 1) * rowH + 8;
    var chart = svg("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height,
                             role: "img", "class": "chart" });
    var max = Math.max.apply(null, rows.map(function (r) { return r.total + r.shadow; }).concat([1]));
    rows.forEach(function (row, i) {
      var y = 4 + i * rowH, x = left, scale = (width - left - 60) / max;
      chart.appendChild(svg("text", { x: left - 6, y: y + 14, "text-anchor": "end" }, row.label));
      ["warn", "block", "abort", "allow", "shadow"].forEach(function (part) {
        var w = row[part] * scale;
        if (w <= 0) return;
        var bar = svg("rect", { x: x, y: y + 3, width: w, height: rowH - 8,
                                fill: part === "shadow" ? "#c9ced8" : (ACTION_COLORS[part] || "#9aa5b8") });
        bar.appendChild(svg("title", {}, row.name + ": " + part + " " + row[part]));
        chart.appendChild(bar);
        x += w;
      });
      chart.appendChild(svg("text", { x: x + 4, y: y + 14 }, row.total + row.shadow));
    });
    holder.appendChild(chart);
    if (note) holder.appendChild(el("p", { "class": "muted" }, note));
  }

  function timeline(data) {
    var holder = document.getElementById("chart-timeline");
    var t = data.timeline, names = Object.keys(t.series);
    var width = 1100, height = 260, left = 44, bottom = 28, top = 10;
    var chart = svg("svg", { viewBox: "0 0 " + width + " " + height, role: "img", "class": "chart wide" });
    holder.appendChild(chart);
    var undated = data.totals.undated ? "; " + data.totals.undated +
      " loop events without a time a date can hold are not on the chart" : "";
    if (!t.buckets) {
      holder.appendChild(el("p", { "class": "muted" }, "no loop events with a date" + undated));
      return;
    }
    var sums = [];
    for (var b = 0; b < t.buckets; b++) {
      sums.push(names.reduce(function (s, n) { return s + t.series[n][b]; }, 0));
    }
    var max = Math.max.apply(null, sums.concat([1]));
    var plotH = height - top - bottom, bw = (width - left - 8) / t.buckets;
    [0, 0.5, 1].forEach(function (f) {
      var y = top + plotH * (1 - f);
      chart.appendChild(svg("line", { x1: left, x2: width - 4, y1: y, y2: y, stroke: "#dde2ea" }));
      chart.appendChild(svg("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, Math.round(max * f)));
    });
    for (b = 0; b < t.buckets; b++) {
      var y = top + plotH;
      names.forEach(function (n) {
        var v = t.series[n][b];
        if (!v) return;
        var h = v / max * plotH;
        y -= h;
        var bar = svg("rect", { x: left + b * bw + 1, y: y, width: Math.max(bw - 2, 1), height: h,
                                fill: color(n), "data-detector": n });
        bar.appendChild(svg("title", {}, time(t.start_ms + b * t.bucket_s * 1000) + " " + n + ": " + v));
        chart.appendChild(bar);
      });
    }
    var ticks = Math.min(t.buckets, 6);
    for (var i = 0; i < ticks; i++) {
      var at = Math.round(i * (t.buckets - 1) / Math.max(ticks - 1, 1));
      var anchor = i === 0 ? "start" : (i === ticks - 1 ? "end" : "middle");
      var tx = anchor === "start" ? left + at * bw : (anchor === "end" ? left + (at + 1) * bw : left + at * bw + bw / 2);
      chart.appendChild(svg("text", { x: tx, y: height - 8, "text-anchor": anchor },
                            tick(t.start_ms + at * t.bucket_s * 1000, t.bucket_s)));
    }
    var legend = el("div", { "class": "legend" });
    names.forEach(function (n) {
      var total = t.series[n].reduce(function (a, c) { return a + c; }, 0);
      var item = el("span");
      var swatch = el("i");
      swatch.style.background = color(n);
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(n + " "));
      item.appendChild(el("b", { "data-metric": "timeline." + n }, total));
      legend.appendChild(item);
    });
    holder.appendChild(legend);
    holder.appendChild(el("p", { "class": "muted" },
      "bucket " + bucketWidth(t.bucket_s) + ", from " + time(t.start_ms) + " UTC; enforced and shadow events" +
      undated));
  }

  function funnel(data) {
    var holder = document.getElementById("chart-funnel");
    var width = 520, rowH = 44, height = data.funnel.length * rowH + 6;
    var chart = svg("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height,
                             role: "img", "class": "chart" });
    var max = Math.max.apply(null, data.funnel.map(function (s) { return s.sessions; }).concat([1]));
    data.funnel.forEach(function (stage, i) {
      var w = Math.max(stage.sessions / max * (width - 40), 2), y = 4 + i * rowH;
      chart.appendChild(svg("rect", { x: (width - w) / 2, y: y, width: w, height: rowH - 8,
                                      fill: ACTION_COLORS[stage.action], rx: 4 }));
      var label = stage.action + ": " + stage.sessions + " sessions, " + stage.events + " events";
      var inside = w > 250;
      chart.appendChild(svg("text", { x: inside ? width / 2 : (width + w) / 2 + 6, y: y + rowH / 2,
                                      "text-anchor": inside ? "middle" : "start",
                                      style: inside ? "fill:#fff;font-weight:600" : "fill:#1d2330;font-weight:600" },
                            label));
    });
    holder.appendChild(chart);
    var table = el("table"), head = el("tr");
    ["stage", "loop events", "sessions"].forEach(function (h) { head.appendChild(el("th", {}, h)); });
    table.appendChild(head);
    data.funnel.forEach(function (stage) {
      var tr = el("tr");
      tr.appendChild(el("td", {}, stage.action));
      tr.appendChild(num(stage.events, "funnel." + stage.action + ".events"));
      tr.appendChild(num(stage.sessions, "funnel." + stage.action + ".sessions"));
      table.appendChild(tr);
    });
    holder.appendChild(table);
  }

  var SESSION_COLUMNS = [
    ["session", "text"], ["agent", "text"], ["runs", "n"], ["total", "n"], ["warn", "n"],
    ["block", "n"], ["abort", "n"], ["shadow", "n"], ["max_count", "n"], ["detectors", "text"],
    ["first_ts", "time"], ["last_ts", "time"]
  ];

  function sessions(data) {
    var holder = document.getElementById("sessions");
    var table = el("table", { id: "sessions-table" }), thead = el("thead"), head = el("tr");
    var body = el("tbody");
    var rows = data.sessions.slice();
    var state = { key: "total", dir: -1 };
    SESSION_COLUMNS.forEach(function (col) {
      var th = el("th", { "class": "sortable" + (col[1] === "text" ? " text" : ""), "data-key": col[0] },
                  col[0].replace("_", " "));
      th.addEventListener("click", function () {
        state.dir = state.key === col[0] ? -state.dir : (col[1] === "text" ? 1 : -1);
        state.key = col[0];
        draw();
      });
      head.appendChild(th);
    });
    thead.appendChild(head);
    table.appendChild(thead);
    table.appendChild(body);
    function value(row, key) {
      if (key === "detectors") return Object.keys(row.detectors).join(",");
      var v = row[key];
      if (typeof v === "string" && key.slice(-3) === "_ts") return Number(v);
      return v === null || v === undefined ? -Infinity : v;
    }
    function draw() {
      rows.sort(function (a, b) {
        var x = value(a, state.key), y = value(b, state.key);
        if (x < y) return -state.dir;
        if (x > y) return state.dir;
        return a.session < b.session ? -1 : a.session > b.session ? 1 : 0;
      });
      head.querySelectorAll("th").forEach(function (th) {
        th.setAttribute("aria-sort", th.getAttribute("data-key") === state.key
          ? (state.dir > 0 ? "ascending" : "descending") : "none");
      });
      body.textContent = "";
      rows.forEach(function (row) {
        var tr = el("tr", { "data-session": row.session });
        SESSION_COLUMNS.forEach(function (col) {
          var key = col[0];
          if (key === "detectors") {
            tr.appendChild(el("td", { "class": "text" }, Object.keys(row.detectors).map(function (d) {
              return d + " \u00d7" + row.detectors[d];
            }).join(", ")));
          } else if (col[1] === "time") {
            tr.appendChild(el("td", {}, time(row[key])));
          } else if (col[1] === "text") {
            tr.appendChild(el("td", { "class": "key" }, row[key]));
          } else {
            tr.appendChild(num(row[key], "session." + row.session + "." + key));
          }
        });
        body.appendChild(tr);
      });
    }
    draw();
    holder.appendChild(table);
    if (data.sessions_shown < data.totals.sessions) {
      holder.appendChild(el("p", { "class": "muted" }, "showing the " + data.sessions_shown +
        " sessions with the most loop events of " + data.totals.sessions));
    }
  }

  function totals(data) {
    var holder = document.getElementById("totals");
    [["loop_events", "loop events"], ["enforced", "enforced"], ["shadow", "shadow (enforced: false)"],
     ["sessions", "sessions"], ["runs", "runs"], ["agents", "agents"],
     ["duplicates", "duplicates dropped (an event_id seen before)"]].forEach(function (pair) {
      var card = el("div", { "class": "card" });
      card.appendChild(el("b", { "data-metric": "totals." + pair[0] }, data.totals[pair[0]]));
      card.appendChild(el("span", {}, pair[1]));
      holder.appendChild(card);
    });
    var shadow = document.getElementById("shadow");
    var list = el("table"), head = el("tr");
    ["would have been", "loop events"].forEach(function (h) { head.appendChild(el("th", {}, h)); });
    list.appendChild(head);
    Object.keys(data.shadow_actions).forEach(function (action) {
      var tr = el("tr");
      tr.appendChild(el("td", {}, action));
      tr.appendChild(num(data.shadow_actions[action], "shadow." + action));
      list.appendChild(tr);
    });
    shadow.appendChild(list);
  }

  try {
    var data = JSON.parse(document.getElementById("audit-data").textContent);
    totals(data);
    timeline(data);
    countTable(document.getElementById("detectors"), data.by_detector, "detector", "detector");
    barChart("chart-agents", data.by_agent,
             data.by_agent.length < data.totals.agents ? "top " + data.by_agent.length + " of " + data.totals.agents + " agents" : "");
    barChart("chart-tools", data.by_tool,
             data.by_tool.length < data.totals.tools ? "top " + data.by_tool.length + " of " + data.totals.tools + " tools" : "");
    countTable(document.getElementById("agents"), data.by_agent, "agent", "agent");
    countTable(document.getElementById("tools"), data.by_tool, "tool", "tool");
    funnel(data);
    sessions(data);
    document.body.setAttribute("data-rendered", "true");
  } catch (e) {
    fail("report error: " + (e && e.stack ? e.stack : e));
  }
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>loopfuse audit</title>
<style>{css}</style>
</head>
<body>
<header>
  <h1>loopfuse audit</h1>
  <p>{subtitle}</p>
</header>
<main>
  <div id="report-errors" role="alert"></div>
  <section class="wide"><h2>Totals</h2><div class="cards" id="totals"></div></section>
  <section class="wide"><h2>Loop events over time, by detector</h2><div id="chart-timeline"></div></section>
  <section><h2>Loop events by detector</h2><div id="detectors"></div></section>
  <section><h2>Funnel: warn &rarr; block &rarr; abort (enforced)</h2><div id="chart-funnel"></div></section>
  <section><h2>Top agents</h2><div id="chart-agents"></div><div id="agents"></div></section>
  <section><h2>Top tools</h2><div id="chart-tools"></div><div id="tools"></div></section>
  <section class="wide"><h2>Shadow mode (enforced: false; the gateway was told allow)</h2><div id="shadow"></div></section>
  <section class="wide"><h2>Sessions <span class="muted">(click a column to sort)</span></h2>
    <div class="scroll" id="sessions"></div></section>
</main>
<script type="application/json" id="audit-data">{data}</script>
<script>{js}</script>
</body>
</html>
"""


def _script_hash(script: str) -> str:
    """The CSP source that allows exactly this inline script (its text between the tags)."""
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode()}'"


#: Nothing loads from anywhere; the one script that runs is the page's own; no <base>
#: can re-point its links and no <form> can send anything (both are not covered by
#: default-src). Styles stay inline: the charts set style attributes, and CSS runs no code.
CSP = (
    "default-src 'none'; "
    f"script-src {_script_hash(_JS)}; "
    "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)


def _json_for_script(data: Any) -> str:
    # Inside <script> only "</" could end the element early; \\u003c keeps it JSON.
    return orjson.dumps(data).decode().replace("<", "\\u003c")


#: Characters of an agent's or a tool's name beside its bar (the table has it whole).
LABEL_CHARS = 26


def render_html(data: dict[str, Any], *, source: str) -> str:
    """The report page for one ``AuditSummary.to_dict()``: every string in it shown
    through ``ops/plain``, names beside bars cut whole."""
    shown_data = shown_all(data, None)
    assert isinstance(shown_data, dict)
    for rows in ("by_agent", "by_tool"):
        for row, raw in zip(shown_data[rows], data[rows], strict=True):
            row["label"] = shown(raw["name"], LABEL_CHARS)
    totals = data["totals"]
    # the source is a path or a topic: shown escaped, as a file name may hold anything
    subtitle = (
        f"{totals['loop_events']} loop events from {shown(source, None)}: "
        f"enforced {totals['enforced']}, "
        f"shadow {totals['shadow']}"
    )
    return _PAGE.format(
        csp=CSP,
        css=REPORT_CSS,
        js=_JS,
        subtitle=html.escape(subtitle),
        data=_json_for_script(shown_data),
    )
