// Narabu queue page, for rooms that ask a proof of work before a ticket:
// solves the room's challenge in a Web Worker (static/pow-worker.js) while
// showing progress, then joins with the solution and reloads the page,
// which from then on shows the ticket like any other.
//
// Inputs come from data-* attributes on #queue (the site forbids inline
// script): the challenge token and difficulty, the join URL, the page's own
// address without the enqueue token, and the enqueue token itself when the
// room is invite-only (it is dropped from the address bar at once).
(function () {
  "use strict";

  var root = document.getElementById("queue");
  if (!root || !root.dataset.powToken) return;
  var data = root.dataset;
  var MAX_ATTEMPTS = 3;
  var attempts = 0;

  function byId(id) { return document.getElementById(id); }

  function fill(template, values) {
    return String(template || "").replace(/\{(\w+)\}/g, function (whole, key) {
      return Object.prototype.hasOwnProperty.call(values, key) ? values[key] : whole;
    });
  }

  function show(fraction) {
    var percent = Math.round(Math.min(0.99, Math.max(0, fraction)) * 100);
    var bar = byId("pow-progress");
    if (bar) {
      bar.value = percent;
      bar.textContent = percent + "%";
    }
    var status = byId("pow-status");
    if (status) status.textContent = fill(data.powProgress, { percent: percent });
  }

  function fail() {
    var status = byId("pow-status");
    if (status) status.textContent = data.powFailed;
  }

  function join(token, counter) {
    var body = { challenge: token, counter: counter };
    if (data.enqueueToken) body.enqueue_token = data.enqueueToken;
    fetch(data.joinUrl, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "application/json" },
      body: JSON.stringify(body)
    }).then(function (response) {
      return response.json().then(function (answer) {
        if (response.ok) {
          // The join set the room cookie: the page now shows the ticket.
          location.replace(data.pageUrl);
        } else if (response.status === 428 && answer.challenge) {
          solve(answer.challenge);
        } else {
          fail();
        }
      });
    }).catch(fail);
  }

  function solve(challenge) {
    attempts += 1;
    if (attempts > MAX_ATTEMPTS || typeof Worker === "undefined" || !window.crypto || !crypto.subtle) {
      fail();
      return;
    }
    // The chance of having found a solution after `tried` hashes.
    var expected = Math.pow(2, Number(challenge.difficulty));
    var worker = new Worker(data.powWorker);
    worker.onmessage = function (e) {
      show(1 - Math.exp(-e.data.tried / expected));
      if (typeof e.data.counter === "number") {
        worker.terminate();
        show(1);
        join(challenge.token, e.data.counter);
      }
    };
    worker.onerror = fail;
    worker.postMessage({ token: challenge.token, difficulty: challenge.difficulty });
  }

  if (data.enqueueToken && window.history && history.replaceState) {
    history.replaceState(null, "", data.pageUrl);
  }
  show(0);
  solve({ token: data.powToken, difficulty: Number(data.powDifficulty) });
})();
