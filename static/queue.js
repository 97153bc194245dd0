// Narabu queue page: live updates for a visitor waiting in line.
//
// The page works without this script (a <noscript> meta refresh reloads it),
// so this only makes it better: it follows the room over Server-Sent Events,
// falls back to polling the status endpoint when the stream keeps failing,
// and goes to the visitor's return path the moment they are admitted.
// The site forbids inline script, so every input, including the localized
// phrases, comes from data-* attributes on #queue.
(function () {
  "use strict";

  var root = document.getElementById("queue");
  // Without a ticket yet (a proof of work to solve first) there is nothing
  // to follow: static/pow.js joins, then reloads the page.
  if (!root || root.dataset.powToken) return;
  var data = root.dataset;
  var lang = document.documentElement.lang || data.lang || "en";

  var MINUTE = 60;
  var HOUR = 3600;
  var MINUTES_UP_TO = 90 * MINUTE;
  var POLL_MS = 5000;
  var ERRORS_BEFORE_POLLING = 3;
  // Screen readers queue every polite announcement; in a fast-moving line
  // one a second would never stop talking.
  var ANNOUNCE_EVERY_MS = 10000;

  var source = null;
  var errors = 0;
  var polling = false;
  var done = false;
  var lastAnnounced = 0;
  var announceTimer = null;

  function byId(id) { return document.getElementById(id); }

  function fill(template, values) {
    return String(template || "").replace(/\{(\w+)\}/g, function (whole, key) {
      return Object.prototype.hasOwnProperty.call(values, key) ? values[key] : whole;
    });
  }

  function isCount(n) { return typeof n === "number" && isFinite(n) && n >= 0; }

  // Same grouping as group_digits in src/http/i18n.rs.
  function group(n) { return String(Math.floor(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }

  function setText(id, text) {
    var el = byId(id);
    if (el && el.textContent !== text) el.textContent = text;
  }

  // Mirrors rules::wait_shown in src/engine/rules/cadence.rs: one unit, the low end
  // rounded to nearest, the high end rounded up, neither shown as zero.
  function formatEta(low, high) {
    if (!isCount(low) && !isCount(high)) return data.etaUnknown;
    if (!isCount(low)) low = high;
    if (!isCount(high)) high = low;
    var lo = Math.floor(Math.min(low, high));
    var hi = Math.floor(Math.max(low, high));
    if (hi === 0) return data.etaNow;
    var unit = "Hours";
    var size = HOUR;
    if (hi < MINUTE) { unit = "Seconds"; size = 1; }
    else if (hi <= MINUTES_UP_TO) { unit = "Minutes"; size = MINUTE; }
    var a = Math.max(1, Math.floor(lo / size) + (lo % size >= Math.ceil(size / 2) ? 1 : 0));
    var b = Math.max(a, Math.ceil(hi / size));
    if (a === b) {
      return a === 1 ? data["eta" + unit + "One"] : fill(data["eta" + unit + "Single"], { n: group(a) });
    }
    return fill(data["eta" + unit + "Range"], { low: group(a), high: group(b) });
  }

  // Shows a <time> in the reader's own time zone and language; the server
  // could only print UTC.
  function localizeTime(el) {
    var when = new Date(el.getAttribute("datetime"));
    if (isNaN(when.getTime())) return;
    var options = el.getAttribute("data-format") === "datetime"
      ? { year: "numeric", month: "long", day: "numeric", weekday: "short",
          hour: "2-digit", minute: "2-digit", timeZoneName: "short" }
      : { hour: "2-digit", minute: "2-digit", second: "2-digit" };
    try {
      el.textContent = when.toLocaleString(lang, options);
    } catch (e) {
      // An old browser without these options keeps the server's text.
    }
  }

  function announce(text) {
    if (announceTimer) clearTimeout(announceTimer);
    var wait = lastAnnounced + ANNOUNCE_EVERY_MS - Date.now();
    announceTimer = setTimeout(function () {
      announceTimer = null;
      lastAnnounced = Date.now();
      setText("live", text);
    }, Math.max(0, wait));
  }

  function update(s) {
    if (isCount(s.number)) {
      var number = byId("number");
      number.classList.remove("ticket-pending");
      setText("number", group(s.number));
      var preopen = byId("preopen");
      if (preopen) preopen.hidden = true;
    }
    var position = isCount(s.position) ? group(s.position) : data.unknown;
    var moved = position !== byId("position").textContent;
    setText("position", position);
    setText("ahead", isCount(s.ahead) ? group(s.ahead) : data.unknown);

    var low = isCount(s.eta_low_seconds) ? s.eta_low_seconds : s.eta_seconds;
    var high = isCount(s.eta_high_seconds) ? s.eta_high_seconds : s.eta_seconds;
    var eta = formatEta(low, high);
    setText("eta", eta);

    if (typeof s.progress === "number" && isFinite(s.progress)) {
      var percent = Math.round(Math.min(1, Math.max(0, s.progress)) * 100);
      var bar = byId("progress");
      bar.value = percent;
      bar.textContent = percent + "%";
      setText("progress-text", fill(data.progressText, { percent: percent }));
    }
    if (isCount(s.queue_length)) {
      setText("queue-length", fill(data.queueLength, { n: group(s.queue_length) }));
    }
    if (typeof s.updated_at === "string") {
      var updated = byId("updated");
      updated.setAttribute("datetime", s.updated_at);
      updated.textContent = s.updated_at;
      localizeTime(updated);
    }
    if (typeof s.paused === "boolean") byId("paused").hidden = !s.paused;
    // A page of the operator's own may leave these out.
    var maintenance = byId("maintenance");
    if (maintenance && typeof s.mode === "string") maintenance.hidden = s.mode !== "maintenance";
    var stock = byId("stock");
    if (stock && isCount(s.stock)) {
      stock.textContent = fill(data.stockLeft, { n: group(s.stock) });
      stock.hidden = false;
    }

    if (moved && isCount(s.position)) {
      var known = isCount(low) || isCount(high);
      announce(fill(known ? data.announceEta : data.announce, { position: position, eta: eta }));
    }
  }

  // Only ever a path on this site: the same check as safe_return in
  // src/http/pages.rs, so a tampered page cannot send anyone elsewhere.
  function safeReturn(path) {
    var plain = typeof path === "string" && path.charAt(0) === "/" && path.charAt(1) !== "/" &&
      !/[\\\u0000-\u001f\u007f-\u009f]/.test(path);
    return plain ? path : "/";
  }

  function stop() {
    done = true;
    if (source) source.close();
    source = null;
  }

  function admit() {
    if (done) return;
    stop();
    window.location.replace(safeReturn(data["return"]));
  }

  // The server knows which page fits an expired, left or closed ticket, or
  // one whose line was reset.
  function reload() {
    if (done) return;
    stop();
    window.location.reload();
  }

  function handle(s) {
    if (done || !s || typeof s !== "object") return;
    switch (s.status) {
      case "admitted": admit(); break;
      case "expired": case "left": case "closed": reload(); break;
      default: update(s);
    }
  }

  function parse(text) {
    try { return JSON.parse(text); } catch (e) { return null; }
  }

  function poll() {
    if (done) return;
    fetch(data.statusUrl, {
      credentials: "same-origin",
      cache: "no-store",
      headers: { Accept: "application/json" }
    })
      .then(function (response) {
        if (response.status === 404 || response.status === 410) { reload(); return null; }
        return response.ok ? response.json() : null;
      })
      .then(handle, function () { /* offline for now; try again */ })
      .then(function () { if (!done) setTimeout(poll, POLL_MS); });
  }

  function startPolling() {
    if (polling || done) return;
    polling = true;
    root.classList.add("is-stale");
    if (!data.statusUrl || !window.fetch) return; // the meta refresh is gone; nothing else to do
    poll();
  }

  function connect() {
    if (!window.EventSource || !data.eventsUrl) { startPolling(); return; }
    source = new EventSource(data.eventsUrl);
    source.addEventListener("open", function () {
      errors = 0;
      root.classList.remove("is-stale");
    });
    source.addEventListener("position", function (e) { handle(parse(e.data)); });
    source.addEventListener("admitted", admit);
    source.addEventListener("expired", reload);
    source.addEventListener("closed", reload);
    source.addEventListener("reset", reload);
    source.addEventListener("error", function () {
      if (done) return;
      root.classList.add("is-stale");
      errors += 1;
      // EventSource retries by itself, but gives up for good on an HTTP
      // error, and a stream that keeps failing is better replaced by polls.
      if (errors >= ERRORS_BEFORE_POLLING || source.readyState === EventSource.CLOSED) {
        source.close();
        source = null;
        startPolling();
      }
    });
  }

  // Leaving posts the form in the background and then reloads, so the server
  // shows the page for a ticket that has left (the post itself may answer
  // 204). The stream stops first: an admission racing the post must not
  // carry the visitor off. If the post cannot be sent, the form goes the
  // ordinary way.
  var leave = byId("leave-form");
  if (leave && window.fetch && window.URLSearchParams && window.FormData) {
    leave.addEventListener("submit", function (e) {
      e.preventDefault();
      stop();
      fetch(leave.action, {
        method: "POST",
        credentials: "same-origin",
        body: new URLSearchParams(new FormData(leave))
      }).then(function () { window.location.reload(); }, function () { leave.submit(); });
    });
  }

  Array.prototype.forEach.call(document.querySelectorAll("time[datetime]"), localizeTime);
  connect();

  // "Notify me when it's my turn": Web Push, offered only where the
  // browser can take it. Nothing asks for permission until the visitor
  // presses the button; pressing it again turns the notifications off.
  (function () {
    var box = byId("notify");
    var button = byId("notify-button");
    if (!box || !button) return;
    var d = box.dataset;
    if (!("serviceWorker" in navigator) || !("PushManager" in window) || !("Notification" in window)) {
      return;
    }
    box.hidden = false;
    var busy = false;

    function show(on, text) {
      button.setAttribute("aria-pressed", on ? "true" : "false");
      button.textContent = on ? d.labelOff : d.labelOn;
      setText("notify-status", text || "");
    }

    function b64ToBytes(text) {
      var padded = text.replace(/-/g, "+").replace(/_/g, "/");
      padded += "====".slice(0, (4 - padded.length % 4) % 4);
      var raw = atob(padded);
      var out = new Uint8Array(raw.length);
      for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
      return out;
    }

    function registration() {
      return navigator.serviceWorker.register(d.sw);
    }

    function send(method, body) {
      return fetch(d.notifyUrl, {
        method: method,
        credentials: "same-origin",
        headers: body ? { "content-type": "application/json" } : {},
        body: body ? JSON.stringify(body) : undefined
      }).then(function (response) {
        if (!response.ok) throw new Error("notify " + response.status);
        return response;
      });
    }

    function turnOn() {
      return Notification.requestPermission().then(function (permission) {
        if (permission !== "granted") {
          show(false, d.textBlocked);
          return;
        }
        return Promise.all([
          registration(),
          fetch(d.notifyUrl, { credentials: "same-origin" }).then(function (r) { return r.json(); })
        ]).then(function (got) {
          var reg = got[0];
          var key = got[1].public_key;
          return reg.pushManager.getSubscription().then(function (old) {
            return old || reg.pushManager.subscribe({
              userVisibleOnly: true,
              applicationServerKey: b64ToBytes(key)
            });
          });
        }).then(function (subscription) {
          return send("POST", { subscription: subscription.toJSON(), lang: lang });
        }).then(function () { show(true, d.textOn); });
      });
    }

    function turnOff() {
      return send("DELETE").then(function () { show(false, d.textOff); });
    }

    button.addEventListener("click", function () {
      if (busy) return;
      busy = true;
      var on = button.getAttribute("aria-pressed") === "true";
      (on ? turnOff() : turnOn()).catch(function () {
        show(on, d.textUnsupported);
      }).then(function () { busy = false; });
    });
  })();
})();
