// Narabu's service worker: shows the call-backs a waiting room sends by
// Web Push ("N ahead", "it's your turn") and, when one is clicked, brings
// the visitor back to their queue page, which admits them at once if
// their turn has come. It caches nothing and handles no fetch: the page
// works the same with or without it.
"use strict";

self.addEventListener("install", function () {
  self.skipWaiting();
});

self.addEventListener("activate", function (event) {
  event.waitUntil(self.clients.claim());
});

self.addEventListener("push", function (event) {
  var message = {};
  try {
    message = event.data ? event.data.json() : {};
  } catch (e) {
    message = { title: event.data ? event.data.text() : "" };
  }
  var url = typeof message.url === "string" && message.url.charAt(0) === "/" &&
    message.url.charAt(1) !== "/" ? message.url : "/";
  var options = {
    body: message.body || "",
    lang: message.lang || "",
    // One notification per room: the turn replaces "N ahead".
    tag: "narabu-" + (message.room || "queue"),
    renotify: true,
    requireInteraction: message.kind === "turn",
    data: { url: url }
  };
  event.waitUntil(self.registration.showNotification(message.title || "Narabu", options));
});

self.addEventListener("notificationclick", function (event) {
  event.notification.close();
  var url = new URL((event.notification.data && event.notification.data.url) || "/",
    self.location.origin).href;
  var path = new URL(url).pathname;
  event.waitUntil(
    self.clients.matchAll({ type: "window", includeUncontrolled: true }).then(function (windows) {
      for (var i = 0; i < windows.length; i++) {
        var w = windows[i];
        if (new URL(w.url).pathname === path && "focus" in w) {
          // The open page reloads itself into the site once admitted.
          return w.navigate(url).then(function (c) { return (c || w).focus(); }, function () { return w.focus(); });
        }
      }
      return self.clients.openWindow(url);
    })
  );
});
