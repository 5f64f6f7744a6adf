"""The HTML report's inline CSS, SVG patterns and script. Inline on purpose: the
report is one file that opens anywhere, offline, with no CDN and no fetch."""

CSS = """
:root { --data:#4e79a7; --compute:#cfc8c1; --coll:#f28e2b; --bad:#d62728; --ok:#2e7d32; --act:#6a3d9a;
        --ink:#1d1d1f; --mute:#6b6b70; --line:#e3e3e8; --bg:#fafafa; }
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--ink); background: #fff; }
header { padding: 8px 18px; background: #24292f; color: #fff; display: flex; gap: 18px; align-items: baseline; }
header h1 { font-size: 16px; margin: 0; }
header .meta { color: #c9d1d9; font-size: 12px; }
section.sec { padding: 6px 18px 18px; border-bottom: 3px solid var(--line); }
h2 { font-size: 15px; margin: 8px 0 6px; }
h3 { font-size: 13px; margin: 14px 0 4px; }
.root { border-left: 5px solid var(--bad); background: #fff5f5; padding: 6px 10px; margin: 4px 0 6px; }
.root.none { border-color: var(--ok); background: #f4fbf4; }
.root .kind { font-weight: 700; color: var(--bad); }
.root .where { color: var(--ink); margin-top: 2px; }
.root .reason { color: #333; }
.notes { color: #8a5300; background: #fff8e6; border-left: 5px solid #f0b400; padding: 4px 10px; margin: 4px 0; }
.toolbar { display: flex; gap: 6px; align-items: center; margin: 6px 0 2px; color: var(--mute); font-size: 12px; }
.toolbar button { font: inherit; padding: 1px 8px; border: 1px solid #bbb; background: #f6f6f6; border-radius: 4px; cursor: pointer; }
svg.lanes { width: 100%; height: auto; display: block; background: #fff; user-select: none; cursor: grab; }
svg.lanes text { font-size: 11px; }
.lane-bg { fill: #fff; } .lane-bg:nth-of-type(even) { fill: var(--bg); }
.lane.culprit-bg { fill: #fdecec; }
.lane-label { font-weight: 600; fill: var(--ink); font-size: 12px !important; }
.lane.culprit-label, .culprit-label { font-weight: 700; fill: var(--bad); font-size: 12px !important; }
.lane-sub { fill: var(--mute); font-size: 10px !important; }
.lane-empty { fill: var(--mute); font-style: italic; }
.seg.data { fill: var(--data); } .seg.compute { fill: var(--compute); } .seg.coll { fill: var(--coll); }
.seg.data.open { fill: url(#hatch-data); } .seg.coll.open { fill: url(#hatch-coll); }
.seg.compute.open { fill: url(#hatch-compute); }
.stepb { stroke: #fff; stroke-width: 1; }
.inflight { fill: none; stroke: #555; stroke-dasharray: 3 2; stroke-width: 1; }
.missing { fill: rgba(214,39,40,0.07); stroke: var(--bad); stroke-width: 1.6; stroke-dasharray: 5 3; }
.rl { fill: #111; font-size: 10px !important; pointer-events: none; }
.rl.missl { fill: var(--bad); font-weight: 700; }
.gone { fill: url(#hatch-gone); } .rl.gonel { fill: #fff; font-weight: 700; }
.silent { fill: #17a2b8; opacity: 0.8; }
.rl.phl { fill: var(--mute); font-size: 9px !important; }
.phase { fill: #9c755f; opacity: 0.55; } .ph-checkpoint { fill: #59a14f; } .ph-eval { fill: #b07aa1; }
.ph-init { fill: #9c755f; }
.hb { fill: #17a2b8; } .pg { fill: #555; } .ctl { fill: var(--act); } .err { stroke: var(--bad); stroke-width: 1.6; }
.ev line { stroke-width: 1.4; }
.ev-finding line, .ev-onset line { stroke: var(--bad); } .ev-finding text, .ev-onset text { fill: var(--bad); font-weight: 600; }
.ev-onset line { stroke-dasharray: 4 3; }
.ev-resolved line { stroke: var(--ok); } .ev-resolved text { fill: var(--ok); }
.ev-action line { stroke: var(--act); } .ev-action text { fill: var(--act); font-weight: 600; }
.ev-evidence line { stroke: #888; stroke-dasharray: 1 3; } .ev-evidence text { fill: #777; }
.ev-stop line { stroke: #222; } .ev-stop text { fill: #222; }
.ev-restart line { stroke: #8c564b; } .ev-restart text { fill: #8c564b; }
.ev-other line { stroke: #999; }
.axis line { stroke: #999; } .axis text { fill: var(--mute); font-size: 10px !important; }
.axis-wall { fill: var(--mute); font-size: 10px !important; }
.hl { stroke: #000 !important; stroke-width: 2 !important; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 11.5px; color: #333; margin: 4px 0; }
.legend span.sw { display: inline-block; width: 18px; height: 10px; vertical-align: -1px; margin-right: 4px; border-radius: 2px; }
.legend .note { flex-basis: 100%; color: var(--mute); }
svg.matrix { max-width: 100%; height: auto; display: block; }
svg.matrix text { font-size: 11px; }
.mx rect { fill: #f2f2f2; stroke: #ddd; } .mx.done rect { fill: #b9dcb5; stroke: #8cc084; }
.mx.waiting rect { fill: #ffd9a8; stroke: var(--coll); } .mx.missing rect { fill: #fff; stroke: var(--bad); stroke-width: 2; }
.mx.missing text { fill: var(--bad); font-weight: 700; } .mx-h { fill: var(--mute); }
table.ranks { border-collapse: collapse; font-size: 12px; width: 100%; }
table.ranks th, table.ranks td { text-align: left; padding: 3px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
table.ranks tr.culprit td { background: #fdecec; font-weight: 600; }
.grid { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); gap: 14px; }
pre.stack { background: #f6f8fa; border: 1px solid var(--line); padding: 6px 8px; font-size: 11.5px; overflow: auto;
            max-height: 340px; margin: 2px 0; }
.stack-h { font-weight: 600; } .stack-h.culprit { color: var(--bad); }
ul.events { margin: 2px 0; padding-left: 18px; } ul.events li { margin: 1px 0; }
.mute { color: var(--mute); }
footer { padding: 8px 18px; color: var(--mute); font-size: 11px; }
"""

