// candle-trace view: draws the page from the JSON document embedded in it.
// Hand-written, no libraries: the file must open offline, anywhere.
(function () {
  "use strict";
  var started = performance.now();
  var D = JSON.parse(document.getElementById("trace-data").textContent);
  var SVGNS = "http://www.w3.org/2000/svg";
  // The views of one trace that follow each other's selection, by prefix.
  var linked = {};

  // ---- helpers -----------------------------------------------------------

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = String(text);
    return e;
  }
  function $(id) { return document.getElementById(id); }
  function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); return e; }

  // Units as `candle-trace report` prints them (internal/report/text).
  function fmtNS(ns) {
    if (ns < 1e3) return String(+ns.toFixed(3)) + " ns";
    if (ns < 1e6) return (ns / 1e3).toFixed(2) + " µs";
    if (ns < 1e9) return (ns / 1e6).toFixed(2) + " ms";
    return (ns / 1e9).toFixed(3) + " s";
  }
  function fmtBytes(b) {
    if (b < 1024) return b + " B";
    var div = 1024, exp = 0;
    for (var n = Math.floor(b / 1024); n >= 1024 && exp < 5; n = Math.floor(n / 1024)) { div *= 1024; exp++; }
    return (b / div).toFixed(1) + " " + "KMGTPE"[exp] + "iB";
  }
  function fmtShare(f) { return (100 * f).toFixed(1) + "%"; }
  function fmtNum(v) {
    if (v === undefined || v === null) return "-";
    if (typeof v === "number" && !Number.isInteger(v)) return v.toPrecision(6).replace(/\.?0+$/, "");
    return String(v);
  }

  // table fills a <table> with a header and rows; flag(row) marks a row.
  function table(t, headers, rows, flag) {
    t = clear(typeof t === "string" ? $(t) : t);
    // Words sit left, numbers (with or without a unit) right; a column
    // heads the way its first row reads.
    function isText(c, j) { return j === 0 || (typeof c === "string" && !/^[-+\d.\[]/.test(c)); }
    var tr = el("tr");
    headers.forEach(function (h, j) { tr.appendChild(el("th", rows.length && isText(rows[0][j], j) ? { "class": "text" } : {}, h)); });
    t.appendChild(tr);
    rows.forEach(function (r, i) {
      var row = el("tr", flag && flag(i) ? { "class": "flag" } : {});
      r.forEach(function (c, j) { row.appendChild(el("td", isText(c, j) ? { "class": "text" } : {}, c)); });
      t.appendChild(row);
    });
    if (rows.length === 0) {
      var empty = el("tr");
      empty.appendChild(el("td", { colspan: headers.length, "class": "text" }, "none recorded"));
      t.appendChild(empty);
    }
    t.setAttribute("data-rows", rows.length);
  }

  function dl(parent, pairs) {
    var d = el("dl");
    pairs.forEach(function (p) {
      if (p[1] === undefined || p[1] === null || p[1] === "") return;
      d.appendChild(el("dt", {}, p[0]));
      d.appendChild(el("dd", {}, p[1]));
    });
    parent.appendChild(d);
  }

  // ---- overview ----------------------------------------------------------

  function overview(P, pre) {
    var h = P.health, m = P.meta || {}, R = P.report;

    // The verdict of `validate`: structurally valid and complete.
    var ok = h.structurally_valid && h.capture_complete;
    var v = $(pre + "verdict");
    v.setAttribute("data-ok", ok ? "true" : "false");
    v.appendChild(el("h3", {}, "Health (candle-graph's rules)"));
    v.appendChild(el("div", { id: pre + "verdict-word", "class": ok ? "verdict-ok" : "verdict-bad" }, ok ? "OK" : "FAIL"));
    var errors = h.issues.filter(function (i) { return i.severity === "error"; }).length;
    dl(v, [
      ["structure", h.structurally_valid ? "structurally valid" : "structurally invalid"],
      ["capture", h.capture_complete ? "complete" : (h.incomplete ? (h.cut_line ? "incomplete, cut at line " + h.cut_line : "incomplete, no terminal") : "outcome " + (h.outcome || "none"))],
      ["issues", errors + " errors, " + (h.issues.length - errors) + " warnings"],
      ["read", h.lines + " lines, " + fmtBytes(h.bytes)],
      ["failure", h.issues.filter(function (i) { return i.code === "capture_failed"; }).map(function (i) { return i.message; }).join("; ")],
    ]);

    var ul = clear($(pre + "issues"));
    h.issues.forEach(function (i) {
      var li = el("li", { "data-code": i.code, "data-severity": i.severity });
      li.appendChild(el("span", { "class": "pill " + i.severity }, i.severity));
      li.appendChild(document.createTextNode(" "));
      li.appendChild(el("code", {}, i.code));
      li.appendChild(document.createTextNode(": " + i.message + (i.line ? " (line " + i.line + ")" : "") + (i.count > 1 ? " ×" + i.count : "")));
      ul.appendChild(li);
    });
    if (h.issues.length === 0) ul.appendChild(el("li", { "class": "none" }, "no issues"));

    var id = $(pre + "identity");
    id.appendChild(el("h3", {}, "Run"));
    var prod = m.producer ? [m.producer.name, m.producer.version, m.producer.binding].filter(Boolean).join(" ") : "";
    var ci = m.comparison_identity || {};
    dl(id, [
      ["entrypoint", m.entrypoint], ["run", m.run_id], ["phase", m.phase], ["device", m.device],
      ["capture step", m.capture_step !== undefined ? m.capture_step + " (after " + m.warmup_steps + " warm-up)" : ""],
      ["timing", m.timing_mode], ["written", m.timestamp], ["producer", prod],
      ["model", ci.model_id], ["workload", ci.workload_id], ["precision", ci.precision],
      ["measured region", R && R.measured_region ? R.measured_region.name + " (" + R.measured_region.span_id + "), " + (R.measured_region.closed ? fmtNS(R.measured_region.duration_ns) : "never closed") : ""],
    ]);

    var o = $(pre + "overhead");
    o.appendChild(el("h3", {}, "Overhead analysis"));
    if (R) {
      var oa = R.overhead;
      o.setAttribute("data-verdict", oa.verdict);
      dl(o, [
        ["hypothesis", oa.hypothesis],
        ["numbers", oa.measured_ns ? "measured " + fmtNS(oa.measured_ns) + ", compute " + fmtNS(oa.compute_ns) + " (" + oa.basis + "), overhead " + fmtNS(oa.overhead_ns) + " = " + fmtShare(oa.overhead_share) : "-"],
        ["threshold", "overhead share > " + fmtShare(oa.threshold)],
        ["verdict", oa.verdict + ": " + oa.explanation],
      ]);
    } else {
      o.appendChild(el("p", {}, "no report: the trace could not be read far enough"));
    }

    if (!R) return;
    var TOP = 15;
    var spanRows = R.spans.slice(0, TOP).map(function (s) {
      return [s.name, s.count, fmtNS(s.total_ns), fmtNS(s.self_ns), fmtNS(s.mean_ns), fmtNS(s.p50_ns), fmtNS(s.p95_ns), fmtNS(s.max_ns), s.encloses_measured_region ? "-" : fmtShare(s.share), s.open || ""];
    });
    table(pre + "top-spans", ["name", "count", "total", "self", "mean", "p50", "p95", "max", "share", "open"], spanRows);
    var ops = R.ops || [];
    table(pre + "top-ops", ["name", "count", "total", "mean", "p50", "p95", "max", "share", "in bytes", "out bytes"], ops.slice(0, TOP).map(function (s) {
      return [s.name, s.count, fmtNS(s.total_ns), fmtNS(s.mean_ns), fmtNS(s.p50_ns), fmtNS(s.p95_ns), fmtNS(s.max_ns), fmtShare(s.share), fmtBytes(s.input_bytes || 0), fmtBytes(s.output_bytes || 0)];
    }));
    var ks = (R.device && R.device.kernels) || [];
    table(pre + "top-kernels", ["name", "count", "total", "mean", "max", "share of device time"], ks.slice(0, TOP).map(function (k) {
      return [k.name, k.count, fmtNS(k.total_ns), fmtNS(k.mean_ns), fmtNS(k.max_ns), fmtShare(k.share)];
    }));
  }

  // ---- timeline ----------------------------------------------------------

  var ROW = 18, AXIS = 22, GUTTER = 130, MAX_RECTS = 20000;

  function timeline(P, pre) {
    var R = P.report, T = P.timeline, svg = $(pre + "timeline-svg"), box = $(pre + "timeline-box");
    var spans = T.spans, ops = T.ops, ivs = T.intervals, names = T.names;
    var mr = R && R.measured_region;

    // Lanes: per thread as many rows as its deepest span or op, then one
    // row per device stream.
    var depth = T.threads.map(function () { return 0; });
    spans.forEach(function (s) { depth[s[2]] = Math.max(depth[s[2]], s[3] + 1); });
    ops.forEach(function (o) { depth[o[2]] = Math.max(depth[o[2]], o[3] + 1); });
    var laneY = [], y = AXIS;
    T.threads.forEach(function (tid, i) { laneY[i] = y; y += Math.max(depth[i], 1) * ROW + 8; });
    var streamY = T.streams.map(function () { var v = y; y += ROW + 4; return v; });
    var height = y + 4;
    svg.setAttribute("height", height);

    var t0 = Infinity, t1 = T.end_ns || 0;
    spans.forEach(function (s) { t0 = Math.min(t0, s[0]); t1 = Math.max(t1, s[0] + s[1]); });
    ops.forEach(function (o) { t0 = Math.min(t0, o[0]); });
    ivs.forEach(function (v) { t0 = Math.min(t0, v[0]); t1 = Math.max(t1, v[0] + v[1]); });
    if (!isFinite(t0)) { t0 = 0; }
    if (t1 <= t0) t1 = t0 + 1;
    var full = [t0, t1], view = [t0, t1];

    var tr = mr && mr.tracer_ns !== undefined ? mr.tracer_ns : null;
    var ttext = $(pre + "tracer-time");
    if (tr !== null || (mr && mr.session_tracer_ns !== undefined)) {
      var parts = [];
      if (tr !== null) parts.push(fmtNS(tr) + " inside the measured region, left out of its " + fmtNS(mr.duration_ns));
      if (mr.session_tracer_ns !== undefined) parts.push(fmtNS(mr.session_tracer_ns) + " in the whole session" + (mr.session_tracer_estimated_ns ? " (" + fmtNS(mr.session_tracer_estimated_ns) + " of it estimated)" : ""));
      ttext.textContent = "The tracer's own time: " + parts.join("; ") + ". The session clock stood still while it ran, so no span here contains it.";
      ttext.setAttribute("data-tracer-ns", tr === null ? "" : tr);
    } else {
      ttext.textContent = "The trace does not state the tracer's own time.";
    }
    // A limit takes rows outside the measured region first (thinned evenly,
    // the longer of neighbours kept), then the region's own in file order.
    var dr = T.dropped, left = [];
    function leftOut(n, outside, what) {
      if (!n) return;
      var parts = [];
      if (outside) parts.push(outside + (dr.measured_region ? " outside the measured region, thinned evenly" : " thinned evenly over the trace"));
      if (n - outside) parts.push((n - outside) + (dr.measured_region ? " inside it, the last in the file" : " the last in the file"));
      left.push(n + " " + what + " (" + parts.join("; ") + ")");
    }
    leftOut(dr.spans, dr.spans_outside || 0, "spans");
    leftOut(dr.ops, dr.ops_outside || 0, "ops");
    leftOut(dr.intervals, dr.intervals_outside || 0, "device intervals");
    var dropEl = $(pre + "timeline-dropped");
    dropEl.setAttribute("data-spans", dr.spans || 0);
    dropEl.setAttribute("data-spans-outside", dr.spans_outside || 0);
    dropEl.setAttribute("data-ops", dr.ops || 0);
    dropEl.setAttribute("data-ops-outside", dr.ops_outside || 0);
    dropEl.setAttribute("data-intervals", dr.intervals || 0);
    dropEl.setAttribute("data-intervals-outside", dr.intervals_outside || 0);
    dropEl.textContent = (left.length ? "Left out of this page to keep it small: " + left.join(", ") + ". " : "") +
      (dr.other_clock_intervals ? dr.other_clock_intervals + " device intervals on a device clock are not drawn (they cannot be placed on the host clock)." : "");

    function width() { return Math.max(box.clientWidth || 0, 600); }

    function draw() {
      clear(svg);
      var W = width(), span = view[1] - view[0], scale = (W - GUTTER) / span;
      svg.setAttribute("width", W);
      svg.setAttribute("viewBox", "0 0 " + W + " " + height);
      // Axis with about eight ticks at round steps.
      var step = Math.pow(10, Math.floor(Math.log10(span / 8)));
      if (span / step > 40) step *= 5; else if (span / step > 16) step *= 2;
      for (var t = Math.ceil(view[0] / step) * step; t <= view[1]; t += step) {
        var x = GUTTER + (t - view[0]) * scale;
        svg.appendChild(sv("line", { "class": "grid", x1: x, x2: x, y1: AXIS - 4, y2: height }));
        svg.appendChild(sv("text", { "class": "tick", x: x + 2, y: 12 }, fmtNS(t - full[0])));
      }
      T.threads.forEach(function (tid, i) {
        svg.appendChild(sv("text", { "class": "lane-label", x: 4, y: laneY[i] + 13 }, tid ? "thread " + tid : "no thread"));
      });
      T.streams.forEach(function (s, i) { svg.appendChild(sv("text", { "class": "lane-label", x: 4, y: streamY[i] + 13 }, s)); });

      // Items narrower than two pixels melt into one "dense" block per row
      // and stretch, so a million events draw as a few thousand rects; the
      // rest are drawn one by one, widest first up to MAX_RECTS. Rows come
      // in start order as the trace wrote them, so no sort is needed: an
      // item out of order only starts a new block.
      var wide = [], dense = [], open = [], skipped = 0;
      function place(kind, i, start, dur, y) {
        if (start + dur < view[0] || start > view[1]) return;
        var x = GUTTER + Math.max(start - view[0], 0) * scale;
        var x2 = GUTTER + Math.min(start + dur - view[0], span) * scale;
        if (x2 - x >= 2) { wide.push([kind, i, start, dur, y, x, x2]); return; }
        var key = y * 4 + (kind === "span" ? 0 : kind === "op" ? 1 : 2), cur = open[key];
        if (cur && x <= cur.x2 + 1 && x2 >= cur.x - 1) {
          cur.x = Math.min(cur.x, x); cur.x2 = Math.max(cur.x2, x2); cur.n++;
        } else {
          cur = open[key] = { y: y, t: kind, x: x, x2: x2, n: 1 };
          dense.push(cur);
        }
      }
      var n, row;
      for (n = 0; n < spans.length; n++) { row = spans[n]; place("span", n, row[0], row[1], laneY[row[2]] + row[3] * ROW); }
      for (n = 0; n < ops.length; n++) { row = ops[n]; place("op", n, row[0], row[1], laneY[row[2]] + row[3] * ROW); }
      for (n = 0; n < ivs.length; n++) { row = ivs[n]; place("kernel", n, row[0], row[1], streamY[row[2]]); }
      if (wide.length > MAX_RECTS) {
        wide.sort(function (a, b) { return b[3] - a[3]; });
        skipped = wide.length - MAX_RECTS;
        wide.length = MAX_RECTS;
      }
      var drawn = { span: 0, op: 0, kernel: 0 };
      dense.forEach(function (b) {
        var r = sv("rect", { "class": b.t + " dense", x: b.x, y: b.y + 1, width: Math.max(b.x2 - b.x, 0.5), height: ROW - 2, "data-n": b.n, "data-t": "dense" });
        r.appendChild(sv("title", {}, b.n + " " + b.t + (b.n > 1 ? "s" : "") + " here: zoom in"));
        svg.appendChild(r);
        drawn[b.t] += b.n;
      });
      wide.forEach(function (it) {
        var x = it[5], w = Math.max(it[6] - it[5], 0.5);
        var cls = it[0];
        if (cls === "span") {
          var f = spans[it[1]][5];
          if (f & 1) cls += " measured";
          if (f & 2) cls += " open";
        }
        var r = sv("rect", { "class": cls, x: x, y: it[4] + 1, width: w, height: ROW - 2, "data-i": it[1], "data-t": it[0] });
        svg.appendChild(r);
        if (it[0] === "kernel" && ivs[it[1]][4] < spans.length) {
          // A line up to the span that launched the work.
          var ls = spans[ivs[it[1]][4]];
          svg.appendChild(sv("line", { "class": "launch", x1: x, x2: x, y1: it[4] + 1, y2: laneY[ls[2]] + ls[3] * ROW + ROW - 1 }));
        }
        drawn[it[0]]++;
        var nameIdx = it[0] === "kernel" ? ivs[it[1]][3] : (it[0] === "op" ? ops[it[1]][4] : spans[it[1]][4]);
        if (w > 40) {
          var label = names[nameIdx], room = Math.floor((w - 6) / 6);
          svg.appendChild(sv("text", { "class": "label", x: x + 3, y: it[4] + 13 }, label.length > room ? label.slice(0, Math.max(room - 1, 1)) + "…" : label));
        }
      });
      // Counts of the items shown (one by one or in dense blocks).
      svg.setAttribute("data-spans", drawn.span);
      svg.setAttribute("data-ops", drawn.op);
      svg.setAttribute("data-kernels", drawn.kernel);
      svg.setAttribute("data-rects", svg.getElementsByTagName("rect").length);
      $(pre + "timeline-window").textContent = "showing " + fmtNS(view[0] - full[0]) + " – " + fmtNS(view[1] - full[0]) + " (" + fmtNS(span) + ")" + (dense.length ? "; narrow items drawn as dense blocks: zoom in" : "") + (skipped ? "; " + skipped + " more items hidden: zoom in" : "");
    }

    function detail(t, i) {
      var d = $(pre + "timeline-detail");
      if (t === "span") {
        var s = spans[i];
        d.textContent = "span " + names[s[4]] + ": starts " + fmtNS(s[0] - full[0]) + ", lasts " + fmtNS(s[1]) + ((s[5] & 2) ? " (never closed)" : "") + ((s[5] & 1) ? ", the measured region" : "") + ", thread " + T.threads[s[2]];
      } else if (t === "op") {
        var o = ops[i];
        d.textContent = "op " + names[o[4]] + ": starts " + fmtNS(o[0] - full[0]) + ", lasts " + fmtNS(o[1]);
      } else if (t === "kernel") {
        var v = ivs[i], from = v[4] < spans.length ? " launched in span " + names[spans[v[4]][4]] : "";
        d.textContent = "device " + names[v[3]] + " on " + T.streams[v[2]] + ": starts " + fmtNS(v[0] - full[0]) + ", lasts " + fmtNS(v[1]) + from;
      }
    }

    function zoom(factor, at) {
      var span = view[1] - view[0], c = at === undefined ? view[0] + span / 2 : at;
      var ns = Math.min(Math.max(span * factor, 10), full[1] - full[0]);
      var a = c - (c - view[0]) * (ns / span);
      a = Math.min(Math.max(a, full[0]), full[1] - ns);
      view = [a, a + ns];
      draw();
    }
    function timeAt(clientX) {
      var r = svg.getBoundingClientRect(), W = width();
      return view[0] + (clientX - r.left - GUTTER) / (W - GUTTER) * (view[1] - view[0]);
    }
    box.addEventListener("wheel", function (e) { e.preventDefault(); zoom(e.deltaY < 0 ? 0.8 : 1.25, timeAt(e.clientX)); }, { passive: false });
    var drag = null;
    box.addEventListener("mousedown", function (e) { drag = { x: e.clientX, view: view.slice() }; });
    window.addEventListener("mouseup", function () { drag = null; });
    box.addEventListener("mousemove", function (e) {
      if (drag) {
        var dt = (drag.x - e.clientX) / (width() - GUTTER) * (drag.view[1] - drag.view[0]);
        dt = Math.min(Math.max(dt, full[0] - drag.view[0]), full[1] - drag.view[1]);
        view = [drag.view[0] + dt, drag.view[1] + dt];
        draw();
        return;
      }
      var t = e.target.getAttribute && e.target.getAttribute("data-t");
      if (t) detail(t, +e.target.getAttribute("data-i"));
    });
    box.addEventListener("dblclick", function () { view = full.slice(); draw(); });
    $(pre + "zoom-in").addEventListener("click", function () { zoom(0.5); });
    $(pre + "zoom-out").addEventListener("click", function () { zoom(2); });
    $(pre + "zoom-reset").addEventListener("click", function () { view = full.slice(); draw(); });
    $(pre + "zoom-measured").addEventListener("click", function () {
      if (mr && mr.duration_ns > 0) { view = [mr.start_ns, mr.start_ns + mr.duration_ns]; draw(); }
    });
    window.addEventListener("resize", draw);
    // Selection, shared with the execution graph: focus zooms onto an item
    // and marks it; a click on an item selects it in the graph.
    var selected = null;
    var baseDraw = draw;
    draw = function () {
      baseDraw();
      if (!selected) return;
      var r = svg.querySelector('rect[data-t="' + selected[0] + '"][data-i="' + selected[1] + '"]');
      if (r) r.setAttribute("class", r.getAttribute("class") + " selected");
    };
    linked[pre] = linked[pre] || {};
    linked[pre].focus = function (kind, i) {
      var row = kind === "span" ? spans[i] : ops[i];
      if (!row) return;
      selected = [kind, i];
      var pad = Math.max(row[1] * 0.25, 50), a = Math.max(row[0] - pad, full[0]), b = Math.min(row[0] + row[1] + pad, full[1]);
      view = b > a ? [a, b] : full.slice();
      draw();
      detail(kind, i);
    };
    svg.addEventListener("click", function (e) {
      var t = e.target.getAttribute && e.target.getAttribute("data-t");
      if ((t === "span" || t === "op") && linked[pre].select) linked[pre].select(t, +e.target.getAttribute("data-i"), true);
    });
    draw();
  }

  // ---- execution graph -----------------------------------------------------

  // The graph reads top to bottom as the update ran: each span, then its
  // child spans and ops by start time, indented by depth (the call tree);
  // each op's output tensor sits in the tensor column on the op's row, and
  // arcs on the right carry every tensor to the ops that read it (dashed:
  // the trace's data edges). Tensors no op wrote come first.
  var GROW = 18, INDENT = 16, GRAPH_ROWS = 4000;

  function graph(P, pre) {
    var G = P.graph, T = P.timeline, svg = $(pre + "graph-svg"), box = $(pre + "graph-box");
    var names = T.names, spans = T.spans, ops = T.ops;
    var note = $(pre + "graph-note");
    var rows = [], rowOfSpan = {}, rowOfOp = {}, rowOfTensor = {};
    var kids = spans.map(function () { return []; });
    var rootKids = [];
    G.span_parent.forEach(function (p, i) { (p >= 0 && p < spans.length ? kids[p] : rootKids).push(["span", i, spans[i][0]]); });
    G.op_span.forEach(function (s, i) { (s >= 0 ? kids[s] : rootKids).push(["op", i, ops[i][0]]); });
    function byStart(a, b) { return a[2] - b[2] || (a[0] === b[0] ? a[1] - b[1] : a[0] === "span" ? -1 : 1); }
    var produced = {};
    G.op_out.forEach(function (t) { if (t >= 0) produced[t] = true; });
    G.tensors.forEach(function (id, t) {
      if (!produced[t]) { rowOfTensor[t] = rows.length; rows.push({ k: "tensor", i: t, d: 0, name: id }); }
    });
    // Iterative depth-first walk (a deep call tree must not overflow the stack).
    var stack = rootKids.sort(byStart).reverse().map(function (c) { return [c, 0]; });
    while (stack.length) {
      var top = stack.pop(), c = top[0], d = top[1];
      if (c[0] === "span") {
        rowOfSpan[c[1]] = rows.length;
        rows.push({ k: "span", i: c[1], d: d, name: names[spans[c[1]][4]] });
        kids[c[1]].sort(byStart).slice().reverse().forEach(function (k) { stack.push([k, d + 1]); });
      } else {
        rowOfOp[c[1]] = rows.length;
        var out = G.op_out[c[1]];
        rows.push({ k: "op", i: c[1], d: d, name: names[ops[c[1]][4]], out: out });
        if (out >= 0 && rowOfTensor[out] === undefined) rowOfTensor[out] = rows.length - 1;
      }
    }
    // A browser lays out a few thousand rows quickly, not a hundred thousand:
    // past GRAPH_ROWS the rows are searchable and selectable (the timeline
    // shows them) but not drawn.
    var drawnRows = Math.min(rows.length, GRAPH_ROWS);
    var maxD = 0;
    rows.slice(0, drawnRows).forEach(function (r) { maxD = Math.max(maxD, r.d); });
    var TCOL = 40 + maxD * INDENT + 260, W = TCOL + 260, H = drawnRows * GROW + 20;
    svg.setAttribute("data-nodes", rows.length);
    note.textContent = rows.length + " nodes: " + Object.keys(rowOfSpan).length + " spans, " + Object.keys(rowOfOp).length + " ops, " + G.tensors.length + " tensors; " +
      G.data.length + " data edges." + (G.omitted ? " No ops or tensors: " + G.omitted + "." : "") +
      (drawnRows < rows.length ? " The first " + drawnRows + " rows are drawn; search finds the others on the timeline." : "") + " Wheel zooms, drag pans; click a node to find it on the timeline.";
    function Y(r) { return 14 + r * GROW; }
    function X(d) { return 10 + d * INDENT; }
    var gEdges = sv("g", { "class": "edges" }), gNodes = sv("g", { "class": "nodes" });
    svg.appendChild(gEdges); svg.appendChild(gNodes);
    // The call tree: an elbow from each parent to each child.
    rows.slice(0, drawnRows).forEach(function (r, n) {
      var parentRow = r.k === "span" ? (G.span_parent[r.i] >= 0 ? rowOfSpan[G.span_parent[r.i]] : undefined) : r.k === "op" && G.op_span[r.i] >= 0 ? rowOfSpan[G.op_span[r.i]] : undefined;
      if (parentRow === undefined) return;
      var px = X(rows[parentRow].d) + 4;
      gEdges.appendChild(sv("path", { "class": "tree", d: "M" + px + "," + (Y(parentRow) + 5) + " V" + Y(n) + " H" + (X(r.d) - 2) }));
    });
    var edgeCount = 0;
    function arc(t, toRow, dashed) {
      var from = rowOfTensor[t];
      if (from === undefined || toRow === undefined || from >= drawnRows || toRow >= drawnRows) return;
      var y1 = Y(from), y2 = Y(toRow), bulge = Math.min(20 + Math.abs(y2 - y1) * 0.15, 220);
      gEdges.appendChild(sv("path", { "class": dashed ? "flow data" : "flow", d: "M" + (TCOL + 6) + "," + y1 + " C" + (TCOL + 6 + bulge) + "," + y1 + " " + (TCOL + 6 + bulge) + "," + y2 + " " + (TCOL + 8) + "," + y2 }));
      edgeCount++;
    }
    G.op_in.forEach(function (ins, o) { ins.forEach(function (t) { arc(t, rowOfOp[o], false); }); });
    G.data.forEach(function (e) { arc(e[0], rowOfTensor[e[1]], true); });
    svg.setAttribute("data-flows", edgeCount);
    var nodeEls = [];
    rows.slice(0, drawnRows).forEach(function (r, n) {
      var y = Y(n), g = sv("g", { "class": "node " + r.k, "data-k": r.k, "data-i": r.i, "data-row": n });
      if (r.k === "tensor") {
        g.appendChild(sv("circle", { cx: TCOL, cy: y, r: 4 }));
        g.appendChild(sv("text", { x: TCOL + 10, y: y + 4 }, r.name));
      } else {
        var x = X(r.d), label = r.name.length > 40 ? r.name.slice(0, 39) + "…" : r.name;
        g.appendChild(sv("rect", { x: x, y: y - 7, width: 8, height: 12, rx: r.k === "op" ? 4 : 1 }));
        g.appendChild(sv("text", { x: x + 12, y: y + 4 }, label));
        if (r.k === "op" && r.out >= 0) {
          gEdges.appendChild(sv("line", { "class": "writes", x1: x + 12 + label.length * 6.2, x2: TCOL - 5, y1: y, y2: y }));
          var tg = sv("g", { "class": "node tensor", "data-k": "tensor", "data-i": r.out, "data-row": n });
          tg.appendChild(sv("circle", { cx: TCOL, cy: y, r: 4 }));
          tg.appendChild(sv("text", { x: TCOL + 10, y: y + 4 }, G.tensors[r.out]));
          gNodes.appendChild(tg);
        }
      }
      g.appendChild(sv("title", {}, r.k + " " + r.name));
      gNodes.appendChild(g);
      nodeEls[n] = g;
    });

    // Pan and zoom on the viewBox.
    var vb = [0, 0, W, Math.min(H, 520)];
    svg.setAttribute("height", Math.min(H, 520));
    svg.setAttribute("preserveAspectRatio", "xMinYMin meet");
    function apply() { svg.setAttribute("viewBox", vb.join(" ")); }
    svg.setAttribute("width", "100%");
    apply();
    box.addEventListener("wheel", function (e) {
      e.preventDefault();
      var r = svg.getBoundingClientRect(), f = e.deltaY < 0 ? 0.8 : 1.25;
      var mx = vb[0] + (e.clientX - r.left) / r.width * vb[2], my = vb[1] + (e.clientY - r.top) / r.height * vb[3];
      vb = [mx - (mx - vb[0]) * f, my - (my - vb[1]) * f, vb[2] * f, vb[3] * f];
      apply();
    }, { passive: false });
    var drag = null;
    box.addEventListener("mousedown", function (e) { drag = { x: e.clientX, y: e.clientY, vb: vb.slice() }; });
    window.addEventListener("mouseup", function () { drag = null; });
    box.addEventListener("mousemove", function (e) {
      if (!drag) return;
      var r = svg.getBoundingClientRect();
      vb = [drag.vb[0] - (e.clientX - drag.x) / r.width * vb[2], drag.vb[1] - (e.clientY - drag.y) / r.height * vb[3], vb[2], vb[3]];
      apply();
    });

    var current = null;
    function show(n) {
      vb = [Math.max(X(rows[n].d) - 40, 0), Math.max(Y(n) - vb[3] / 2, 0), vb[2], vb[3]];
      apply();
    }
    function select(kind, i, fromTimeline) {
      var n = kind === "span" ? rowOfSpan[i] : kind === "op" ? rowOfOp[i] : rowOfTensor[i];
      if (n === undefined) return;
      if (current !== null && nodeEls[current]) nodeEls[current].setAttribute("class", nodeEls[current].getAttribute("class").replace(" selected", ""));
      current = n;
      if (nodeEls[n]) nodeEls[n].setAttribute("class", nodeEls[n].getAttribute("class") + " selected");
      svg.setAttribute("data-selected", kind + ":" + i);
      $(pre + "graph-detail").textContent = kind + " " + rows[n].name + (kind === "op" && rows[n].out >= 0 ? " → tensor " + G.tensors[rows[n].out] : "");
      if (nodeEls[n]) show(n);
      if (!fromTimeline && linked[pre].focus && kind !== "tensor") linked[pre].focus(kind, i);
    }
    linked[pre] = linked[pre] || {};
    linked[pre].select = select;
    svg.addEventListener("click", function (e) {
      var g = e.target.closest ? e.target.closest("g.node") : null;
      if (g) select(g.getAttribute("data-k"), +g.getAttribute("data-i"), false);
    });

    // Search: mark every node whose name holds the text; Enter walks them.
    var input = $(pre + "graph-search"), count = $(pre + "graph-count"), matches = [], at = -1;
    input.addEventListener("input", function () {
      var q = input.value.toLowerCase();
      matches = [];
      rows.forEach(function (r, n) {
        var hit = q !== "" && r.name.toLowerCase().indexOf(q) >= 0;
        if (nodeEls[n]) {
          var cls = nodeEls[n].getAttribute("class").replace(" match", "");
          nodeEls[n].setAttribute("class", hit ? cls + " match" : cls);
        }
        if (hit) matches.push(n);
      });
      at = -1;
      count.textContent = q === "" ? "" : matches.length + " match" + (matches.length === 1 ? "" : "es");
      svg.setAttribute("data-matches", matches.length);
    });
    function next() {
      if (!matches.length) return;
      at = (at + 1) % matches.length;
      var r = rows[matches[at]];
      select(r.k, r.i, false);
    }
    input.addEventListener("keydown", function (e) { if (e.key === "Enter") next(); });
    // A link can carry a search: view.html#find=relu finds and selects the
    // first match (on the first trace's graph).
    var m = /[#&]find=([^&]*)/.exec(location.hash);
    if (m && pre === firstPrefix()) {
      input.value = decodeURIComponent(m[1]);
      input.dispatchEvent(new Event("input"));
      next();
    }
  }
  function firstPrefix() { return D.comparison ? "a-" : ""; }

  // ---- memory ------------------------------------------------------------

  function memory(P, pre) {
    var R = P.report, M = P.memory, svg = $(pre + "memory-svg"), pts = M.points;
    var peak = R && R.memory && R.memory.peak;
    var sum = $(pre + "memory-summary");
    if (pts.length === 0) {
      sum.textContent = "No logical memory records in this trace.";
      svg.setAttribute("height", 0);
    } else {
      var cats = peak ? Object.keys(peak.by_category).sort().map(function (c) { return c + " " + fmtBytes(peak.by_category[c]); }).join(", ") : "";
      sum.textContent = "Logical live bytes (storages allocated and not yet freed), " + M.all_points + " points" +
        (M.drawn_points < M.all_points ? " (" + M.drawn_points + " drawn: the largest of each stretch)" : "") +
        ". Peak " + fmtBytes(M.peak_bytes) + " at " + fmtNS(M.peak_at_ns) + (peak && peak.span_name ? " in " + peak.span_name : "") + (cats ? ": " + cats : "") + "." +
        (M.dropped_events ? " " + M.dropped_events + " memory records were left out of this page." : "");
      var W = Math.max(svg.parentNode.clientWidth || 0, 600), H = 240, L = 70, B = 24, Tp = 16;
      svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("viewBox", "0 0 " + W + " " + H);
      // The same stretch of time as the timeline, so the two line up.
      var x0 = pts[0][0], x1 = Math.max(pts[pts.length - 1][0], P.timeline.end_ns || 0);
      P.timeline.spans.forEach(function (s) { x0 = Math.min(x0, s[0]); });
      if (x1 <= x0) x1 = x0 + 1;
      var ymax = Math.max(M.peak_bytes, 1);
      function X(t) { return L + (t - x0) / (x1 - x0) * (W - L - 10); }
      function Y(b) { return H - B - b / ymax * (H - B - Tp); }
      for (var i = 0; i <= 4; i++) {
        var b = ymax * i / 4;
        svg.appendChild(sv("line", { "class": "grid", x1: L, x2: W - 10, y1: Y(b), y2: Y(b) }));
        svg.appendChild(sv("text", { "class": "tick", x: 2, y: Y(b) + 3 }, fmtBytes(Math.round(b))));
      }
      svg.appendChild(sv("text", { "class": "tick", x: L, y: H - 6 }, fmtNS(x0)));
      svg.appendChild(sv("text", { "class": "tick", x: W - 80, y: H - 6 }, fmtNS(x1)));
      // Step curves: the bytes hold until the next point. One band per
      // category, stacked, under the total's outline.
      var cats = M.categories || [], colors = { parameter: "#84adea", activation: "#9bd3a8", gradient: "#f4b860", optimizer: "#c4a5ec", other: "#d0d5dd" };
      var below = pts.map(function () { return 0; });
      cats.forEach(function (c, k) {
        if (!pts.some(function (p) { return p[2 + k] > 0; })) return;
        var up = "M" + X(x0) + "," + Y(0), down = ""; // nothing is live before the first record
        pts.forEach(function (p, i) {
          var top = below[i] + p[2 + k];
          up += " H" + X(p[0]) + " V" + Y(top);
          below[i] = top;
        });
        // Back along the band's floor.
        var floor = pts.map(function (p, i) { return below[i] - p[2 + k]; });
        down = " H" + X(x1) + " V" + Y(floor[pts.length - 1]);
        for (var i = pts.length - 1; i >= 0; i--) {
          down += " H" + X(pts[i][0]) + " V" + Y(i > 0 ? floor[i - 1] : 0);
        }
        var band = sv("path", { "class": "category-band", "data-category": c, d: up + down + " H" + X(x0) + " Z", fill: colors[c] || "#d0d5dd" });
        band.appendChild(sv("title", {}, c));
        svg.appendChild(band);
      });
      var d = "M" + X(x0) + "," + Y(0);
      pts.forEach(function (p) { d += " H" + X(p[0]) + " V" + Y(p[1]); });
      d += " H" + X(x1) + " V" + Y(0);
      svg.appendChild(sv("path", { id: pre + "memory-curve", "class": "curve", d: d }));
      var lx = L + 4;
      cats.forEach(function (c, k) {
        if (!pts.some(function (p) { return p[2 + k] > 0; })) return;
        svg.appendChild(sv("rect", { x: lx, y: 4, width: 10, height: 10, fill: colors[c] || "#d0d5dd" }));
        svg.appendChild(sv("text", { "class": "tick", x: lx + 14, y: 13 }, c));
        lx += 30 + c.length * 6;
      });
      var px = X(M.peak_at_ns), py = Y(M.peak_bytes);
      svg.appendChild(sv("circle", { id: pre + "memory-peak", "class": "peak", cx: px, cy: py, r: 4, "data-bytes": M.peak_bytes, "data-at": M.peak_at_ns }));
      svg.appendChild(sv("text", { "class": "peak-label", x: Math.min(px + 6, W - 160), y: Math.max(py - 4, 12) }, "peak " + fmtBytes(M.peak_bytes)));
    }
    table(pre + "peak-storages", ["storage", "device", "size", "category", "made by"], M.peak_storages.map(function (s) {
      return [s.storage, s.device, fmtBytes(s.bytes), s.category, s.made_by || "-"];
    }));
    if (M.live_at_peak > M.peak_storages.length) {
      $(pre + "peak-storages").insertAdjacentElement("afterend", el("p", { "class": "hint" }, M.live_at_peak + " storages were live at the peak; the largest " + M.peak_storages.length + " are listed."));
    }
    deviceCurves(P, pre, M.devices, svg.parentNode);
    var devs = (R && R.memory.devices) || [];
    table(pre + "device-memory", ["device", "samples", "peak used", "peak reserved", "least free", "capacity"], devs.map(function (d) {
      function b(v) { return v === undefined ? "-" : fmtBytes(v); }
      return [d.device, d.samples, b(d.peak_used_bytes) + (d.peak_used_bytes !== undefined ? " at " + fmtNS(d.peak_used_at_ns) : ""), b(d.peak_reserved_bytes), b(d.min_free_bytes), b(d.capacity_bytes)];
    }));
  }

  // deviceCurves draws each device's sampled used bytes, one line a device,
  // on the same stretch of time as the timeline.
  function deviceCurves(P, pre, devices, parent) {
    var svg = $(pre + "device-memory-svg");
    if (!devices.length) { svg.setAttribute("height", 0); return; }
    var W = Math.max(parent.clientWidth || 0, 600), H = 160, L = 70, B = 24, Tp = 12;
    svg.setAttribute("width", W); svg.setAttribute("height", H); svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var x0 = Infinity, x1 = P.timeline.end_ns || 0, ymax = 1;
    P.timeline.spans.forEach(function (s) { x0 = Math.min(x0, s[0]); });
    devices.forEach(function (d) { d.points.forEach(function (p) { x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]); ymax = Math.max(ymax, p[1]); }); });
    if (!isFinite(x0)) x0 = 0;
    if (x1 <= x0) x1 = x0 + 1;
    function X(t) { return L + (t - x0) / (x1 - x0) * (W - L - 10); }
    function Y(b) { return H - B - b / ymax * (H - B - Tp); }
    [0, 0.5, 1].forEach(function (f) {
      svg.appendChild(sv("line", { "class": "grid", x1: L, x2: W - 10, y1: Y(ymax * f), y2: Y(ymax * f) }));
      svg.appendChild(sv("text", { "class": "tick", x: 2, y: Y(ymax * f) + 3 }, fmtBytes(Math.round(ymax * f))));
    });
    var colors = ["#7a4fc0", "#b07010", "#3f8f55", "#b42318"];
    devices.forEach(function (d, i) {
      var path = d.points.map(function (p, k) { return (k ? "L" : "M") + X(p[0]) + "," + Y(p[1]); }).join(" ");
      svg.appendChild(sv("path", { "class": "device-used", d: path, stroke: colors[i % colors.length], fill: "none", "data-device": d.device, "data-samples": d.samples }));
      svg.appendChild(sv("text", { "class": "tick", x: L + 4 + 160 * i, y: H - 6, fill: colors[i % colors.length] }, d.device + " used (" + d.samples + " samples)"));
    });
  }

  // ---- gradients and tensor statistics -----------------------------------

  function gradients(P, pre) {
    var R = P.report;
    if (!R) { table(pre + "gradients-table", ["root", "key"], []); return; }
    var g = R.gradients, fam = {};
    var gc = P.meta && P.meta.capture_contract && P.meta.capture_contract.gradient_contract;
    if (gc) gc.expected.forEach(function (e) { fam[e.root + "\u0000" + e.key] = e.family; });
    var rows = g.all.slice();
    // A contract's parameters that never got a gradient record are missing too.
    if (gc) gc.expected.forEach(function (e) {
      if (!g.all.some(function (x) { return x.root === e.root && x.key === e.key; })) rows.push({ root: e.root, key: e.key, state: "not recorded" });
    });
    $(pre + "gradient-summary").textContent = g.total + " parameters: " + g.present + " present, " + g.zero + " zero, " + g.missing + " missing, " + g.non_finite + " non-finite" +
      (rows.length > g.all.length ? "; " + (rows.length - g.all.length) + " of the contract's parameters have no record" : "") + ".";
    table(pre + "gradients-table", ["root", "key", "family", "state", "norm", "line"], rows.map(function (x) {
      return [x.root, x.key, fam[x.root + "\u0000" + x.key] || "-", x.state, x.norm === undefined ? "-" : fmtNum(x.norm), x.line || "-"];
    }), function (i) { return rows[i].state !== "present"; });
  }

  function tensorStats(P, pre) {
    var R = P.report;
    var ts = (R && R.tensor_stats) || [];
    table(pre + "tensor-stats-table", ["label", "dtype", "shape", "records", "non-finite records", "non-finite elements", "rms", "abs max", "mean"], ts.map(function (s) {
      return [s.label, s.dtype, "[" + s.shape.join(", ") + "]", s.observations, s.non_finite_records, s.non_finite_elements, fmtNum(s.rms), fmtNum(s.abs_max), fmtNum(s.mean)];
    }), function (i) { return ts[i].non_finite_elements > 0; });
  }

  // ---- the page's skeleton --------------------------------------------

  // traceSkeleton is the markup of one trace's views; every id carries the
  // prefix (none for a single trace, "a-"/"b-" for the sides of a
  // comparison), so the same code draws either.
  function traceSkeleton(pre, label) {
    var L = label ? label + ": " : "";
    return (
      '<section id="{p}overview"><h2>' + L + 'Overview</h2>' +
      '<div class="cards"><div class="card" id="{p}verdict"></div><div class="card" id="{p}identity"></div><div class="card" id="{p}overhead"></div></div>' +
      '<h3>Issues</h3><ul id="{p}issues" class="issues"></ul>' +
      '<h3>Spans by name</h3><table id="{p}top-spans" class="stats"></table>' +
      '<h3>Ops by name</h3><table id="{p}top-ops" class="stats"></table>' +
      '<h3>Device kernels by name</h3><table id="{p}top-kernels" class="stats"></table></section>' +
      '<section id="{p}timeline"><h2>' + L + 'Timeline of the update</h2>' +
      '<p class="hint">Wheel or the buttons zoom, drag pans, double-click shows the whole update. Spans nest per thread; ops sit under their span; host-clock device work runs on one lane per stream, a dashed line up to the span that launched it.</p>' +
      '<div class="toolbar"><button id="{p}zoom-in" type="button">+</button><button id="{p}zoom-out" type="button">&minus;</button>' +
      '<button id="{p}zoom-measured" type="button">measured region</button><button id="{p}zoom-reset" type="button">whole update</button><span id="{p}timeline-window" class="window"></span></div>' +
      '<p id="{p}tracer-time" class="note"></p><p id="{p}timeline-dropped" class="note"></p>' +
      '<div id="{p}timeline-box" class="timeline-box"><svg id="{p}timeline-svg" class="timeline-svg" xmlns="http://www.w3.org/2000/svg"></svg></div>' +
      '<div id="{p}timeline-detail" class="detail">Point at a span or an op.</div></section>' +
      '<section id="{p}graph"><h2>' + L + 'Execution graph</h2><p id="{p}graph-note" class="note"></p>' +
      '<div class="toolbar"><input id="{p}graph-search" type="search" placeholder="find a span, op or tensor"><span id="{p}graph-count" class="window"></span></div>' +
      '<div id="{p}graph-box" class="timeline-box"><svg id="{p}graph-svg" class="graph-svg" xmlns="http://www.w3.org/2000/svg"></svg></div>' +
      '<div id="{p}graph-detail" class="detail">Click a node.</div></section>' +
      '<section id="{p}memory"><h2>' + L + 'Memory</h2><p id="{p}memory-summary" class="note"></p>' +
      '<svg id="{p}memory-svg" class="chart" xmlns="http://www.w3.org/2000/svg"></svg>' +
      '<h3>Live storages at the peak</h3><table id="{p}peak-storages" class="stats"></table>' +
      '<h3>Device memory samples</h3><svg id="{p}device-memory-svg" class="chart" xmlns="http://www.w3.org/2000/svg"></svg>' +
      '<table id="{p}device-memory" class="stats"></table></section>' +
      '<section id="{p}gradients"><h2>' + L + 'Gradients</h2><p id="{p}gradient-summary" class="note"></p><table id="{p}gradients-table" class="stats"></table></section>' +
      '<section id="{p}tensor-stats"><h2>' + L + 'Tensor statistics</h2><table id="{p}tensor-stats-table" class="stats"></table></section>'
    ).replace(/\{p\}/g, pre);
  }

  function nav(links) {
    var n = $("nav");
    links.forEach(function (l) { n.appendChild(el("a", { href: "#" + l[0] }, l[1])); });
  }

  function tracePage(P, pre, label) {
    var holder = el("div", { id: pre + "trace", "class": label ? "trace side" : "trace" });
    holder.innerHTML = traceSkeleton(pre, label);
    $("main").appendChild(holder);
    // Each view's drawing time, for the record (data-ms-* on <html>).
    [["overview", overview], ["timeline", timeline], ["graph", graph], ["memory", memory], ["gradients", gradients], ["tensor-stats", tensorStats]].forEach(function (v) {
      var t0 = performance.now();
      v[1](P, pre);
      document.documentElement.setAttribute("data-ms-" + pre + v[0], Math.round(performance.now() - t0));
    });
  }

  // ---- two traces ----------------------------------------------------------

  function ratio(r) { return r === undefined || r === null ? "-" : "×" + r.toFixed(3); }
  function signedNS(d) { return (d > 0 ? "+" : d < 0 ? "−" : "") + fmtNS(Math.abs(d)); }
  function signedBytes(d) { return d === undefined || d === null ? "-" : (d > 0 ? "+" : d < 0 ? "−" : "") + fmtBytes(Math.abs(d)); }

  function deltaTable(t, rows) {
    table(t, ["name", "count A", "count B", "total A", "total B", "delta", "ratio", ""], rows.map(function (r) {
      return [r.name, r.count_a, r.count_b, fmtNS(r.total_a_ns), fmtNS(r.total_b_ns), signedNS(r.delta_ns), ratio(r.ratio), r.significant ? "!" : ""];
    }), function (i) { return rows[i].significant; });
  }

  function comparePage(C, A, B) {
    var s = el("section", { id: "compare" });
    s.innerHTML = '<h2>B against A</h2><div class="cards"><div class="card" id="compare-a"></div><div class="card" id="compare-b"></div><div class="card" id="compare-identity"></div></div>' +
      '<h3>Measured region</h3><table id="compare-region" class="stats"></table>' +
      '<h3>Spans by name (phase times)</h3><table id="compare-spans" class="stats"></table>' +
      '<h3>Ops by name</h3><table id="compare-ops" class="stats"></table>' +
      '<h3>Device time by launching span</h3><table id="compare-device-by-span" class="stats"></table>' +
      '<h3>Device kernels by name</h3><table id="compare-kernels" class="stats"></table>' +
      '<h3>Memory peaks</h3><table id="compare-memory" class="stats"></table>' +
      '<h3>Gradient norms</h3><table id="compare-gradients" class="stats"></table>' +
      '<h3>Only on one side</h3><table id="compare-only" class="stats"></table>';
    $("main").appendChild(s);
    [["compare-a", "A", C.a, A], ["compare-b", "B", C.b, B]].forEach(function (x) {
      var card = $(x[0]), ok = x[2].structurally_valid && x[2].capture_complete;
      card.setAttribute("data-ok", ok ? "true" : "false");
      card.appendChild(el("h3", {}, x[1] + ": " + x[2].path));
      card.appendChild(el("div", { "class": ok ? "verdict-ok" : "verdict-bad" }, ok ? "OK" : "FAIL"));
      dl(card, [["run", x[2].run_id], ["implementation", x[2].implementation_id], ["entrypoint", x[3].meta && x[3].meta.entrypoint],
        ["issues", x[3].health.issues.map(function (i) { return i.code; }).join(", ") || "none"]]);
    });
    var idc = $("compare-identity");
    idc.setAttribute("data-comparable", C.identity_comparable ? "true" : "false");
    idc.appendChild(el("h3", {}, "Comparison identity"));
    idc.appendChild(el("div", { "class": C.identity_comparable ? "verdict-ok" : "verdict-bad" }, C.identity_comparable ? "comparable" : "NOT comparable"));
    if (C.identity_problem) idc.appendChild(el("p", {}, C.identity_problem + " (`compare` refuses these without --force; the page shows them anyway)"));
    dl(idc, (C.identity_diffs || []).map(function (d) { return [d.field, "A " + d.a + ", B " + d.b]; }));
    dl(idc, [["significant", "changes beyond " + fmtShare(C.threshold) + " are marked !"]]);

    deltaTable($("compare-region"), C.measured_region ? [C.measured_region] : []);
    deltaTable($("compare-spans"), C.spans || []);
    deltaTable($("compare-ops"), C.ops || []);
    deltaTable($("compare-device-by-span"), C.device_by_span || []);
    deltaTable($("compare-kernels"), C.kernels || []);
    var m = C.memory, mrows = [];
    if (m.peak_a_bytes !== undefined || m.peak_b_bytes !== undefined) {
      mrows.push(["logical peak", m.peak_a_bytes === undefined ? "-" : fmtBytes(m.peak_a_bytes), m.peak_b_bytes === undefined ? "-" : fmtBytes(m.peak_b_bytes), signedBytes(m.delta_bytes), ratio(m.ratio)]);
    }
    (m.devices || []).forEach(function (d) {
      mrows.push([d.device + " peak used", d.peak_used_a_bytes === undefined ? "-" : fmtBytes(d.peak_used_a_bytes), d.peak_used_b_bytes === undefined ? "-" : fmtBytes(d.peak_used_b_bytes), signedBytes(d.delta_bytes), "-"]);
    });
    table($("compare-memory"), ["", "A", "B", "delta", "ratio"], mrows);
    var g = C.gradients || [];
    table($("compare-gradients"), ["root", "key", "state A", "state B", "norm A", "norm B", "relative error", ""], g.map(function (x) {
      return [x.root, x.key, x.state_a, x.state_b, fmtNum(x.norm_a), fmtNum(x.norm_b), x.rel_error === undefined ? "-" : x.rel_error.toExponential(2), x.significant || x.state_changed ? "!" : ""];
    }), function (i) { return g[i].significant || g[i].state_changed; });
    var only = [];
    [["A", C.only_in_a], ["B", C.only_in_b]].forEach(function (x) {
      (x[1].spans || []).forEach(function (n) { only.push([x[0], "span", n.name, fmtNS(n.total_ns)]); });
      (x[1].ops || []).forEach(function (n) { only.push([x[0], "op", n.name, fmtNS(n.total_ns)]); });
      (x[1].kernels || []).forEach(function (n) { only.push([x[0], "kernel", n.name, fmtNS(n.total_ns)]); });
      (x[1].gradients || []).forEach(function (n) { only.push([x[0], "gradient", n, "-"]); });
    });
    table($("compare-only"), ["only in", "what", "name", "total"], only);
  }

  // ---- an aggregate summary -------------------------------------------------

  function aggregatePage(A) {
    var s = el("section", { id: "aggregate" });
    s.innerHTML = '<h2>Whole run (aggregate summary)</h2><div class="cards"><div class="card" id="aggregate-run"></div><div class="card" id="aggregate-analysis"></div></div>' +
      '<h3>Categorized span time</h3><svg id="aggregate-categories" class="chart" xmlns="http://www.w3.org/2000/svg"></svg>' +
      '<h3>Distributions per span name (log scale: min–max line, p50–p95 box, p99 tick)</h3><svg id="aggregate-dist" class="chart" xmlns="http://www.w3.org/2000/svg"></svg>' +
      '<h3>Spans by total time</h3><table id="aggregate-spans" class="stats"></table>' +
      '<div id="aggregate-triggers-box"></div>' +
      '<h3>Scalars</h3><table id="aggregate-scalars" class="stats"></table><p id="aggregate-limits" class="note"></p>';
    $("main").appendChild(s);
    var run = A.run || {}, win = A.window || {};
    var rc = $("aggregate-run");
    rc.appendChild(el("h3", {}, "Run"));
    dl(rc, [["entrypoint", run.entrypoint], ["phase", run.phase], ["device", run.device], ["binding", run.binding],
      ["tags", Object.keys(run.tags || {}).sort().map(function (k) { return k + "=" + run.tags[k]; }).join(" ")],
      ["window", win.duration_ns !== undefined ? fmtNS(win.duration_ns) : ""], ["summary", "sequence " + A.sequence + (A.final ? ", final" : ", not final (the run was still going)")],
      ["schema", A.schema]]);
    var an = A.overhead, ac = $("aggregate-analysis");
    ac.setAttribute("data-verdict", an.verdict);
    ac.appendChild(el("h3", {}, "Overhead analysis"));
    dl(ac, [["hypothesis", an.hypothesis], ["numbers", "compute " + fmtNS(an.compute_ns) + " of " + fmtNS(an.categorized_ns) + " categorized = " + fmtShare(an.compute_share) + (an.ignored_ns ? "; " + fmtNS(an.ignored_ns) + " ignored (enclosing spans)" : "")],
      ["threshold", "compute share > " + fmtShare(an.threshold)], ["verdict", an.verdict + ": " + an.explanation]]);

    // One stacked bar of the categories.
    var cs = $("aggregate-categories"), W = Math.max(cs.parentNode.clientWidth || 0, 600), H = 44, x = 0;
    cs.setAttribute("width", W); cs.setAttribute("height", H); cs.setAttribute("viewBox", "0 0 " + W + " " + H);
    var colors = { compute: "#84adea", data: "#f4b860", transfer: "#c4a5ec", other: "#d0d5dd" };
    (an.categories || []).forEach(function (c) {
      var w = c.share * (W - 2);
      var r = sv("rect", { x: x + 1, y: 2, width: Math.max(w, 0.5), height: 22, fill: colors[c.category] || "#9bd3a8", "class": "category", "data-category": c.category, "data-share": c.share });
      r.appendChild(sv("title", {}, c.category + ": " + fmtNS(c.total_ns) + " (" + fmtShare(c.share) + ", " + c.spans + " names)"));
      cs.appendChild(r);
      if (w > 70) cs.appendChild(sv("text", { "class": "label", x: x + 5, y: 17 }, c.category + " " + fmtShare(c.share)));
      x += w;
    });
    cs.appendChild(sv("text", { "class": "tick", x: 2, y: 40 }, "of " + fmtNS(an.categorized_ns) + " categorized span time"));

    // Distributions: the 30 largest names by total, on one log axis.
    var rows = (A.spans || []).slice(0, 30), ds = $("aggregate-dist");
    var lo = Infinity, hi = 1;
    rows.forEach(function (r) { if (r.count) { lo = Math.min(lo, Math.max(r.min_ns, 1)); hi = Math.max(hi, r.max_ns); } });
    if (!isFinite(lo)) lo = 1;
    if (hi <= lo) hi = lo * 10;
    var L = 240, RW = 20, DH = rows.length * RW + 30;
    ds.setAttribute("width", W); ds.setAttribute("height", DH); ds.setAttribute("viewBox", "0 0 " + W + " " + DH);
    function X(v) { return L + (Math.log10(Math.max(v, lo)) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo)) * (W - L - 20); }
    for (var e = Math.ceil(Math.log10(lo)); e <= Math.floor(Math.log10(hi)); e++) {
      var gx = X(Math.pow(10, e));
      ds.appendChild(sv("line", { "class": "grid", x1: gx, x2: gx, y1: 14, y2: DH }));
      ds.appendChild(sv("text", { "class": "tick", x: gx + 2, y: 11 }, fmtNS(Math.pow(10, e))));
    }
    rows.forEach(function (r, i) {
      var y = 18 + i * RW, g = sv("g", { "class": "dist", "data-name": r.name, "data-p50": r.p50_ns, "data-p99": r.p99_ns });
      var label = r.name + (r.step ? " [" + r.step + "]" : "");
      g.appendChild(sv("text", { "class": "lane-label", x: 4, y: y + 12 }, label.length > 36 ? label.slice(0, 35) + "…" : label));
      if (r.count) {
        g.appendChild(sv("line", { x1: X(r.min_ns), x2: X(r.max_ns), y1: y + 8, y2: y + 8, stroke: "#667085" }));
        g.appendChild(sv("rect", { x: X(r.p50_ns), y: y + 2, width: Math.max(X(r.p95_ns) - X(r.p50_ns), 1.5), height: 12, fill: colors[r.category] || "#9bd3a8", stroke: "#3b6fc4", "stroke-width": 0.6 }));
        g.appendChild(sv("line", { x1: X(r.p99_ns), x2: X(r.p99_ns), y1: y, y2: y + 16, stroke: "#b42318", "stroke-width": 1.5 }));
        var t = sv("title", {}, label + ": p50 " + fmtNS(r.p50_ns) + ", p95 " + fmtNS(r.p95_ns) + ", p99 " + fmtNS(r.p99_ns) + ", min " + fmtNS(r.min_ns) + ", max " + fmtNS(r.max_ns) + ", " + r.count + " times");
        g.appendChild(t);
      }
      ds.appendChild(g);
    });

    var spans = A.spans || [];
    table($("aggregate-spans"), ["name", "step", "category", "count", "total", "share", "mean", "p50", "p95", "p99", "max"], spans.map(function (r) {
      return [r.name, r.step || "-", r.category + (r.category_source !== "default" ? " (" + r.category_source + ")" : ""), r.count, fmtNS(r.total_ns), r.category === "ignore" ? "-" : fmtShare(r.share), fmtNS(r.mean_ns), fmtNS(r.p50_ns), fmtNS(r.p95_ns), fmtNS(r.p99_ns), fmtNS(r.max_ns)];
    }));
    // The triggers that fired (candle_trace.torch.watch's trigger/<name>
    // scalars), their own section only when there are any.
    var tg = A.triggers || [], fd = A.fired || [];
    if (tg.length || fd.length) {
      var tb = $("aggregate-triggers-box");
      tb.innerHTML = '<h3 id="aggregate-triggers-title">Triggers that fired</h3>' +
        (fd.length ? '<table id="aggregate-firings" class="stats"></table>' +
          (A.fired_refused ? '<p class="note">' + A.fired_refused + ' more fired past the summary\'s cap, not listed.</p>' : '') : '') +
        '<table id="aggregate-triggers" class="stats"></table>' +
        '<p class="note">From the watch\'s trigger/&lt;name&gt; scalars: each value is what the trigger measured (an update\'s seconds for slow, the loss for non_finite); a non-finite value is counted, not folded.</p>';
      if (fd.length) {
        // each firing: the update, the trigger, its value against its threshold, and its trace
        table($("aggregate-firings"), ["update", "trigger", "value", "detail", "trace"], fd.map(function (f) {
          return [f.update, f.trigger, f.shown, f.detail || "-", f.trace || "none: " + f.no_trace];
        }), function (i) { return !fd[i].trace; });
      }
      table($("aggregate-triggers"), ["trigger", "fired", "mean", "min", "max", "last", "non-finite"], tg.map(function (x) {
        return x.values ? [x.name, x.fired, fmtNum(x.mean), fmtNum(x.min), fmtNum(x.max), fmtNum(x.last), x.non_finite] : [x.name, x.fired, "-", "-", "-", "-", x.non_finite];
      }), function (i) { return tg[i].non_finite > 0; });
      $("aggregate-triggers").setAttribute("data-fired", tg.reduce(function (n, x) { return n + x.fired; }, 0));
    }
    var sc = A.scalars || [];
    table($("aggregate-scalars"), ["label", "count", "mean", "min", "max", "last", "non-finite"], sc.map(function (x) {
      return [x.label, x.count, fmtNum(x.mean), fmtNum(x.min), fmtNum(x.max), fmtNum(x.last), x.non_finite];
    }), function (i) { return sc[i].non_finite > 0; });
    var ov = A.overflow || {}, dr = A.dropped || {}, notes = [];
    if (ov.keys_refused) notes.push(ov.keys_refused + " span keys refused past " + ov.max_keys);
    if (ov.scalars_refused) notes.push(ov.scalars_refused + " scalar labels refused past " + ov.max_scalars);
    if (dr.invalid_key || dr.producer) notes.push((dr.invalid_key || 0) + " invalid keys and " + (dr.producer || 0) + " producer records dropped");
    $("aggregate-limits").textContent = notes.length ? "Not counted: " + notes.join("; ") + "." : "Every span and scalar of the run was counted.";
  }

  // ---- draw ------------------------------------------------------------------

  if (D.aggregate) {
    document.title = "candle-trace view: " + D.name;
    $("title").textContent = D.name + (D.aggregate.run && D.aggregate.run.entrypoint ? " — " + D.aggregate.run.entrypoint + " (whole run)" : "");
    nav([["aggregate", "Whole run"], ["aggregate-spans", "Spans"]].concat((D.aggregate.triggers || []).length ? [["aggregate-triggers-title", "Triggers"]] : []).concat([["aggregate-scalars", "Scalars"]]));
    aggregatePage(D.aggregate);
  } else if (D.comparison) {
    document.title = "candle-trace view: " + D.a.name + " vs " + D.b.name;
    $("title").textContent = "B: " + D.b.name + " against A: " + D.a.name;
    nav([["compare", "B against A"], ["a-overview", "A"], ["a-timeline", "A timeline"], ["b-overview", "B"], ["b-timeline", "B timeline"]]);
    comparePage(D.comparison, D.a, D.b);
    tracePage(D.a, "a-", "A");
    tracePage(D.b, "b-", "B");
  } else {
    document.title = "candle-trace view: " + D.name;
    $("title").textContent = D.name + (D.meta && D.meta.entrypoint ? " — " + D.meta.entrypoint : "");
    nav([["overview", "Overview"], ["timeline", "Timeline"], ["graph", "Graph"], ["memory", "Memory"], ["gradients", "Gradients"], ["tensor-stats", "Tensor stats"]]);
    tracePage(D, "", "");
  }
  // How long parsing the data and drawing every view took, for the record.
  document.documentElement.setAttribute("data-render-ms", Math.round(performance.now() - started));
  document.documentElement.setAttribute("data-rendered", "ok");
})();
