"""A push service as a browser's vendor runs one, for tests/push.rs: it
holds a real subscription (a P-256 key pair and an auth secret made here,
as the browser would) and, for every message Narabu POSTs, checks the VAPID
header with py_vapid and PyJWT and decrypts the body with http_ece, the
reference implementations, then reports one JSON line on standard output.

The first line out is {"port", "p256dh", "auth", "vapid_pem",
"vapid_public"}: what the browser's PushSubscription.toJSON() would carry
(the endpoint is http://127.0.0.1:PORT/push/BEHAVIOUR/ID), and a VAPID key
py_vapid made, as PEM and as the applicationServerKey py_vapid derives
from it, for an operator who brings their own key. How it answers depends on
BEHAVIOUR:
  ok       201
  gone     410, as for a subscription the browser has dropped
  flaky    503 with Retry-After: 1 the first time for that path, then 201
  limited  429 (no Retry-After) the first time for that path, then 201
  down     503 always
"""

import base64
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import http_ece
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid, Vapid02, _check_sub


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# The browser's side of the subscription.
KEY = ec.generate_private_key(ec.SECP256R1())
AUTH = os.urandom(16)
P256DH = KEY.public_key().public_bytes(
    serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
)
# Keys Narabu never saw: nothing it sends may open or verify with them.
OTHER_KEY = ec.generate_private_key(ec.SECP256R1())

SEEN = set()
LOCK = threading.Lock()


def decrypt(body, key):
    try:
        return http_ece.decrypt(
            body, private_key=key, auth_secret=AUTH, version="aes128gcm"
        ).decode()
    except Exception as e:  # any refusal is the finding
        return {"error": type(e).__name__}


def check_vapid(header, aud):
    """What the references make of the Authorization header."""
    report = {"header": header}
    try:
        report["py_vapid"] = bool(Vapid02.verify(header))
    except Exception as e:
        report["py_vapid"] = "error: %s" % e
    try:
        params = dict(p.split("=", 1) for p in header.split(" ", 1)[1].split(","))
        report["k"] = params["k"]
        public = ec.EllipticCurvePublicKey.from_encoded_point(
            ec.SECP256R1(), unb64url(params["k"])
        )
        claims = jwt.decode(
            params["t"],
            key=public,
            algorithms=["ES256"],
            audience=aud,
            options={"require": ["exp", "aud", "sub"]},
        )
        report["claims"] = claims
        report["jwt_header"] = jwt.get_unverified_header(params["t"])
        report["sub_ok"] = _check_sub(claims["sub"])
        report["exp_in"] = claims["exp"] - int(time.time())
        try:
            jwt.decode(params["t"], key=OTHER_KEY.public_key(), algorithms=["ES256"], audience=aud)
            report["unrelated_key"] = "accepted"
        except jwt.InvalidSignatureError:
            report["unrelated_key"] = "refused"
    except Exception as e:
        report["jwt"] = "error: %s: %s" % (type(e).__name__, e)
    return report


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        headers = {k.lower(): v for k, v in self.headers.items()}
        behaviour = self.path.split("/")[2]
        with LOCK:
            first = self.path not in SEEN
            SEEN.add(self.path)
        status, extra = {
            "ok": (201, {}),
            "gone": (410, {}),
            "flaky": (503, {"Retry-After": "1"}) if first else (201, {}),
            "limited": (429, {}) if first else (201, {}),
            "down": (503, {}),
        }[behaviour]
        aud = "http://127.0.0.1:%d" % self.server.server_port
        report = {
            "path": self.path,
            "answered": status,
            "headers": {k: v for k, v in headers.items() if k != "authorization"},
            "length": len(body),
            "text": decrypt(body, KEY),
            "unrelated_key": decrypt(body, OTHER_KEY),
            "vapid": check_vapid(headers.get("authorization", ""), aud),
            "at": time.time(),
        }
        with LOCK:
            sys.stdout.write(json.dumps(report) + "\n")
            sys.stdout.flush()
        self.send_response(status)
        for name, value in extra.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


OPERATOR = Vapid()
OPERATOR.generate_keys()
OPERATOR_PUBLIC = OPERATOR.public_key.public_bytes(
    serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
)

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(
    json.dumps(
        {
            "port": server.server_port,
            "p256dh": b64url(P256DH),
            "auth": b64url(AUTH),
            "vapid_pem": OPERATOR.private_pem().decode(),
            "vapid_public": b64url(OPERATOR_PUBLIC),
        }
    ),
    flush=True,
)
server.serve_forever()
