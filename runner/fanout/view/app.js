"use strict";
// fanout's run viewer.  Every value from the run reaches the page through textContent,
// setAttribute or createTextNode, never as markup.  The table is rendered PAGE rows at a
// time (more on scroll); the timeline and the histograms after the table is shown.
(function () {
  var PAGE = 500;
  var SVGNS = "http:" + "//www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("fanout-data").textContent);
  var view = { sort: "", desc: false, shown: PAGE, rows: [] };
  var served = location.protocol === "http:" || location.protocol === "https:";

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    for (var key in attrs || {}) node.setAttribute(key, attrs[key]);
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function svg(tag, attrs) {
    var node = document.createElementNS(SVGNS, tag);
    for (var key in attrs || {}) node.setAttribute(key, attrs[key]);
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
  function secs(s) {
    if (s === null || s === undefined) return "-";
    if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + "s";
    if (s < 3600) return Math.floor(s / 60) + "m" + Math.round(s % 60) + "s";
    return Math.floor(s / 3600) + "h" + Math.round((s % 3600) / 60) + "m";
  }
  function usd(v) { return v === null || v === undefined ? "-" : "$" + v.toFixed(v < 1 ? 4 : 2); }
  function key(name) { return data.unitKeys.indexOf(name); }

  function summary() {
    var s = data.summary, box = clear(document.getElementById("summary"));
    document.getElementById("title").textContent = "fanout: " + s.job + " (run " + s.run + ")";
    function fact(label, value, count) {
      var f = el("div", { "class": "fact" });
      f.appendChild(el("span", { "class": "label" }, label));
      var v = el("span", { "class": "value" }, value);
      if (count !== undefined) v.setAttribute("data-count", count);
      f.appendChild(v);
      box.appendChild(f);
    }
    var total = 0;
    for (var state in s.totals) total += s.totals[state];
    fact("units", total, "units");
    for (state in s.totals) fact(state, s.totals[state], state);
    fact("run", s.state);
    fact("rounds", s.rounds.length);
    fact("wall time", secs(s.wallSeconds));
    fact("worker time", secs(s.workerSeconds));
    fact("speed-up", s.speedup === null ? "n/a" : s.speedup + "x");
    var input = 0, output = 0;
    (s.apis || []).forEach(function (a) { input += a.inputTokens || 0; output += a.outputTokens || 0; });
    fact("tokens in / out", input + " / " + output);
    fact("spend", usd(data.spend));
    fact("budget per unit", data.budget === null ? "none" : usd(data.budget));
    if (s.note) box.appendChild(el("p", { "class": "note" }, s.note));
  }

  function options(select, values) {
    var keep = select.value;
    clear(select).appendChild(el("option", { value: "" }, "all"));
    values.forEach(function (v) { select.appendChild(el("option", { value: String(v) }, v)); });
    select.value = values.map(String).indexOf(keep) >= 0 ? keep : "";
  }
  function distinct(name) {
    var i = key(name), seen = {};
    data.units.forEach(function (u) { seen[u[i]] = true; });
    return Object.keys(seen).sort();
  }
  var FILTERS = ["state", "rung", "host", "round"];
  function controls() {
    FILTERS.forEach(function (name) { options(document.getElementById("filter-" + name), distinct(name)); });
  }
  function matches(u) {
    for (var f = 0; f < FILTERS.length; f++) {
      var want = document.getElementById("filter-" + FILTERS[f]).value;
      if (want !== "" && String(u[key(FILTERS[f])]) !== want) return false;
    }
    var q = document.getElementById("search").value.toLowerCase();
    if (!q) return true;
    return String(u[0]).toLowerCase().indexOf(q) >= 0 || String(u[key("reason")]).toLowerCase().indexOf(q) >= 0;
  }
  function sorted() {
    var rows = data.units.slice();
    if (view.sort) {
      var i = key(view.sort), sign = view.desc ? -1 : 1;
      rows.sort(function (a, b) {
        var x = a[i], y = b[i];
        if (x === y) return 0;
        if (x === null) return 1;
        if (y === null) return -1;
        return (x < y ? -1 : 1) * sign;
      });
    }
    return rows;
  }
  function row(u) {
    var tr = el("tr", {
      "data-unit": u[0], "data-state": u[key("state")], "data-rung": u[key("rung")],
      "data-host": u[key("host")], "data-round": String(u[key("round")])
    });
    var link = el("a", { "class": "unit-link", href: "#unit=" + encodeURIComponent(u[0]) }, u[0]);
    tr.appendChild(el("td", { "class": "id" })).appendChild(link);
    tr.appendChild(el("td", {}, u[key("state")]));
    tr.appendChild(el("td", {}, u[key("rung")]));
    tr.appendChild(el("td", {}, u[key("host")]));
    tr.appendChild(el("td", { "class": "num" }, u[key("round")]));
    tr.appendChild(el("td", { "class": "num" }, u[key("attempts")]));
    tr.appendChild(el("td", { "class": "num" }, secs(u[key("seconds")])));
    tr.appendChild(el("td", { "class": "num" }, usd(u[key("cost")])));
    tr.appendChild(el("td", { "class": "reason" }, u[key("reason")]));
    if (!matches(u)) tr.hidden = true;
    return tr;
  }
  // Appends rows until view.shown of them match (or none are left): filtered-out rows
  // among the rendered ones stay in the table, hidden.
  function fill() {
    var body = document.querySelector("table#units tbody"), visible = 0, i;
    for (i = 0; i < body.children.length; i++) if (!body.children[i].hidden) visible++;
    var frag = document.createDocumentFragment(), at = body.children.length;
    while (visible < view.shown && at < view.rows.length) {
      var tr = row(view.rows[at++]);
      if (!tr.hidden) visible++;
      frag.appendChild(tr);
    }
    body.appendChild(frag);
    var left = view.rows.length - body.children.length;
    document.getElementById("more").textContent = left > 0 ? left + " more unit(s) below: scroll to show them" : "";
  }
  function table() {
    view.rows = sorted();
    clear(document.querySelector("table#units tbody"));
    fill();
  }
  function refilter() {
    var body = document.querySelector("table#units tbody");
    var byId = {};
    view.rows.forEach(function (u) { byId[u[0]] = u; });
    for (var i = 0; i < body.children.length; i++) {
      var tr = body.children[i];
      tr.hidden = !matches(byId[tr.getAttribute("data-unit")]);
    }
    view.shown = PAGE;
    fill();
  }

  function dl(box, cls, label, value, pre) {
    box.appendChild(el("dt", {}, label));
    var dd = box.appendChild(el("dd", { "class": cls }));
    if (pre) dd.appendChild(el("pre", {}, value)); else dd.textContent = String(value);
    return dd;
  }
  function transcript(box, turns) {
    var t = box.appendChild(el("div", { "class": "transcript" }));
    if (!turns.length) t.appendChild(el("p", { "class": "note" }, "no transcript in this attempt's log"));
    turns.forEach(function (turn) {
      var d = t.appendChild(el("div", { "class": "turn" }));
      var tokens = [];
      if (turn.input_tokens !== null && turn.input_tokens !== undefined) tokens.push(turn.input_tokens + " in");
      if (turn.output_tokens !== null && turn.output_tokens !== undefined) tokens.push(turn.output_tokens + " out");
      if (turn.cost_usd !== null && turn.cost_usd !== undefined) tokens.push(usd(turn.cost_usd));
      d.appendChild(el("strong", {}, turn.role || ""));
      if (tokens.length) d.appendChild(el("span", { "class": "note" }, " " + tokens.join(", ")));
      if (turn.text) d.appendChild(el("pre", {}, turn.text));
      (turn.tool_calls || []).forEach(function (call) {
        var c = d.appendChild(el("div", { "class": "tool-call" }));
        c.appendChild(el("div", { "class": "tool-name" }, call.name));
        c.appendChild(el("pre", { "class": "tool-input" }, call.input));
        c.appendChild(el("pre", { "class": "tool-result" }, call.result));
      });
    });
  }
  function unitPage(id) {
    var section = clear(document.getElementById("unit"));
    section.setAttribute("data-unit", id);
    section.appendChild(el("a", { href: "#" }, "back to the units"));
    section.appendChild(el("h2", {}, "unit " + id));
    var detail = data.details[id];
    var ak = data.attemptKeys, rows = data.attempts.filter(function (a) { return a[0] === id; });
    var round = rows.reduce(function (m, a) { return Math.max(m, a[1]); }, 0);
    var attempts = detail ? detail.attempts : rows.filter(function (a) { return a[1] === round; }).map(function (a) {
      var o = {};
      ak.forEach(function (k, i) { o[k] = a[i]; });
      o.log = ""; o.argv = []; o.verify = []; o.env = []; o.prompt = ""; o.transcript = [];
      return o;
    });
    if (!detail) section.appendChild(el("p", { "class": "note" },
      "This unit's detail was left out to keep the page small: its logs are in the run's logs/ folder."));
    if (!attempts.length) section.appendChild(el("p", { "class": "note" }, "no attempts (reused, or not started)"));
    attempts.forEach(function (a, index) {
      var box = section.appendChild(el("div", { "class": "attempt", "data-attempt": String(a.n) }));
      box.appendChild(el("h3", {}, "attempt " + a.n + " (round " + a.round + ", rung " + a.rung + ", " + a.host + ")"));
      var d = box.appendChild(el("dl"));
      dl(d, "status", "status", a.status + (a.end && a.start ? ", " + secs(a.end - a.start) : ""));
      dl(d, "exit", "exit status", a.exit === null ? "-" : a.exit);
      dl(d, "kind", "kind", a.kind || "-");
      dl(d, "reason", "reason", a.reason || "-");
      dl(d, "argv", "argv", a.argv.length ? JSON.stringify(a.argv) : "-", true);
      dl(d, "env-names", "environment names", a.env.length ? a.env.join(" ") : "-");
      dl(d, "prompt", "prompt", a.prompt || "-", !!a.prompt);
      if (a.rendered) dl(d, "rendered", "rendered from", a.rendered);
      dl(d, "verify", "verify", a.verify.length ? JSON.stringify(a.verify) + " (its output is in the log)" : "-");
      dl(d, "log", "log (end)" + (a.logPath ? ": " + a.logPath : ""), a.log || "(empty)", true);
      var diff = dl(d, "diff", "diff of collected files", "");
      if (detail && index === attempts.length - 1) {
        detail.diff.files.forEach(function (f) {
          diff.appendChild(el("div", {}, f.path + (f.added === null ? "" : " +" + f.added + " -" + f.removed) + " (" + f.state + ")"));
        });
        if (detail.diff.text) diff.appendChild(el("pre", {}, detail.diff.text + (detail.diff.cut ? "\n[cut]" : "")));
        if (!detail.diff.files.length) diff.textContent = "no files changed";
      } else {
        diff.textContent = "-";
      }
      if (data.agent || (a.transcript && a.transcript.length)) transcript(box, a.transcript || []);
    });
  }

  function lanesOf() {
    var groups = {}, order = [];
    data.attempts.forEach(function (a, i) {
      var id = a[4] + "\u0000" + data.lanes[i];
      if (!groups[id]) { groups[id] = { host: a[4], slot: data.lanes[i], items: [] }; order.push(id); }
      groups[id].items.push(a);
    });
    order.sort(function (x, y) {
      var a = groups[x], b = groups[y];
      return a.host < b.host ? -1 : a.host > b.host ? 1 : a.slot - b.slot;
    });
    return order.map(function (id) { return groups[id]; });
  }
  function timeline() {
    var s = data.summary, box = clear(document.getElementById("timeline-box"));
    var lanes = lanesOf(), H = 14, W = 1000, left = 140;
    var t0 = s.started, t1 = s.finished || Date.now() / 1000;
    data.attempts.forEach(function (a) { if (a[6] !== null && a[6] > t1) t1 = a[6]; });
    var span = Math.max(t1 - t0, 1e-3), x = function (t) { return left + (W - left) * (t - t0) / span; };
    var height = (lanes.length + 1) * H + 20;
    var chart = svg("svg", { id: "timeline", width: W, height: height, viewBox: "0 0 " + W + " " + height });
    var pauses = chart.appendChild(svg("g", { "class": "pauses" }));
    data.pauses.forEach(function (p) {
      var r = svg("rect", { "class": "pause", "data-limit": p[0], x: x(p[1]), y: 0,
        width: Math.max(1, x(p[1] + p[2]) - x(p[1])), height: height - 20 });
      r.appendChild(svg("title")).textContent = "paused " + p[0] + " for " + secs(p[2]) + ": " + p[3];
      pauses.appendChild(r);
    });
    lanes.forEach(function (lane, i) {
      var g = chart.appendChild(svg("g", { "class": "lane", "data-host": lane.host, "data-slot": String(lane.slot) }));
      var label = g.appendChild(svg("text", { x: 2, y: (i + 1) * H - 3 }));
      label.textContent = lane.host + " #" + lane.slot;
      lane.items.forEach(function (a) {
        var end = a[6] === null ? t1 : a[6];
        var r = svg("rect", { "class": "attempt", "data-outcome": a[7], x: x(a[5]), y: i * H + 2,
          width: Math.max(1, x(end) - x(a[5])), height: H - 4 });
        r.appendChild(svg("title")).textContent = a[0] + " #" + a[2] + " " + a[7] + " " + secs(end - a[5]);
        g.appendChild(r);
      });
    });
    var axis = chart.appendChild(svg("text", { x: left, y: height - 4 }));
    axis.textContent = "0 to " + secs(span) + " after the run started";
    box.appendChild(chart);
    data.apis.forEach(function (api) { box.appendChild(apiChart(api)); });
  }
  function apiChart(api) {
    var wrap = el("div", { "class": "api", "data-api": api.api });
    wrap.appendChild(el("h3", {}, "API " + api.api + ": requests per " + secs(api.window)));
    var top = Math.max.apply(null, api.counts.concat([api.learned || 0, api.declared || 0, 1]));
    var W = 1000, H = 120, bw = W / api.counts.length, y = function (v) { return H - 15 - (H - 25) * v / top; };
    var chart = wrap.appendChild(svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H }));
    api.counts.forEach(function (c, i) {
      var r = chart.appendChild(svg("rect", { "class": "bar", x: i * bw, y: y(c), width: Math.max(1, bw - 1), height: H - 15 - y(c) }));
      r.appendChild(svg("title")).textContent = c + " request(s)";
    });
    [["declared", api.declared], ["learned", api.learned]].forEach(function (pair) {
      if (pair[1] === null || pair[1] === undefined) return;
      chart.appendChild(svg("line", { "class": pair[0], x1: 0, x2: W, y1: y(pair[1]), y2: y(pair[1]) }));
      chart.appendChild(svg("text", { x: W - 160, y: y(pair[1]) - 2 })).textContent = pair[0] + " " + pair[1];
    });
    if (api.text) wrap.appendChild(el("p", { "class": "note" }, api.text));
    return wrap;
  }
  function histogram(title, values, format) {
    var wrap = el("div", { "class": "hist" });
    wrap.appendChild(el("div", {}, title + " (" + values.length + ")"));
    var W = 300, H = 100, bins = 20, lo = Math.min.apply(null, values), hi = Math.max.apply(null, values);
    var width = (hi - lo) / bins || 1, counts = [];
    for (var b = 0; b < bins; b++) counts.push(0);
    values.forEach(function (v) { counts[Math.min(bins - 1, Math.floor((v - lo) / width))]++; });
    var top = Math.max.apply(null, counts);
    var chart = wrap.appendChild(svg("svg", { width: W, height: H + 14, viewBox: "0 0 " + W + " " + (H + 14) }));
    counts.forEach(function (c, i) {
      var h = H * c / top;
      var r = chart.appendChild(svg("rect", { "class": "bar", x: i * W / bins, y: H - h, width: W / bins - 1, height: h }));
      r.appendChild(svg("title")).textContent = c + " unit(s) from " + format(lo + i * width) + " to " + format(lo + (i + 1) * width);
    });
    chart.appendChild(svg("text", { x: 0, y: H + 12 })).textContent = format(lo);
    chart.appendChild(svg("text", { x: W - 60, y: H + 12 })).textContent = format(hi);
    return wrap;
  }
  function distributions() {
    var box = clear(document.getElementById("distributions")), rungs = {};
    var r = key("rung"), d = key("seconds"), c = key("cost");
    data.units.forEach(function (u) { (rungs[u[r]] = rungs[u[r]] || []).push(u); });
    Object.keys(rungs).sort().forEach(function (rung) {
      var part = box.appendChild(el("div", { "class": "rung", "data-rung": rung }));
      part.appendChild(el("h3", {}, "rung " + (rung || "(none)")));
      part.appendChild(histogram("duration per unit", rungs[rung].map(function (u) { return u[d]; }), secs));
      var costs = rungs[rung].filter(function (u) { return u[c] !== null; }).map(function (u) { return u[c]; });
      if (costs.length) part.appendChild(histogram("cost per unit", costs, usd));
    });
  }

  function route() {
    var m = /^#unit=(.*)$/.exec(location.hash);
    var unit = document.getElementById("unit"), main = document.getElementById("overview");
    if (m) { unitPage(decodeURIComponent(m[1])); unit.hidden = false; main.hidden = true; }
    else { unit.hidden = true; main.hidden = false; }
  }
  function render() {
    summary();
    controls();
    table();
    route();
    setTimeout(function () { timeline(); distributions(); }, 0);
  }

  FILTERS.forEach(function (name) { document.getElementById("filter-" + name).addEventListener("change", refilter); });
  document.getElementById("search").addEventListener("input", refilter);
  document.querySelectorAll("th[data-sort]").forEach(function (th) {
    th.addEventListener("click", function () {
      var name = th.getAttribute("data-sort");
      view.desc = view.sort === name ? !view.desc : false;
      view.sort = name;
      document.querySelectorAll("th[data-sort]").forEach(function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(view.desc ? "desc" : "asc");
      view.shown = PAGE;
      table();
    });
  });
  window.addEventListener("scroll", function () {
    if (window.innerHeight + window.scrollY >= document.body.offsetHeight - 800) { view.shown += PAGE; fill(); }
  });
  window.addEventListener("hashchange", route);
  render();

  // Served (fanout view --serve): follow a run in progress until it ends.
  if (served) {
    var poll = function () {
      if (data.summary.state !== "running") return;
      fetch("data.json", { cache: "no-store" }).then(function (r) { return r.json(); }).then(function (fresh) {
        data = fresh;
        render();
      }).catch(function () {}).then(function () { setTimeout(poll, 2000); });
    };
    setTimeout(poll, 2000);
  }
})();
