"""A webhook receiver as a site would write one: it checks every delivery
with the Standard Webhooks reference library (the `standardwebhooks` package
from PyPI) and reports, one JSON line per delivery on standard output, what
the library made of the real delivery and of tampered copies of it.

Usage: standard_webhooks_receiver.py '{"/path": {"secret": "whsec_...",
"previous": "whsec_..." or null}, ...}'

The first line out is {"port": N}; it answers 204 to a delivery the library
accepts with the current secret, 400 otherwise.
"""

import base64
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

RECEIVERS = json.loads(sys.argv[1])
# A secret Narabu never saw: nothing it signs may pass with it.
UNRELATED = "whsec_" + base64.b64encode(os.urandom(32)).decode()


def refusal(secret, body, headers):
    """None when the library accepts the delivery, else its reason."""
    try:
        Webhook(secret).verify(body, headers)
        return None
    except WebhookVerificationError as e:
        return str(e)


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        headers = {k.lower(): v for k, v in self.headers.items()}
        keys = RECEIVERS[self.path]
        secret = keys["secret"]
        report = {
            "path": self.path,
            "headers": headers,
            "body": body.decode(),
            "current": refusal(secret, body, headers),
            "previous": refusal(keys["previous"], body, headers) if keys.get("previous") else "none configured",
            "unrelated": refusal(UNRELATED, body, headers),
        }
        # The signature covers the body, the id and the timestamp; a replay
        # outside the library's five minutes is refused even when signed.
        ts = int(headers["webhook-timestamp"])
        tampered = {
            "body": (body.replace(b'"room":"', b'"room":"x', 1), headers),
            "id": (body, {**headers, "webhook-id": headers["webhook-id"] + "0"}),
            "timestamp": (body, {**headers, "webhook-timestamp": str(ts + 1)}),
            "old": (body, {**headers, "webhook-timestamp": str(int(time.time()) - 600)}),
        }
        report["tampered"] = {
            name: refusal(secret, b, h) for name, (b, h) in tampered.items()
        }
        # one line per report even when deliveries arrive together: print()
        # writes the text and its newline separately, and threads interleave
        with REPORT_LOCK:
            sys.stdout.write(json.dumps(report) + "\n")
            sys.stdout.flush()
        self.send_response(204 if report["current"] is None else 400)
        self.end_headers()

    def log_message(self, *args):
        pass


REPORT_LOCK = threading.Lock()
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(json.dumps({"port": server.server_port}), flush=True)
server.serve_forever()
