/* agentpark dashboard: reads the daemon's JSON and draws SVG charts; no libraries. */
(function () {
  "use strict";

  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = ["#0b7a75", "#d9480f", "#5f3dc4", "#1971c2", "#e8590c", "#2b8a3e", "#c2255c", "#495057"];
  var STATE_COLORS = {
    active: "#1971c2", parked: "#0b7a75", lost: "#c53030", pausing: "#e8590c",
    resuming: "#5f3dc4", recomputing: "#c2255c"
  };
  var state = { refreshS: 5, timer: null, refreshes: 0, hosts: null };
  // The bearer token the data calls send: kept in this tab's sessionStorage only, typed
  // into the token field or given once as #token=... (a fragment never reaches a server).
  var TOKEN_KEY = "agentpark-token";

  // ---- formatting --------------------------------------------------------------------

  function fmtBytes(n) {
    if (n === null || n === undefined || isNaN(n)) return "–";
    var units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    var v = Math.abs(n), i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    var sign = n < 0 ? "-" : "";
    return sign + (i === 0 ? v.toFixed(0) : v.toFixed(v >= 100 ? 0 : 1)) + " " + units[i];
  }
  function fmtRate(n) {
    if (n === null || n === undefined || isNaN(n)) return "–";
    var units = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
    var v = n, i = 0;
    while (v >= 1000 && i < units.length - 1) { v /= 1000; i += 1; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(v >= 100 ? 0 : 2)) + " " + units[i];
  }
  function fmtMs(n) {
    if (n === null || n === undefined || isNaN(n)) return "–";
    if (n >= 1000) return (n / 1000).toFixed(2) + " s";
    if (n >= 10) return n.toFixed(0) + " ms";
    return n.toFixed(n >= 1 ? 1 : 2) + " ms";
  }
  function fmtCount(n) {
    if (n === null || n === undefined || isNaN(n)) return "–";
    return Number.isInteger(n) ? String(n) : n.toFixed(1);
  }
  function fmtDuration(s) {
    if (s === null || s === undefined || isNaN(s)) return "–";
    var round = function (v) { return Number.isInteger(v) ? String(v) : v.toFixed(1); };
    if (s < 60) return s.toFixed(0) + " s";
    if (s < 3600) return (s / 60).toFixed(0) + " min";
    if (s < 86400) return round(s / 3600) + " h";
    return round(s / 86400) + " d";
  }
  function fmtTime(t, span) {
    var d = new Date(t * 1000);
    var pad = function (x) { return (x < 10 ? "0" : "") + x; };
    var hm = pad(d.getHours()) + ":" + pad(d.getMinutes());
    if (span > 2 * 86400) return (d.getMonth() + 1) + "/" + d.getDate() + " " + hm;
    if (span <= 1200) return hm + ":" + pad(d.getSeconds());
    return hm;
  }
  var FORMATS = { bytes: fmtBytes, rate: fmtRate, ms: fmtMs, count: fmtCount };

  function lookup(obj, path) {
    var parts = path.split(".");
    for (var i = 0; i < parts.length; i += 1) {
      if (obj === null || obj === undefined) return undefined;
      obj = obj[parts[i]];
    }
    return obj;
  }

  // ---- DOM helpers -------------------------------------------------------------------

  function svg(tag, attrs, parent) {
    var node = document.createElementNS(SVG, tag);
    for (var k in attrs) if (Object.prototype.hasOwnProperty.call(attrs, k)) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function html(tag, attrs, text, parent) {
    var node = document.createElement(tag);
    for (var k in attrs) if (Object.prototype.hasOwnProperty.call(attrs, k)) node.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  // ---- charts ------------------------------------------------------------------------

  /* The top of the y axis: four ticks of a round size (powers of two for bytes). */
  function niceMax(v, binary) {
    if (!(v > 0)) return binary ? 1024 : 1;
    var tick = v / 4, base, steps;
    if (binary) {
      base = Math.pow(1024, Math.max(0, Math.floor(Math.log(tick) / Math.log(1024))));
      steps = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];
    } else {
      base = Math.pow(10, Math.floor(Math.log10(tick)));
      steps = [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10];
    }
    for (var i = 0; i < steps.length; i += 1) if (steps[i] * base >= tick) return 4 * steps[i] * base;
    return 4 * steps[steps.length - 1] * base;
  }

  /* series: [{name, color, dash, points: [[t, v], ...], down}], opts: {x0, x1, format, gap} */
  function lineChart(id, series, opts) {
    var box = document.getElementById(id);
    box.textContent = "";
    var W = Math.max(320, Math.round(box.clientWidth || 600)), H = 210;
    var m = { l: 68, r: 12, t: 10, b: 24 };
    var root = svg("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, "data-chart": id, role: "img" }, box);
    var x0 = opts.x0, x1 = opts.x1, span = Math.max(1e-9, x1 - x0);
    var ymax = 0, total = 0;
    series.forEach(function (s) {
      s.points.forEach(function (p) { if (p[1] > ymax) ymax = p[1]; });
      total += s.points.length;
    });
    ymax = niceMax(ymax, opts.format === fmtBytes);
    var sx = function (t) { return m.l + (t - x0) / span * (W - m.l - m.r); };
    var sy = function (v) { return H - m.b - v / ymax * (H - m.t - m.b); };
    var grid = svg("g", { "class": "grid" }, root), axis = svg("g", { "class": "axis" }, root);
    for (var i = 0; i <= 4; i += 1) {
      var v = ymax * i / 4, y = sy(v);
      svg("line", { x1: m.l, x2: W - m.r, y1: y, y2: y }, grid);
      svg("text", { x: m.l - 6, y: y + 4, "text-anchor": "end" }, axis).textContent = opts.format(v);
    }
    for (var j = 0; j <= 5; j += 1) {
      var t = x0 + span * j / 5;
      svg("text", { x: sx(t), y: H - 6, "text-anchor": j === 0 ? "start" : (j === 5 ? "end" : "middle") }, axis)
        .textContent = fmtTime(t, span);
    }
    root.setAttribute("data-points", String(total));
    if (!total) {
      svg("text", { x: (W + m.l) / 2, y: H / 2, "text-anchor": "middle", "class": "empty" }, root)
        .textContent = opts.empty || "no samples in this range yet";
    }
    var layer = svg("g", { "class": "series" }, root);
    series.forEach(function (s) {
      var d = "", prev = null;
      s.points.forEach(function (p) {
        var jump = prev === null || (opts.gap && p[0] - prev > opts.gap);
        d += (jump ? "M" : "L") + sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1);
        prev = p[0];
      });
      var path = svg("path", { d: d || "M0,0", stroke: s.color, "data-series": s.name, "data-points": String(s.points.length) }, layer);
      if (s.dash) path.setAttribute("stroke-dasharray", "5 4");
      if (s.points.length <= 60) {
        s.points.forEach(function (p) { svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.2, fill: s.color }, layer); });
      }
    });
    var legend = html("div", { "class": "legend" }, null, box);
    var values = series.map(function (s) {
      var item = html("span", { "data-series": s.name }, null, legend);
      var sw = html("span", { "class": "swatch" }, null, item);
      sw.style.background = s.color;
      html("span", { "class": s.down ? "down" : "" }, s.name, item);
      return html("span", { "class": "value" }, null, item);
    });
    function show(index) {
      series.forEach(function (s, k) {
        if (s.down) { values[k].textContent = "down"; return; }
        var p = index === null ? s.points[s.points.length - 1] : nearest(s.points, index);
        values[k].textContent = p ? opts.format(p[1]) : "–";
      });
    }
    show(null);
    var cursor = svg("line", { "class": "cursor", y1: m.t, y2: H - m.b, x1: m.l, x2: m.l, visibility: "hidden" }, root);
    root.addEventListener("mousemove", function (ev) {
      var rect = root.getBoundingClientRect();
      var x = (ev.clientX - rect.left) / rect.width * W;
      var t = x0 + (x - m.l) / (W - m.l - m.r) * span;
      var inside = x >= m.l && x <= W - m.r;
      cursor.setAttribute("x1", x); cursor.setAttribute("x2", x);
      cursor.setAttribute("visibility", inside ? "visible" : "hidden");
      show(inside ? t : null);
    });
    root.addEventListener("mouseleave", function () {
      cursor.setAttribute("visibility", "hidden");
      show(null);
    });
  }

  function nearest(points, t) {
    var best = null, dist = Infinity;
    points.forEach(function (p) { var d = Math.abs(p[0] - t); if (d < dist) { dist = d; best = p; } });
    return best;
  }

  function pointsOf(samples, get) {
    var out = [];
    samples.forEach(function (s) {
      var v = get(s);
      if (v !== null && v !== undefined && !isNaN(v)) out.push([s.at, v]);
    });
    return out;
  }

  // ---- rendering ---------------------------------------------------------------------

  function renderFigures(sources) {
    document.querySelectorAll("[data-figure]").forEach(function (node) {
      var src = sources[node.getAttribute("data-source")];
      if (!src) return;
      var value = lookup(src, node.getAttribute("data-figure"));
      var fmt = FORMATS[node.getAttribute("data-format") || "count"];
      node.setAttribute("data-value", value === null || value === undefined ? "" : String(value));
      node.textContent = fmt(value === undefined ? null : value);
    });
  }

  // vLLM's pins (null on a daemon without vLLM: the card stays hidden).
  function renderPins(host) {
    var pins = host.pins;
    document.getElementById("pins-card").hidden = !pins;
    if (!pins) return;
    var released = Object.keys(pins.released).sort().map(function (cause) {
      return pins.released[cause] + " " + cause;
    });
    document.getElementById("pins-released").textContent = released.join(", ") || "none";
    var byParks = Math.max(0, host.counters.prefill_tokens_avoided - pins.tokens_saved);
    document.getElementById("pins-parks").textContent = String(byParks) + " tokens";
    var ends = ["pinned", "parked", "dropped", "kept"].map(function (answer) {
      return (pins.turn_ends[answer] || 0) + " " + answer;
    });
    document.getElementById("pins-turn-ends").textContent = ends.join(", ");
  }

  function renderHost(host, history) {
    document.getElementById("host-name").textContent = history ? history.host : "";
    var ready = document.getElementById("ready");
    ready.textContent = host.draining ? "draining" : (host.ready ? "ready" : "warming up");
    ready.className = "badge " + (host.ready && !host.draining ? "ready" : "warming");
    // A share of all sessions' KV (in the pool or parked), so never above 100%: parked
    // copies in host tiers can outgrow the pool many times over.
    var held = host.reclaimed_bytes + host.pool.used_bytes;
    document.getElementById("reclaimed-share").textContent =
      held ? (100 * host.reclaimed_bytes / held).toFixed(1) + "%" : "–";
    var oldest = host.oldest_parked_s;
    document.getElementById("oldest-parked").textContent =
      oldest === null || oldest === undefined ? "–" : Math.round(oldest) + " s";
    var degraded = host.degraded;
    var slow = degraded ? (degraded.slow || 0) + (degraded.timeout || 0) : null;
    var other = 0;
    if (degraded) Object.keys(degraded).forEach(function (k) { other += degraded[k]; });
    document.getElementById("degraded-slow").textContent = degraded ? String(slow) : "–";
    document.getElementById("degraded-other").textContent = degraded ? String(other - slow) : "–";
    renderPins(host);
    var tiers = document.getElementById("tiers");
    tiers.textContent = "";
    Object.keys(host.tiers).forEach(function (name) {
      var t = host.tiers[name];
      var share = t.capacity_bytes ? t.used_bytes / t.capacity_bytes : 0;
      var row = html("div", { "class": "tier", "data-tier": name }, null, tiers);
      var head = html("div", { "class": "tier-head" }, null, row);
      html("strong", {}, name + (t.persistent ? " (persistent)" : ""), head);
      var figs = html("span", {}, null, head);
      html("span", { "data-figure": "tiers." + name + ".used_bytes", "data-source": "host", "data-format": "bytes" }, null, figs);
      figs.appendChild(document.createTextNode(" of "));
      html("span", { "data-figure": "tiers." + name + ".capacity_bytes", "data-source": "host", "data-format": "bytes" }, null, figs);
      figs.appendChild(document.createTextNode(" (" + (100 * share).toFixed(1) + "%)"));
      var bar = html("div", { "class": "bar" }, null, row);
      var fill = html("div", { "class": "fill" + (share >= 0.95 ? " full" : share >= 0.8 ? " high" : "") }, null, bar);
      fill.style.width = (100 * Math.min(1, share)).toFixed(2) + "%";
    });
    if (!Object.keys(host.tiers).length) html("div", { "class": "muted" }, "no host tier enabled", tiers);
  }

  function renderHistory(history) {
    var samples = history.samples, x0 = history.since, x1 = history.until;
    var gap = Math.max(history.step_s, history.interval_s) * 2.5;
    var fmtN = function (v) { return fmtCount(Math.round(v * 10) / 10); };
    lineChart("chart-hbm", [
      { name: "HBM used", color: "#1971c2", points: pointsOf(samples, function (s) { return s.pool_used_bytes; }) },
      { name: "HBM reclaimed", color: "#0b7a75", points: pointsOf(samples, function (s) { return s.reclaimed_bytes; }) },
      { name: "pool size", color: "#adb5bd", dash: true, points: pointsOf(samples, function (s) { return s.pool_total_bytes; }) }
    ], { x0: x0, x1: x1, format: fmtBytes, gap: gap });
    var states = {};
    samples.forEach(function (s) { Object.keys(s.sessions).forEach(function (k) { if (s.sessions[k] > 0) states[k] = true; }); });
    ["active", "parked"].forEach(function (k) { states[k] = true; });
    lineChart("chart-sessions", Object.keys(states).sort().map(function (k, i) {
      return {
        name: k, color: STATE_COLORS[k] || COLORS[i % COLORS.length],
        points: pointsOf(samples, function (s) { return s.sessions[k] || 0; })
      };
    }), { x0: x0, x1: x1, format: fmtN, gap: gap });
    lineChart("chart-latency", [
      { name: "pause p50", color: "#0b7a75", points: pointsOf(samples, function (s) { return s.pause_p50_ms; }) },
      { name: "pause p99", color: "#0b7a75", dash: true, points: pointsOf(samples, function (s) { return s.pause_p99_ms; }) },
      { name: "resume p50", color: "#d9480f", points: pointsOf(samples, function (s) { return s.resume_p50_ms; }) },
      { name: "resume p99", color: "#d9480f", dash: true, points: pointsOf(samples, function (s) { return s.resume_p99_ms; }) }
    ], { x0: x0, x1: x1, format: fmtMs, empty: "no pauses or resumes in this range" });
    lineChart("chart-bandwidth", [
      { name: "park (to host)", color: "#0b7a75", points: pointsOf(samples, function (s) { return s.park_bytes_per_s; }) },
      { name: "restore (to pool)", color: "#d9480f", points: pointsOf(samples, function (s) { return s.restore_bytes_per_s; }) }
    ], { x0: x0, x1: x1, format: fmtRate, empty: "no copies in this range" });
  }

  function renderParked(parked, now) {
    var body = document.querySelector("#parked tbody");
    body.textContent = "";
    document.getElementById("parked-total").textContent =
      parked.count ? "(" + parked.count + " parked, " + fmtBytes(parked.bytes) + ")" : "";
    if (!parked.sessions.length) {
      var empty = html("tr", {}, null, body);
      html("td", { colspan: "7", "class": "empty" }, "no parked sessions", empty);
      return;
    }
    parked.sessions.forEach(function (s) {
      var tr = html("tr", { "data-session": s.tenant + "/" + s.session_id, "data-kv-bytes": String(s.kv_bytes) }, null, body);
      html("td", { title: s.tenant }, s.tenant, tr);
      html("td", { title: s.session_id }, s.session_id, tr);
      html("td", {}, s.tier || "–", tr);
      html("td", { "class": "num" }, fmtBytes(s.kv_bytes), tr);
      html("td", { "class": "num" }, String(s.num_tokens), tr);
      html("td", { "class": "num" }, s.paused_at ? fmtDuration(Math.max(0, now - s.paused_at)) : "–", tr);
      html("td", { title: s.tool || "" }, s.tool || "–", tr);
    });
  }

  function renderPeers(peers, history) {
    var body = document.querySelector("#hosts tbody");
    body.textContent = "";
    var series = [];
    peers.hosts.forEach(function (h, i) {
      var label = h.self ? h.name + " (this host)" : h.name;
      var tr = html("tr", {
        "data-host": h.name, "data-host-url": h.url || "", "data-up": h.up ? "true" : "false",
        "class": h.up ? "" : "down"
      }, null, body);
      html("td", { title: h.url || "" }, label, tr);
      var status = html("td", {}, null, tr);
      html("span", { "class": "badge " + (h.up ? "up" : "down"), title: h.error || "" }, h.up ? "up" : "down", status);
      if (h.up && h.host) {
        html("td", { "class": "num", "data-value": String(h.host.reclaimed_bytes) }, fmtBytes(h.host.reclaimed_bytes), tr);
        html("td", { "class": "num" }, fmtBytes(h.host.pool.used_bytes) + " / " + fmtBytes(h.host.pool.total_bytes), tr);
        html("td", { "class": "num" }, String(h.host.sessions.active || 0), tr);
        html("td", { "class": "num" }, String(h.host.sessions.parked || 0), tr);
      } else {
        // Down is not zero: no figures at all, and why.
        var why = (h.error || "no answer").split(":")[0];
        html("td", { colspan: "4", "class": "empty", title: h.error || "" }, "down: " + why, tr);
      }
      series.push({
        name: label, color: COLORS[i % COLORS.length], down: !h.up,
        points: h.up && h.history ? pointsOf(h.history, function (s) { return s.reclaimed_bytes; }) : []
      });
    });
    var gap = Math.max(history.step_s, history.interval_s) * 2.5;
    lineChart("chart-hosts", series, { x0: history.since, x1: history.until, format: fmtBytes, gap: gap });
  }

  // ---- the refresh loop --------------------------------------------------------------

  function range() { return Number(document.getElementById("range").value) || 3600; }

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return state.token || ""; }
  }

  function setToken(value) {
    state.token = value;
    try { sessionStorage.setItem(TOKEN_KEY, value); } catch (e) { /* storage off: memory only */ }
  }

  function takeTokenFromHash() {
    var m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
    if (!m) return;
    setToken(decodeURIComponent(m[1]));
    var rest = location.hash.replace(/(^#|&)token=[^&]*/, "$1").replace(/^#&/, "#").replace(/&$/, "");
    history.replaceState(null, "", location.pathname + location.search + (rest === "#" ? "" : rest));
  }

  function getJSON(path) {
    var headers = { accept: "application/json" };
    var t = token();
    if (t) headers.authorization = "Bearer " + t;
    return fetch(path, { cache: "no-store", headers: headers }).then(function (r) {
      if (r.status === 401 || r.status === 403) {
        var err = new Error(path + ": HTTP " + r.status);
        err.auth = true;
        throw err;
      }
      if (!r.ok) throw new Error(path + ": HTTP " + r.status);
      return r.json();
    });
  }

  function refresh() {
    var r = range();
    var step = Math.max(1, Math.round(r / 300));
    var q = "since=-" + r + "&step=" + step;
    return Promise.all([
      getJSON("/v1/host"),
      getJSON("/v1/host/history?" + q),
      getJSON("/v1/host/latency?window_s=" + r),
      getJSON("/v1/host/parked?limit=10"),
      getJSON("/v1/peers?" + q)
    ]).then(function (got) {
      var host = got[0], history = got[1], latency = got[2], parked = got[3], peers = got[4];
      state.refreshS = history.refresh_s || state.refreshS;
      renderHost(host, history);
      renderFigures({ host: host, latency: latency });
      document.querySelectorAll(".window").forEach(function (n) { n.textContent = "last " + fmtDuration(r); });
      renderHistory(history);
      renderParked(parked, history.now);
      renderPeers(peers, history);
      document.getElementById("banner").hidden = true;
      document.getElementById("updated").textContent =
        "updated " + fmtTime(history.now, 0) + ", every " + state.refreshS + " s";
      state.refreshes += 1;
      document.body.setAttribute("data-state", "ready");
      document.body.setAttribute("data-refreshes", String(state.refreshes));
    }).catch(function (err) {
      var banner = document.getElementById("banner");
      if (err.auth) {
        banner.textContent = "This daemon needs a token with the operator scope (" + err.message +
          "): enter one above (agentpark token create --tenant NAME --scope operator).";
        document.getElementById("token-form").hidden = false;
        document.body.setAttribute("data-state", "auth");
      } else {
        banner.textContent = "The daemon did not answer (" + err.message + "); showing the last figures.";
        document.body.setAttribute("data-state", "error");
      }
      banner.hidden = false;
    });
  }

  function loop() {
    clearTimeout(state.timer);
    refresh().then(function () { state.timer = setTimeout(loop, state.refreshS * 1000); });
  }

  function start() {
    takeTokenFromHash();
    var form = document.getElementById("token-form");
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      setToken(document.getElementById("token").value.trim());
      document.getElementById("token").value = "";
      form.hidden = true;
      loop();
    });
    var select = document.getElementById("range");
    var m = /range=(\d+)/.exec(location.hash);
    if (m) select.value = m[1];
    select.addEventListener("change", function () { location.hash = "range=" + select.value; loop(); });
    window.addEventListener("resize", function () { loop(); });
    loop();
  }

  start();
})();
