// Narabu's proof-of-work solver, run in a Web Worker so the page stays
// responsive while it hashes.
//
// It looks for the smallest whole number n such that
// SHA-256(token + String(n)) starts with `difficulty` zero bits (the token's
// ASCII bytes, then n in decimal: src/access/pow.rs documents the bytes).
// WebCrypto digests are asynchronous and cost more to start than to compute,
// so they are asked for in batches; a batch is checked in counter order, so
// the answer is the smallest n of the first batch that holds one. Progress
// (hashes tried) is reported a few times a second.
"use strict";

var BATCH = 256;
var REPORT_EVERY_MS = 200;

function leadingZeroBits(bytes) {
  var bits = 0;
  for (var i = 0; i < bytes.length; i++) {
    var b = bytes[i];
    if (b !== 0) return bits + Math.clz32(b) - 24;
    bits += 8;
  }
  return bits;
}

onmessage = async function (e) {
  var token = String(e.data.token);
  var difficulty = Number(e.data.difficulty);
  var encoder = new TextEncoder();
  var lastReport = Date.now();
  for (var n = 0; ; n += BATCH) {
    var pending = [];
    for (var i = 0; i < BATCH; i++) {
      pending.push(crypto.subtle.digest("SHA-256", encoder.encode(token + (n + i))));
    }
    var digests = await Promise.all(pending);
    for (var j = 0; j < digests.length; j++) {
      if (leadingZeroBits(new Uint8Array(digests[j])) >= difficulty) {
        postMessage({ counter: n + j, tried: n + j + 1 });
        return;
      }
    }
    if (Date.now() - lastReport >= REPORT_EVERY_MS) {
      lastReport = Date.now();
      postMessage({ tried: n + BATCH });
    }
  }
};
