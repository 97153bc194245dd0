// Narabu operators' dashboard. No framework, nothing from a CDN: it asks
// for the admin token once (kept in sessionStorage, never a cookie or the
// URL), follows GET /admin/events with fetch (EventSource cannot send the
// Authorization header), draws its own SVG charts of the last 15 minutes,
// and changes rooms through PATCH /admin/rooms/{room}.
"use strict";

(function () {
  var TOKEN_KEY = "narabu_admin_token";
  var WINDOW_MS = 15 * 60 * 1000;
  var SVG = "http://www.w3.org/2000/svg";
  var rooms = {}; // id -> { body, samples, el, changedAt, seenAfter }
  var controller = null;
  var retryTimer = null;

  function $(id) { return document.getElementById(id); }
  function token() { return sessionStorage.getItem(TOKEN_KEY); }

  function setConn(text, ok) {
    var el = $("conn");
    el.textContent = text;
    el.className = "conn " + (ok ? "ok" : "bad");
  }

  function say(text, bad) {
    var el = $("message");
    el.textContent = text;
    el.className = "message" + (bad ? " bad" : "");
  }

  function showLogin(error) {
    $("login").hidden = false;
    $("signout").hidden = true;
    $("login-error").textContent = error || "";
    $("token").focus();
  }

  function api(method, path, body) {
    var init = { method: method, headers: { Authorization: "Bearer " + token() } };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(path, init).then(function (r) {
      return r.text().then(function (text) {
        var data = null;
        try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
        if (r.status === 401) { forget("The token was refused."); }
        if (!r.ok) {
          throw new Error((data && data.message) || ("HTTP " + r.status));
        }
        return data;
      });
    });
  }

  // ----- the sale's report ------------------------------------------------

  // Bars of several series side by side per group: `groups` are labels,
  // `series` {label, cls, values}; the values' unit is `unit` ("ms" or "").
  function bars(id, title, groups, series, unit) {
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 480 220");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", title);
    svg.setAttribute("id", id);
    var W = 480, H = 220, L = 56, R = 8, T = 10, B = 34;
    var max = 0;
    series.forEach(function (s) { s.values.forEach(function (v) { if (v > max) { max = v; } }); });
    max = unit === "ms" ? niceTimeMax(max || 1) : niceMax(max || 1);
    var y = function (v) { return T + (1 - v / max) * (H - T - B); };
    for (var i = 0; i <= 4; i++) {
      var v = max * i / 4, gy = y(v);
      svg.appendChild(el("line", { x1: L, x2: W - R, y1: gy, y2: gy, class: i === 0 ? "axis" : "grid" }));
      svg.appendChild(el("text", { x: L - 6, y: gy + 4, class: "ylabel" }, unit === "ms" ? fmtMs(v) : fmtNum(Math.round(v))));
    }
    if (!groups.length) {
      svg.appendChild(el("text", { x: W / 2, y: H / 2, class: "empty" }, "no data"));
      return svg;
    }
    var band = (W - L - R) / groups.length, bw = Math.max(2, band * 0.8 / series.length);
    groups.forEach(function (g, gi) {
      series.forEach(function (s, si) {
        var v = s.values[gi] || 0, x = L + gi * band + band * 0.1 + si * bw;
        var rect = el("rect", { x: x, y: y(v), width: bw, height: Math.max(0, y(0) - y(v)), class: "bar " + s.cls });
        rect.appendChild(el("title", {}, s.label + " " + g + ": " + (unit === "ms" ? fmtMs(v) : v)));
        svg.appendChild(rect);
      });
      var every = Math.ceil(groups.length / 8);
      if (gi % every === 0) {
        svg.appendChild(el("text", { x: L + gi * band + band / 2, y: H - 12, class: "xlabel" }, g));
      }
    });
    return svg;
  }

  function figure(title, legend, svg) {
    var keys = h("p", { class: "legend" });
    legend.forEach(function (s) { keys.appendChild(h("span", { class: "key " + s.cls, text: s.label })); });
    return h("figure", { class: "chart" }, [h("figcaption", { text: title }), keys, svg]);
  }

  function spread(s) {
    if (!s || !s.count) { return "–"; }
    return fmtMs(s.p50_ms) + " / " + fmtMs(s.p90_ms) + " / " + fmtMs(s.p99_ms) + " (" + fmtNum(s.count) + ")";
  }

  function showReport(id) {
    var box = $("report-" + id);
    api("GET", "/admin/rooms/" + encodeURIComponent(id) + "/report").then(function (rep) {
      while (box.firstChild) { box.removeChild(box.firstChild); }
      var pct = function (x) { return (100 * x).toFixed(1) + "%"; };
      var rate = rep.rate.observed_per_minute.toFixed(1) + " / min" +
        (rep.rate.configured_per_minute ? " (configured " + rep.rate.configured_per_minute + " / min)" : " (no rate set; capacity " + rep.rate.capacity + ")");
      var rows = [
        ["Joins", fmtNum(rep.joins)],
        ["Admissions", fmtNum(rep.admissions)],
        ["Wait p50 / p90 / p99", spread(rep.waits)],
        ["Time on site p50 / p90 / p99", spread(rep.time_on_site)],
        ["Abandonment (left + abandoned)", pct(rep.endings.abandonment) + " (" + rep.endings.left + " left, " + rep.endings.abandoned + " abandoned)"],
        ["Released / revoked / expired", rep.endings.released + " / " + rep.endings.revoked + " / " + rep.endings.expired],
        ["Away: skipped / returned / admitted after", rep.away.skips + " / " + rep.away.returns + " / " + rep.away.admitted_after_return],
        ["Admission rate", rate],
        ["Out of order (Kendall-tau)", rep.fairness.inversions + " (" + rep.fairness.unexplained + " unexplained)"],
        ["Record", rep.fairness.entries + " entries, head " + rep.fairness.head.slice(0, 16) + "…"]
      ];
      rep.refused.forEach(function (f) { rows.push(["Refused: " + f.reason, fmtNum(f.count)]); });
      rep.fairness.shares.forEach(function (s) {
        rows.push(["Share of " + s.lane, pct(s.share) + " of admissions (weight " + pct(s.weight_share) + ")"]);
      });
      var table = h("table", { class: "report-figures", id: "report-figures-" + id }, rows.map(function (r) {
        return h("tr", {}, [h("th", { scope: "row", text: r[0] }), h("td", { text: r[1] })]);
      }));
      var minutes = rep.timeline.map(function (m) { return new Date(m.at).toISOString().slice(11, 16); });
      var timeline = bars("report-timeline-" + id, "Joins and admissions per minute", minutes, [
        { label: "joins", cls: "s-queue", values: rep.timeline.map(function (m) { return m.joins; }) },
        { label: "admissions", cls: "s-admitted", values: rep.timeline.map(function (m) { return m.admissions; }) }], "");
      var places = rep.waits_by_place.map(function (p) { return p.from + "–" + p.to; });
      var waits = bars("report-waits-" + id, "Waits by place in line", places, [
        { label: "p50", cls: "s-p50", values: rep.waits_by_place.map(function (p) { return p.p50_ms || 0; }) },
        { label: "p90", cls: "s-rate", values: rep.waits_by_place.map(function (p) { return p.p90_ms || 0; }) },
        { label: "p99", cls: "s-p95", values: rep.waits_by_place.map(function (p) { return p.p99_ms || 0; }) }], "ms");
      var csv = h("button", { type: "button", id: "report-csv-" + id, text: "Download CSV" });
      csv.addEventListener("click", function () {
        fetch("/admin/rooms/" + encodeURIComponent(id) + "/report?format=csv", { headers: { Authorization: "Bearer " + token() } })
          .then(function (r) { return r.blob(); })
          .then(function (blob) {
            var a = h("a", { href: URL.createObjectURL(blob), download: id + "-report.csv" });
            document.body.appendChild(a);
            a.click();
            a.remove();
          });
      });
      var print = h("button", { type: "button", id: "report-print-" + id, text: "Print" });
      print.addEventListener("click", function () {
        document.body.setAttribute("data-printing", id);
        $("room-" + id).classList.add("printing");
        window.print();
        $("room-" + id).classList.remove("printing");
        document.body.removeAttribute("data-printing");
      });
      box.appendChild(h("h3", { text: "Sale report: " + id }));
      box.appendChild(h("div", { class: "controls no-print" }, [csv, print]));
      box.appendChild(table);
      box.appendChild(h("div", { class: "charts" }, [
        figure("Joins and admissions per minute", [{ cls: "s-queue", label: "joins" }, { cls: "s-admitted", label: "admissions" }], timeline),
        figure("Waits by place in line", [{ cls: "s-p50", label: "p50" }, { cls: "s-rate", label: "p90" }, { cls: "s-p95", label: "p99" }], waits)
      ]));
      box.hidden = false;
      say("Report of " + id + " ready.");
    }).catch(function (e) { say("The report of " + id + " could not be read: " + e.message, true); });
  }

  function forget(reason) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (controller) { controller.abort(); controller = null; }
    setConn("not connected", false);
    showLogin(reason);
  }

  // ----- the event stream ------------------------------------------------

  function connect() {
    if (controller) { controller.abort(); }
    clearTimeout(retryTimer);
    controller = new AbortController();
    var mine = controller;
    setConn("connecting…", false);
    fetch("/admin/events", {
      headers: { Authorization: "Bearer " + token(), Accept: "text/event-stream" },
      signal: mine.signal
    }).then(function (r) {
      if (r.status === 401 || r.status === 404) {
        forget(r.status === 401 ? "The token was refused." : "The admin API is off.");
        return;
      }
      if (!r.ok || !r.body) { throw new Error("HTTP " + r.status); }
      setConn("live", true);
      $("login").hidden = true;
      $("signout").hidden = false;
      return read(r.body.getReader());
    }).catch(function () {
      // Reconnected below.
    }).then(function () {
      if (controller === mine && token()) {
        setConn("reconnecting…", false);
        retryTimer = setTimeout(connect, 2000);
      }
    });
  }

  function read(reader) {
    var decoder = new TextDecoder();
    var buffer = "";
    function pump() {
      return reader.read().then(function (chunk) {
        if (chunk.done) { return; }
        buffer += decoder.decode(chunk.value, { stream: true });
        var cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          dispatch(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
        }
        return pump();
      });
    }
    return pump();
  }

  function dispatch(block) {
    var name = "message";
    var data = [];
    block.split("\n").forEach(function (line) {
      if (line.indexOf("event:") === 0) { name = line.slice(6).trim(); }
      else if (line.indexOf("data:") === 0) { data.push(line.slice(5).replace(/^ /, "")); }
    });
    if (!data.length) { return; }
    var payload;
    try { payload = JSON.parse(data.join("\n")); } catch (e) { return; }
    if (name === "history") { onHistory(payload); }
    if (name === "update") { onUpdate(payload); }
  }

  function onHistory(payload) {
    Object.keys(payload.rooms || {}).forEach(function (id) {
      room(id).samples = payload.rooms[id].slice();
    });
  }

  function onUpdate(payload) {
    (payload.rooms || []).forEach(function (entry) {
      var r = room(entry.room.id);
      var replaced = r.body && r.body.epoch !== entry.room.epoch;
      if (replaced) { r.samples = []; r.changedAt = null; }
      if (replaced || !stale(r, entry.sample.t)) { r.body = entry.room; }
      var last = r.samples[r.samples.length - 1];
      if (!last || last.t < entry.sample.t) { r.samples.push(entry.sample); }
      var cutoff = entry.sample.t - WINDOW_MS;
      while (r.samples.length && r.samples[0].t < cutoff) { r.samples.shift(); }
      render(r);
    });
  }

  function room(id) {
    if (!rooms[id]) {
      rooms[id] = { id: id, body: null, samples: [], el: null, changedAt: null, seenAfter: false };
    }
    return rooms[id];
  }

  // After a change made here, the stream may still bring a picture of the
  // room read before it (the sampler had started reading, or the update was
  // on its way), which would put the old settings back on the page, and a
  // second press of Pause would then undo the first. The sampler reads the
  // rooms one pass after another, each pass after the previous one's time,
  // so once an update stamped after the change has come, every later one
  // was read after the change.
  function changed(r, body) {
    r.body = body;
    var at = Date.parse(body.updated_at);
    r.changedAt = isNaN(at) ? null : at;
    r.seenAfter = false;
  }

  function stale(r, t) {
    if (r.changedAt === null) { return false; }
    if (r.seenAfter) { r.changedAt = null; return false; }
    if (t > r.changedAt) { r.seenAfter = true; }
    return true;
  }

  // What an operator has put in a form stays there until they submit it or
  // put it back: the refresh writes only controls nobody has touched, with
  // or without the focus (pressing a form's button takes the focus from the
  // control before the form submits). Escape puts the room's value back.
  function keep(control, current) {
    var edit = function () { control.edited = control.value !== current(); };
    control.edited = false;
    control.addEventListener("input", edit);
    control.addEventListener("change", edit);
    control.addEventListener("blur", edit);
    control.addEventListener("keydown", function (ev) {
      if (ev.key === "Escape" && control.edited) {
        control.value = current();
        control.edited = false;
      }
    });
  }

  // Called when the change sent from a control has been answered: the
  // control follows the room again, unless the operator has since put
  // something else in it.
  function settle(control, sent) {
    if (control.value === sent) { control.edited = false; }
  }

  function show(control, value) {
    if (!control.edited) { control.value = value; }
  }

  // ----- a room's card ---------------------------------------------------

  function h(tag, attrs, children) {
    var el = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") { el.textContent = attrs[k]; } else { el.setAttribute(k, attrs[k]); }
    });
    (children || []).forEach(function (c) { el.appendChild(c); });
    return el;
  }

  var FIGURES = [
    ["waiting", "Waiting"],
    ["admitted", "Admitted"],
    ["rate", "Admissions/s (1 min)"],
    ["wait", "Wait p50 / p95 (1 min)"],
    ["joins", "Joins"],
    ["releases", "Releases"],
    ["revocations", "Revocations"],
    ["abandonments", "Abandonments"],
    ["tray", "Tray / held"],
    ["lottery", "Lottery"],
    ["access", "Access"],
    ["stock", "Stock left"],
    ["lanes", "Lanes: waiting / admitted"],
    ["rules", "Traffic rules: matches"],
    ["push", "Push: subscribed · sent / failed / gone / dropped"],
    ["autotune", "Autotune: origin p-latency / target · errors / limit · rate chosen"]
  ];

  // The queueing modes, as the admin API names them, with what each does.
  var MODES = [
    ["queue", "Queue (the fair line)"],
    ["passthrough", "Passthrough (admit everyone, still counted)"],
    ["maintenance", "Maintenance (everyone waits)"],
    ["sold_out", "Sold out (close the room)"]
  ];

  var CHARTS = [
    { key: "queue", title: "Queue length", series: [{ f: "waiting", cls: "s-queue", label: "waiting" }] },
    { key: "admitted", title: "Admitted vs capacity", series: [
      { f: "admitted", cls: "s-admitted", label: "admitted" },
      { f: "capacity", cls: "s-capacity", label: "capacity", dashed: true, noArea: true }] },
    { key: "rate", title: "Admissions per second", series: [{ f: "admit_rate", cls: "s-rate", label: "per second" }] },
    { key: "wait", title: "Wait, join to admission", unit: "time", lead: 1, series: [
      { f: "wait_p95_ms", cls: "s-p95", label: "p95", noArea: true },
      { f: "wait_p50_ms", cls: "s-p50", label: "median" }] }
  ];

  function build(r) {
    var id = r.id;
    var figs = h("dl", { class: "figures" });
    FIGURES.forEach(function (f) {
      figs.appendChild(h("div", { class: "fig" }, [
        h("dt", { text: f[1] }),
        h("dd", { "data-fig": f[0], id: "fig-" + f[0] + "-" + id, text: "–" })
      ]));
    });
    var capInput = h("input", { type: "number", min: "1", max: "1000000", id: "cap-input-" + id, "aria-label": "New capacity for " + id });
    var capSet = h("button", { type: "submit", id: "cap-set-" + id, text: "Set capacity" });
    var capForm = h("form", { class: "control" }, [h("label", { for: "cap-input-" + id, text: "Capacity" }), capInput, capSet]);
    // The field starts empty: what is typed is the new capacity; the
    // current one is in the card's header.
    keep(capInput, function () { return ""; });
    capForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var sent = capInput.value;
      var n = parseInt(sent, 10);
      if (!(n >= 1)) { say("Capacity must be a whole number of at least 1.", true); return; }
      patch(id, { capacity: n }, "Capacity of " + id + " set to " + n + ".").then(function (ok) {
        // Kept after a refusal, to be corrected rather than typed again.
        if (ok && capInput.value === sent) {
          capInput.value = "";
          capInput.edited = false;
        }
      });
    });
    var pause = h("button", { type: "button", id: "pause-" + id, text: "Pause" });
    pause.addEventListener("click", function () {
      var paused = r.body && r.body.settings.paused;
      patch(id, { paused: !paused }, (paused ? "Resumed " : "Paused ") + id + ".");
    });
    // The mode is applied by its own button, so a stray change of the list
    // never closes a sale.
    var modeSelect = h("select", { id: "mode-" + id, "aria-label": "Mode of " + id },
      MODES.map(function (m) { return h("option", { value: m[0], text: m[1] }); }));
    var modeSet = h("button", { type: "submit", id: "mode-set-" + id, text: "Set mode" });
    var modeForm = h("form", { class: "control" }, [h("label", { for: "mode-" + id, text: "Mode" }), modeSelect, modeSet]);
    keep(modeSelect, function () { return r.body ? r.body.mode : ""; });
    modeForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var mode = modeSelect.value;
      patch(id, { mode: mode }, "Mode of " + id + " set to " + mode + ".").then(function () {
        settle(modeSelect, mode);
        render(r);
      });
    });
    var open = h("button", { type: "button", id: "open-" + id, text: "Open now" });
    open.addEventListener("click", function () {
      patch(id, { open_now: true }, "Opened " + id + ".");
    });
    var reportButton = h("button", { type: "button", id: "report-open-" + id, text: "Sale report" });
    reportButton.addEventListener("click", function () { showReport(id); });
    var charts = h("div", { class: "charts" });
    CHARTS.forEach(function (c) {
      var legend = h("p", { class: "legend" });
      c.series.forEach(function (s) {
        legend.appendChild(h("span", { class: "key " + s.cls, text: s.label }));
      });
      var svg = document.createElementNS(SVG, "svg");
      svg.setAttribute("viewBox", "0 0 480 200");
      svg.setAttribute("role", "img");
      svg.setAttribute("aria-label", c.title + " over the last 15 minutes");
      svg.setAttribute("id", "chart-" + c.key + "-" + id);
      charts.appendChild(h("figure", { class: "chart" }, [
        h("figcaption", { text: c.title }), legend, svg]));
    });
    var card = h("article", { class: "room", id: "room-" + id }, [
      h("header", {}, [
        h("h2", { text: id }),
        h("span", { class: "badge", id: "state-" + id }),
        h("span", { class: "cap", id: "cap-" + id })
      ]),
      figs,
      h("div", { class: "controls" }, [capForm, modeForm, pause, open, reportButton]),
      charts,
      h("section", { class: "report", id: "report-" + id, hidden: "hidden", "aria-label": "Sale report of " + id })
    ]);
    $("rooms").appendChild(card);
    r.el = card;
  }

  // Resolves to whether the room took the change.
  function patch(id, body, done) {
    say("Applying…");
    return api("PATCH", "/admin/rooms/" + encodeURIComponent(id), body).then(function (room) {
      say(done);
      var r = rooms[id];
      if (r && room) { changed(r, room); render(r); }
      return true;
    }).catch(function (e) {
      say(id + ": " + e.message, true);
      // Show the room as it is, not as the refused change would have left it.
      var r = rooms[id];
      if (r) { render(r); }
      return false;
    });
  }

  function fmtNum(n) {
    if (n === null || n === undefined) { return "–"; }
    if (n >= 1e6) { return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1) + "M"; }
    if (n >= 1e4) { return (n / 1e3).toFixed(n >= 1e5 ? 0 : 1) + "k"; }
    return String(Math.round(n * 100) / 100);
  }

  function fmtMs(ms) {
    if (ms === null || ms === undefined) { return "–"; }
    if (ms < 1000) { return ms + " ms"; }
    if (ms < 60000) { return Math.round(ms / 100) / 10 + " s"; }
    if (ms < 3600000) { return Math.round(ms / 6000) / 10 + " min"; }
    return Math.round(ms / 360000) / 10 + " h";
  }

  // What autotune read and chose, against its targets: the reading is the
  // tuning instance's (on Redis, the room's owner).
  function tuning(b) {
    var a = b.settings && b.settings.autotune;
    if (!a || !a.enabled) { return "off"; }
    var t = b.autotune;
    if (!t) { return "on, tuned by another instance"; }
    var pct = function (x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + " %"; };
    var q = "p" + Math.round(a.quantile * 100);
    var text = q + " " + fmtMs(t.latency_ms === null ? null : Math.round(t.latency_ms)) + " / " + a.target_latency +
      " · errors " + pct(t.error_ratio) + " / " + pct(a.max_error_ratio) +
      " · " + fmtNum(t.rate) + "/min (" + a.min_rate + "–" + a.max_rate + ")";
    text += " · " + (t.verdict || "–").replace("_", " ");
    if (t.changed_at) { text += ", changed " + new Date(t.changed_at).toLocaleTimeString(); }
    return text;
  }

  function render(r) {
    if (!r.body) { return; }
    if (!r.el) { build(r); }
    var b = r.body;
    var set = function (key, text) { $("fig-" + key + "-" + r.id).textContent = text; };
    set("waiting", fmtNum(b.waiting));
    set("admitted", fmtNum(b.admitted) + " / " + fmtNum(b.capacity));
    set("rate", fmtNum(b.admissions_per_second));
    set("wait", fmtMs(b.recent_wait_p50_ms) + " / " + fmtMs(b.recent_wait_p95_ms));
    set("joins", fmtNum(b.joins));
    set("releases", fmtNum(b.releases));
    set("revocations", fmtNum(b.revocations));
    set("abandonments", fmtNum(b.abandonments));
    set("tray", fmtNum(b.tray) + " / " + fmtNum(b.held));
    set("push", fmtNum(b.push_subscriptions) + " · " + fmtNum(b.push_sent) + " / " +
      fmtNum(b.push_failed) + " / " + fmtNum(b.push_gone) + " / " + fmtNum(b.push_dropped));
    var lottery = $("fig-lottery-" + r.id);
    var proof = b.lottery_seed ? "seed " + b.lottery_seed : (b.lottery_commitment ? "commit " + b.lottery_commitment : "");
    lottery.textContent = proof ? proof.slice(0, 19) + "…" : (b.order === "fifo" ? "off (fifo)" : "–");
    lottery.title = proof;
    var access = b.access || {};
    var rules = [];
    if (access.challenge === "pow") {
      var bits = access.pow_difficulty_now || access.pow_difficulty;
      rules.push("proof of work, " + bits + " bits");
    }
    if (access.enqueue === "token") { rules.push("invite only"); }
    set("access", rules.length ? rules.join(" · ") : "open to all");
    set("stock", b.stock === null || b.stock === undefined ? "not counted" : fmtNum(b.stock));
    set("autotune", tuning(b));
    var lanes = (b.lanes || []).map(function (l) {
      return l.name + " (" + l.weight + "): " + fmtNum(l.waiting) + " / " + fmtNum(l.admitted);
    });
    set("lanes", lanes.length ? lanes.join(" · ") : "one line");
    // The same counters as /metrics' narabu_rule_matches_total, on this
    // instance.
    var matched = (b.rule_matches || []).map(function (m) {
      return m.rule + " (" + m.action + "): " + fmtNum(m.matches);
    });
    set("rules", matched.length ? matched.join(" · ") : "none");
    var modeSelect = $("mode-" + r.id);
    show(modeSelect, b.mode);
    modeSelect.disabled = b.state === "closed";
    $("mode-set-" + r.id).disabled = b.state === "closed";
    var badge = $("state-" + r.id);
    // A mode other than the fair line is what an operator must see first.
    var shown = b.state === "closed" || b.mode === "queue" ? b.state : b.mode.replace("_", " ");
    badge.textContent = shown;
    badge.className = "badge " + (b.mode === "queue" ? b.state : b.mode);
    $("cap-" + r.id).textContent = "capacity " + fmtNum(b.capacity);
    var pause = $("pause-" + r.id);
    pause.textContent = b.settings.paused ? "Resume" : "Pause";
    pause.disabled = b.state === "closed";
    $("open-" + r.id).hidden = b.state !== "scheduled";
    $("cap-set-" + r.id).disabled = b.state === "closed";
    var now = r.samples.length ? r.samples[r.samples.length - 1].t : Date.now();
    CHARTS.forEach(function (c) { draw($("chart-" + c.key + "-" + r.id), c, r.samples, now); });
  }

  // ----- charts ------------------------------------------------------------

  var W = 480, H = 200, L = 58, R = 12, T = 10, B = 24;
  // The x axis spans the history there is, from 30 seconds up to 15 minutes,
  // so a fresh room's first minutes fill the chart instead of a sliver.
  var MIN_SPAN_MS = 30 * 1000;

  function ago(ms) {
    if (ms <= 0) { return "now"; }
    if (ms < 60000) { return "−" + Math.round(ms / 1000) + " s"; }
    return "−" + (Math.round(ms / 6000) / 10) + " min";
  }

  // Time ticks fall on whole seconds, minutes or hours.
  function niceTimeMax(ms) {
    var steps = [100, 200, 500, 1000, 2000, 5000, 10000, 20000, 30000, 60000, 120000,
      300000, 600000, 1200000, 1800000, 3600000, 7200000];
    for (var i = 0; i < steps.length; i++) { if (steps[i] * 4 >= ms) { return steps[i] * 4; } }
    return niceMax(ms);
  }

  function niceMax(v) {
    if (!(v > 0)) { return 1; }
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (steps[i] * p >= v) { return steps[i] * p; } }
    return 10 * p;
  }

  function el(tag, attrs, text) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function draw(svg, chart, samples, now) {
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var first = samples.length ? samples[0].t : now;
    // Round spans with round ticks: [span, number of intervals].
    var SPANS = [[30000, 3], [60000, 4], [120000, 4], [300000, 5], [600000, 5], [WINDOW_MS, 3]];
    var pick = SPANS[SPANS.length - 1];
    for (var k = 0; k < SPANS.length; k++) {
      if (SPANS[k][0] >= Math.max(MIN_SPAN_MS, now - first)) { pick = SPANS[k]; break; }
    }
    var span = pick[0];
    var start = now - span;
    var max = 0;
    chart.series.forEach(function (s) {
      samples.forEach(function (p) { var v = p[s.f]; if (v !== null && v > max) { max = v; } });
    });
    max = chart.unit === "time" ? niceTimeMax(Math.max(max, 1000)) : niceMax(max * 1.1);
    var x = function (t) { return L + (t - start) / span * (W - L - R); };
    var y = function (v) { return T + (1 - v / max) * (H - T - B); };
    // Grid and y labels: four bands.
    for (var i = 0; i <= 4; i++) {
      var v = max * i / 4;
      var gy = y(v);
      svg.appendChild(el("line", { x1: L, x2: W - R, y1: gy, y2: gy, class: i === 0 ? "axis" : "grid" }));
      svg.appendChild(el("text", { x: L - 6, y: gy + 4, class: "ylabel" },
        chart.unit === "time" ? fmtMs(v) : fmtNum(v)));
    }
    // x labels: how long ago, at round intervals of the span.
    for (var q = pick[1]; q >= 0; q--) {
      var back = span * q / pick[1];
      var gx = x(now - back);
      svg.appendChild(el("line", { x1: gx, x2: gx, y1: T, y2: H - B, class: "grid" }));
      svg.appendChild(el("text", { x: gx, y: H - 6, class: q === pick[1] ? "xlabel first" : "xlabel" }, ago(back)));
    }
    if (!samples.length) {
      svg.appendChild(el("text", { x: W / 2, y: H / 2, class: "empty" }, "no data yet"));
      return;
    }
    chart.series.forEach(function (s) {
      var d = "";
      var first = null, lastPt = null, pen = false;
      samples.forEach(function (p) {
        var v = p[s.f];
        if (v === null || v === undefined || p.t < start) { pen = false; return; }
        var px = x(p.t).toFixed(1), py = y(v).toFixed(1);
        d += (pen ? "L" : "M") + px + " " + py + " ";
        pen = true;
        if (!first) { first = [px, py]; }
        lastPt = [px, py, v];
      });
      if (!lastPt) { return; }
      if (!s.noArea && first) {
        svg.appendChild(el("path", { d: d + "L" + lastPt[0] + " " + y(0) + " L" + first[0] + " " + y(0) + " Z", class: "area " + s.cls }));
      }
      svg.appendChild(el("path", { d: d, class: "line " + s.cls + (s.dashed ? " dashed" : "") }));
      svg.appendChild(el("circle", { cx: lastPt[0], cy: lastPt[1], r: 3.5, class: "dot " + s.cls }));
    });
    // The newest value of the lead series, large, top left.
    var lead = chart.series[chart.lead || 0];
    var latest = samples[samples.length - 1][lead.f];
    svg.appendChild(el("text", { x: L + 8, y: T + 20, class: "latest " + lead.cls },
      chart.unit === "time" ? fmtMs(latest) : fmtNum(latest)));
  }

  // ----- start -------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", function () {
    $("login").addEventListener("submit", function (ev) {
      ev.preventDefault();
      var given = $("token").value.trim();
      if (!given) { return; }
      sessionStorage.setItem(TOKEN_KEY, given);
      $("token").value = "";
      api("GET", "/admin/rooms").then(function (data) {
        (data.rooms || []).forEach(function (b) { var r = room(b.id); r.body = b; render(r); });
        connect();
      }).catch(function (e) {
        if (token()) { forget(e.message); }
      });
    });
    $("signout").addEventListener("click", function () { forget(""); });
    if (token()) { connect(); } else { showLogin(""); }
  });
})();