# Hatched fills for "still in it when the slot was read". Ids are page-global:
# the CSS above refers to them from every section's SVG.
PATTERNS = """<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>
<pattern id="hatch-coll" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="6" height="6" fill="#fbd2a6"/><rect width="3" height="6" fill="#f28e2b"/></pattern>
<pattern id="hatch-data" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="6" height="6" fill="#c4d3e6"/><rect width="3" height="6" fill="#4e79a7"/></pattern>
<pattern id="hatch-compute" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="6" height="6" fill="#eeeae6"/><rect width="3" height="6" fill="#bdb4ab"/></pattern>
<pattern id="hatch-gone" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="6" height="6" fill="#555"/><rect width="3" height="6" fill="#333"/></pattern>
</defs></svg>"""

# Zoom/pan: every time-placed element carries its times, so a new view only
# recomputes x. Labels that no longer fit are hidden; event labels re-stack.
JS = r"""
(function () {
  "use strict";
  var CHAR_W = 6.4, EV_ROWS = 4, EV_ROW_H = 14;
  function niceStep(span) {
    var raw = span / 8, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var ms = [1, 2, 5, 10];
    for (var i = 0; i < ms.length; i++) { if (ms[i] * mag >= raw) { return ms[i] * mag; } }
    return 10 * mag;
  }
  function wallClock(t, tzOffset) {
    var d = new Date((t + tzOffset) * 1000), p = function (n, w) { return String(n).padStart(w, "0"); };
    return p(d.getUTCHours(), 2) + ":" + p(d.getUTCMinutes(), 2) + ":" + p(d.getUTCSeconds(), 2) + "." +
      p(d.getUTCMilliseconds(), 3);
  }
  function setup(svg) {
    var full = [+svg.dataset.t0, +svg.dataset.t1], view = full.slice();
    var x0 = +svg.dataset.x0, w = +svg.dataset.w, tz = +(svg.dataset.tz || 0);
    var NS = "http://www.w3.org/2000/svg";
    function X(t) { return x0 + (t - view[0]) / (view[1] - view[0]) * w; }
    function layout() {
      svg.querySelectorAll("rect[data-t0]").forEach(function (r) {
        var a = X(+r.dataset.t0), b = X(+r.dataset.t1);
        r.setAttribute("x", a.toFixed(2)); r.setAttribute("width", Math.max(0.5, b - a).toFixed(2));
      });
      svg.querySelectorAll("text[data-t0]").forEach(function (el) {
        var a = X(+el.dataset.t0), b = X(+el.dataset.t1);
        el.setAttribute("x", (a + 3).toFixed(2));
        var fits = (b - a) > el.textContent.length * CHAR_W + 6;
        if (fits) { el.removeAttribute("display"); } else { el.setAttribute("display", "none"); }
      });
      svg.querySelectorAll("line.stepb").forEach(function (l) {
        var x = X(+l.dataset.t).toFixed(2); l.setAttribute("x1", x); l.setAttribute("x2", x);
      });
      svg.querySelectorAll("g[data-t]").forEach(function (g) {
        g.setAttribute("transform", "translate(" + X(+g.dataset.t).toFixed(2) + "," + g.dataset.y + ")");
      });
      // Label rows as in svg.py: important kinds first, never overlapping; no row, no label.
      var taken = [], evs = Array.prototype.slice.call(svg.querySelectorAll("g.ev"));
      for (var i = 0; i < EV_ROWS; i++) { taken.push([]); }
      evs.sort(function (a, b) { return (a.dataset.prio - b.dataset.prio) || (a.dataset.t - b.dataset.t); });
      evs.forEach(function (g) {
        var x = X(+g.dataset.t), text = g.querySelector("text"), line = g.querySelector("line");
        var len = text.textContent.length * CHAR_W + 8, flip = x + len - 2 > x0 + w;
        var lo = flip ? x - len : x, hi = flip ? x : x + len, row = -1;
        for (var r = 0; r < EV_ROWS && row < 0; r++) {
          if (taken[r].every(function (iv) { return hi <= iv[0] || lo >= iv[1]; })) { row = r; }
        }
        if (row >= 0) { taken[row].push([lo, hi]); text.removeAttribute("display"); }
        else { text.setAttribute("display", "none"); }
        var y = EV_ROW_H * ((row >= 0 ? row : EV_ROWS - 1) + 1);
        text.setAttribute("text-anchor", flip ? "end" : "start"); text.setAttribute("x", flip ? "-3" : "3");
        text.setAttribute("y", y); line.setAttribute("y1", y + 2);
        g.style.display = (x < x0 - 1 || x > x0 + w + 1) ? "none" : "";
      });
      axis();
    }
    function axis() {
      var ax = svg.querySelector("g.axis"); if (!ax) { return; }
      var origin = +ax.dataset.origin, y = +ax.querySelector("line").getAttribute("y1");
      ax.querySelectorAll("g.tick").forEach(function (t) { t.remove(); });
      var step = niceStep(view[1] - view[0]), digits = Math.max(0, -Math.floor(Math.log10(step)));
      for (var k = Math.ceil((view[0] - origin) / step); origin + k * step <= view[1]; k++) {
        var g = document.createElementNS(NS, "g"), l = document.createElementNS(NS, "line"),
          tx = document.createElementNS(NS, "text");
        g.setAttribute("class", "tick");
        g.setAttribute("transform", "translate(" + X(origin + k * step).toFixed(2) + "," + y + ")");
        l.setAttribute("y2", "5"); tx.setAttribute("y", "16"); tx.setAttribute("text-anchor", "middle");
        tx.textContent = k === 0 ? "0" : ((k * step > 0 ? "+" : "") + (k * step).toFixed(digits) + "s");
        g.appendChild(l); g.appendChild(tx); ax.appendChild(g);
      }
      var walls = ax.querySelectorAll("text.axis-wall");
      if (walls.length >= 2) {
        walls[0].textContent = wallClock(view[0], tz); walls[1].textContent = wallClock(view[1], tz);
      }
    }
    function zoom(factor, at) {
      var t = at === undefined ? (view[0] + view[1]) / 2 : at;
      var span = Math.max(1e-4, (view[1] - view[0]) * factor);
      view = [t - (t - view[0]) * factor, t - (t - view[0]) * factor + span];
      layout();
    }
    function timeAt(clientX) {
      var pt = svg.createSVGPoint(); pt.x = clientX; pt.y = 0;
      var p = pt.matrixTransform(svg.getScreenCTM().inverse());
      return view[0] + (p.x - x0) / w * (view[1] - view[0]);
    }
    svg.addEventListener("wheel", function (e) {
      e.preventDefault(); zoom(e.deltaY > 0 ? 1.25 : 0.8, timeAt(e.clientX));
    }, { passive: false });
    var drag = null;
    svg.addEventListener("mousedown", function (e) { drag = { t: timeAt(e.clientX), view: view.slice() }; });
    window.addEventListener("mouseup", function () { drag = null; });
    svg.addEventListener("mousemove", function (e) {
      if (!drag) { return; }
      view = drag.view.slice();
      var dt = timeAt(e.clientX) - drag.t;
      view = [drag.view[0] - dt, drag.view[1] - dt]; layout();
    });
    var bar = document.querySelector('.toolbar[data-for="' + svg.id + '"]');
    if (bar) {
      bar.addEventListener("click", function (e) {
        var act = e.target.dataset && e.target.dataset.act;
        if (act === "fit") { view = full.slice(); layout(); }
        else if (act === "in") { zoom(0.5); }
        else if (act === "out") { zoom(2); }
        else if (act === "end") { var s = +e.target.dataset.span; view = [full[1] - s, full[1]]; layout(); }
      });
    }
    // "#last=2" in the address opens every section on its last 2 seconds (links, tests).
    var m = /last=([0-9.]+)/.exec(window.location.hash);
    if (m && +m[1] > 0) { view = [full[1] - +m[1], full[1]]; }
    layout();
  }
  document.querySelectorAll("svg.lanes").forEach(setup);
  // Hovering a collective highlights the same sequence number on every rank.
  function mark(e, on) {
    var el = e.target.closest ? e.target.closest("[data-seq]") : null;
    if (!el) { return; }
    var sec = el.closest("section");
    sec.querySelectorAll('[data-seq="' + el.dataset.seq + '"]').forEach(function (x) {
      var r = x.tagName === "g" ? x.querySelector("rect") : x;
      if (r) { r.classList.toggle("hl", on); }
    });
  }
  document.addEventListener("mouseover", function (e) { mark(e, true); });
  document.addEventListener("mouseout", function (e) { mark(e, false); });
  document.body.dataset.timeline = "ready";  // the script ran to the end (checked by the browser test)
})();
"""
