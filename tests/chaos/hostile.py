"""Hostile requests: every one of them is invalid by construction, so a peer must refuse it.

:class:`HostileRequests` draws, from a seeded ``random.Random``, requests of these kinds:

- ``envelope``: a correct ``/v1/exchange`` envelope with one or more faults (``v`` as a
  float, list, bool, string, map or another number; bad sender, round or step; unknown or
  mismatched codec; payload of the wrong type, keys, dtype or length; NaN and infinite
  values; extra, missing or integer keys), packed with msgpack, or truncated, or followed by
  trailing bytes;
- ``msgpack``: bodies that attack the decoder (array, map, bin and str headers that claim
  gigabytes, nesting 100,000 deep, extension types, the reserved byte, random bytes);
- ``join``: ``/v1/join`` JSON with a bad id or address, extra or missing keys, the wrong
  top-level type, nesting 100,000 deep, ``NaN``, huge integers, duplicate keys, invalid
  UTF-8, trailing bytes, a body over the 1 MiB cap;
- ``random``: any method on any path (the endpoints and others) with a random body and a
  random content type;
- ``content-type``: invalid bodies under another endpoint's content type;
- ``auth``: junk ``Authorization`` headers, and correctly signed requests that are stale,
  from the future, for another peer or for another path;
- ``raw``: broken HTTP on a raw socket (oversized and numerous headers, bad Content-Length,
  bad chunking, HTTP/0.9 and 2.0 request lines, binary garbage, a TLS hello, header
  injection, pipelining).

With a swarm secret, ``signed`` requests carry a valid signature made with the real
secret (a swarm *member* sending garbage): they pass authentication and reach the decoders.
Nothing drawn here is a valid request that changes the model or the membership, so any
``2xx`` to a ``POST`` is a refused-input failure and any model or membership change is one.
"""

from __future__ import annotations

import copy
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import torch

from peer.protocol.codecs import DenseCodec
from peer.protocol.wire import Envelope, pack_envelope

from .signing import junk_authorization, sign, stamp_seconds_ago

ENDPOINTS = (
    "/v1/exchange", "/v1/join", "/v1/leave", "/v1/peers", "/v1/state", "/v1/status", "/metrics",
)  # fmt: skip
MUTATING = frozenset({("POST", "/v1/exchange"), ("POST", "/v1/join"), ("POST", "/v1/leave")})
"""Requests that change a peer when accepted: a 2xx to a hostile one is a failure."""
OTHER_PATHS = (
    "/", "/v1", "/v1/", "/v2/exchange", "/v1/exchange/", "/v1/exchange?round=1", "/v1/%00",
    "/v1/..%2f..%2fetc%2fpasswd", "//v1/peers", "/v1/peers/../state", "/metrics/",
    "/v1/status?" + "a=1&" * 200, "/" + "a" * 3000, "/v1/%ff%fe", "/v1/exchange%20",
)  # fmt: skip
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE", "FOO", "get")
CONTENT_TYPES = (
    None, "application/msgpack", "application/json", "text/plain", "application/octet-stream",
    "multipart/form-data; boundary=x", "application/x-www-form-urlencoded",
    "application/msgpack; charset=utf-8", "", "*/*", "application/json; charset=latin-1",
)  # fmt: skip
BAD_IDS: tuple[Any, ...] = (
    "", "bad id!", "x" * 65, 7, None, ["a"], {"id": "a"}, "-lead", "été", "a\nb", "a/b", 1.5,
    True,
)  # fmt: skip
BAD_ADDRESSES: tuple[Any, ...] = (
    "nohost", "h:0", "h:65536", "h:-1", "a" * 300 + ":1", 5, [], {}, "127.0.0.1:7000/x",
    "[zz]:1", "", "h:1:2", "127.0.0.1:", ":7000", "h :1", "127.0.0.1:7000\r\nX: y", True,
)  # fmt: skip
BAD_ROUNDS: tuple[Any, ...] = (
    -1, 2**53, 2**64 - 1, -(2**63), 1.5, float("nan"), float("inf"), "0", None, True, [0], {},
)  # fmt: skip


@dataclass(frozen=True)
class Hostile:
    """One hostile request: an HTTP request (``raw`` is None) or raw bytes for a socket.

    ``sign``: ``"digest"`` signs the request with the real secret (a member sends it);
    ``"none"`` sends it as it is (the headers may carry a junk signature).
    """

    kind: str
    method: str = "GET"
    path: str = "/"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    sign: str = "none"
    raw: bytes | None = None

    @property
    def mutating(self) -> bool:
        return self.raw is None and (self.method, self.path) in MUTATING


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _nested_json(depth: int, opener: str) -> bytes:
    closer = {"[": "]", "{": "}"}[opener]
    if opener == "[":
        return ("[" * depth + "]" * depth).encode()
    return ('{"a":' * depth + "1" + closer * depth).encode()


class HostileRequests:
    """A seeded, endless source of hostile requests against one peer.

    Args:
        rng: the source of randomness (``random.Random(seed)``).
        target_id: the attacked peer's id (signatures name it; some faults use it).
        numel: its model's parameter count (``GET /v1/status`` ``parameters``).
        dtype: its model's dtype name (``float32``).
        secret: the swarm secret, or ``None`` for an open swarm.
        signed_share: with a secret, the share of HTTP requests signed with it.
    """

    def __init__(
        self,
        rng: random.Random,
        *,
        target_id: str,
        numel: int,
        dtype: str = "float32",
        secret: bytes | None = None,
        signed_share: float = 0.6,
    ) -> None:
        self.rng = rng
        self.target_id = target_id
        self.numel = numel
        self.secret = secret
        self.signed_share = signed_share
        torch_dtype = getattr(torch, dtype)
        zeros = torch.zeros(numel, dtype=torch_dtype)
        envelope = Envelope(
            sender="fuzz-sender", round=0, codec="none", payload=DenseCodec().encode(zeros)
        )
        self.base_envelope: dict[str, Any] = msgpack.unpackb(pack_envelope(envelope), raw=False)
        self.element_size = zeros.element_size()
        self._serial = 0
        kinds: list[tuple[str, float, Callable[[], Hostile]]] = [
            ("envelope", 0.28, self.envelope),
            ("msgpack", 0.10, self.msgpack_bomb),
            ("join", 0.17, self.join),
            ("random", 0.17, self.random_request),
            ("content-type", 0.05, self.content_type),
            ("raw", 0.15, self.raw_http),
        ]
        if secret is not None:
            kinds.append(("auth", 0.08, self.bad_auth))
        self._kinds = kinds

    def __iter__(self) -> HostileRequests:
        return self

    def __next__(self) -> Hostile:
        draw = self.rng.random() * sum(weight for _, weight, _ in self._kinds)
        for _, weight, make in self._kinds:
            draw -= weight
            if draw <= 0:
                return make()
        return self._kinds[-1][2]()

    # ------------------------------------------------------------------ helpers

    def _serial_id(self) -> str:
        self._serial += 1
        return f"fuzz-{self._serial}"

    def _member_signs(self) -> str:
        if self.secret is not None and self.rng.random() < self.signed_share:
            return "digest"
        return "none"

    def _post(self, kind: str, path: str, body: bytes, content_type: str | None) -> Hostile:
        headers = (("Content-Type", content_type),) if content_type is not None else ()
        return Hostile(kind, "POST", path, headers, body, self._member_signs())

    # ------------------------------------------------------------------ envelopes

    def _envelope_fault(self, env: dict[str, Any]) -> str:
        rng = self.rng
        name = rng.choice(
            (
                "v-float", "v-list", "v-bool", "v-str", "v-map", "v-none", "v-other", "sender",
                "round", "step", "codec", "payload-type", "payload-missing", "payload-extra",
                "dtype", "data-length", "data-type", "non-finite", "payload-codec",
                "missing-key", "extra-key", "int-key", "nested",
            )
        )  # fmt: skip
        payload = env.get("payload")
        if not isinstance(payload, dict):
            payload = env["payload"] = copy.deepcopy(self.base_envelope["payload"])
        version = self.base_envelope["v"]
        if name == "v-float":
            env["v"] = float(version)
        elif name == "v-list":
            env["v"] = [version]
        elif name == "v-bool":
            env["v"] = True
        elif name == "v-str":
            env["v"] = str(version)
        elif name == "v-map":
            env["v"] = {"v": version}
        elif name == "v-none":
            env["v"] = None
        elif name == "v-other":
            env["v"] = rng.choice((0, -1, version + 1, 2**64 - 1, 255))
        elif name == "sender":
            env["sender"] = rng.choice((*BAD_IDS, self.target_id))
        elif name in ("round", "step"):
            env[name] = rng.choice(BAD_ROUNDS)
        elif name == "codec":
            env["codec"] = rng.choice(("zip", "", "NONE", 5, None, "qsgd", "topk", "fp16", "bf16"))
        elif name == "payload-type":
            env["payload"] = rng.choice((None, [], "x", 5, b"raw", True))
        elif name == "payload-missing":
            originals = [key for key in self.base_envelope["payload"] if key in payload]
            if originals:
                del payload[rng.choice(originals)]
        elif name == "payload-extra":
            payload[rng.choice(("extra", "scale", "k", 1))] = rng.choice((0, b"", "x"))
        elif name == "dtype":
            payload["dtype"] = rng.choice(("<f8", "<f2", "bf16", "<i4", "int8", "", None, 4, ">f4"))
        elif name == "data-length":
            size = self.numel * self.element_size
            payload["data"] = bytes(rng.choice((0, 1, size - 1, size + 1, size - 4, size + 4)))
        elif name == "data-type":
            payload["data"] = rng.choice(([0.0] * 4, "zeros", None, 0, {"data": b""}))
        elif name == "non-finite":
            values = torch.zeros(self.numel, dtype=torch.float32)
            count = rng.randint(1, 4)
            for _ in range(count):
                values[rng.randrange(self.numel)] = rng.choice((math.nan, math.inf, -math.inf))
            if payload.get("dtype") == "<f4":
                payload["data"] = values.numpy().tobytes()
            else:
                env["v"] = [version]
        elif name == "payload-codec":
            payload["codec"] = rng.choice(("fp16", "qsgd", "zip", None))
        elif name == "missing-key":
            originals = [key for key in self.base_envelope if key in env]
            if originals:
                del env[rng.choice(originals)]
        elif name == "extra-key":
            env[rng.choice(("extra", "V", "signature", "round "))] = rng.choice((0, "x", b"", None))
        elif name == "int-key":
            keys = sorted(key for key in env if isinstance(key, str))
            env[rng.randint(0, 9)] = env.pop(rng.choice(keys)) if keys else 0
        else:  # nested
            inner: Any = 0
            for _ in range(rng.choice((50, 1000, 5000))):
                inner = {"payload": inner}
            env["payload"] = inner
        return name

    def envelope(self) -> Hostile:
        env = copy.deepcopy(self.base_envelope)
        env["sender"] = self._serial_id()
        faults = [self._envelope_fault(env) for _ in range(self.rng.choice((1, 1, 1, 2, 3)))]
        try:
            body = _pack(env)
        except (OverflowError, TypeError, ValueError):
            body = _pack({**self.base_envelope, "v": [0]})
        ending = self.rng.random()
        if ending < 0.08:
            body = body[: self.rng.randrange(max(1, len(body)))]
            faults.append("truncated")
        elif ending < 0.14:
            body += bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 16)))
            faults.append("trailing")
        kind = "envelope:" + "+".join(faults)
        return self._post(kind, "/v1/exchange", body, "application/msgpack")

    def msgpack_bomb(self) -> Hostile:
        rng = self.rng
        name, body = rng.choice(
            (
                ("array32", b"\xdd\xff\xff\xff\xff" + b"\xc0" * 8),
                ("map32", b"\xdf\xff\xff\xff\xff" + b"\xa1a\xc0" * 4),
                ("bin32", b"\xc6\x7f\xff\xff\xff" + b"\x00" * 64),
                ("str32", b"\xdb\x7f\xff\xff\xff" + b"a" * 64),
                ("deep-array", b"\x91" * 100_000 + b"\xc0"),
                ("deep-map", b"\x81\xa1k" * 30_000 + b"\xc0"),
                ("ext", b"\xd4\x01\x00"),
                ("timestamp-ext", b"\xd6\xff\x00\x00\x00\x01"),
                ("reserved-byte", b"\xc1"),
                ("empty", b""),
                ("nil", b"\xc0"),
                ("random", bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))),
                ("env-bin-claims-more", self._envelope_claiming_more()),
            )
        )
        return self._post(f"msgpack:{name}", "/v1/exchange", body, "application/msgpack")

    def _envelope_claiming_more(self) -> bytes:
        env = copy.deepcopy(self.base_envelope)
        body = _pack(env)
        return body[: len(body) - self.numel * self.element_size // 2]

    # ------------------------------------------------------------------ join

    def join(self) -> Hostile:
        rng = self.rng
        good: dict[str, Any] = {"id": self._serial_id(), "address": "127.0.0.1:9"}
        name = rng.choice(
            (
                "id", "address", "extra-key", "missing-key", "top-level", "deep-array",
                "deep-object", "nan", "huge-int", "duplicate-key", "utf8", "trailing",
                "over-cap", "own-id",
            )
        )  # fmt: skip
        if name == "id":
            body = json.dumps({**good, "id": rng.choice(BAD_IDS)}).encode()
        elif name == "own-id":
            body = json.dumps({**good, "id": self.target_id}).encode()
        elif name == "address":
            body = json.dumps({**good, "address": rng.choice(BAD_ADDRESSES)}).encode()
        elif name == "extra-key":
            body = json.dumps({**good, rng.choice(("v", "peers", "status")): 1}).encode()
        elif name == "missing-key":
            body = json.dumps(
                {"id": good["id"]} if rng.random() < 0.5 else {"address": "h:1"}
            ).encode()
        elif name == "top-level":
            body = rng.choice((b"[]", b'"x"', b"1", b"null", b"true", b'[{"id":"a"}]'))
        elif name == "deep-array":
            body = _nested_json(rng.choice((1000, 100_000)), "[")
        elif name == "deep-object":
            body = _nested_json(rng.choice((1000, 50_000)), "{")
        elif name == "nan":
            body = b'{"id": NaN, "address": "127.0.0.1:9"}'
        elif name == "huge-int":
            body = b'{"id": ' + b"9" * rng.choice((50, 5000, 100_000)) + b', "address": null}'
        elif name == "duplicate-key":
            body = f'{{"id": "bad id!", "id": "{good["id"]}", "address": "127.0.0.1:9"}}'.encode()
        elif name == "utf8":
            body = b'{"id": "\xff\xfe", "address": "127.0.0.1:9"}'
        elif name == "trailing":
            body = json.dumps({**good, "id": "bad id!"}).encode() + b"}{"
        else:  # over-cap
            body = b'{"id": "' + b"a" * (1 << 20) + b'", "address": null}'
        return self._post(f"join:{name}", "/v1/join", body, "application/json")

    # ------------------------------------------------------------------ anything

    def random_request(self) -> Hostile:
        rng = self.rng
        method = rng.choice(METHODS)
        path = rng.choice((*ENDPOINTS, *ENDPOINTS, *OTHER_PATHS))
        size = rng.choice((0, 0, 1, 16, 300, 5000))
        body = bytes(rng.randrange(256) for _ in range(size))
        if (method, path) in MUTATING and not body:
            body = b"\x00"
        content_type = rng.choice(CONTENT_TYPES)
        headers = (("Content-Type", content_type),) if content_type is not None else ()
        return Hostile(f"random:{method}", method, path, headers, body, self._member_signs())

    def content_type(self) -> Hostile:
        rng = self.rng
        if rng.random() < 0.5:
            body = json.dumps({"v": 1, "sender": "x", "round": 0}).encode()
            content_type = rng.choice(("application/json", "text/plain", "multipart/form-data"))
            return self._post("content-type:exchange", "/v1/exchange", body, content_type)
        body = _pack({"id": "bad id!", "address": 1})
        content_type = rng.choice(("application/msgpack", "application/x-www-form-urlencoded"))
        return self._post("content-type:join", "/v1/join", body, content_type)

    def bad_auth(self) -> Hostile:
        """Requests a member could not have sent: junk, stale, future, wrong receiver or path."""
        assert self.secret is not None
        rng = self.rng
        method, path = rng.choice((("POST", "/v1/exchange"), ("POST", "/v1/join"), ("GET", "/v1/peers"), ("GET", "/v1/state")))  # fmt: skip
        body = b""
        if path == "/v1/exchange":
            env = copy.deepcopy(self.base_envelope)
            env["sender"] = self._serial_id()
            body = _pack(env)  # a valid envelope: only the signature is wrong
        elif path == "/v1/join":
            body = json.dumps({"id": self._serial_id(), "address": "127.0.0.1:9"}).encode()
        name = rng.choice(
            ("empty", "basic", "scheme-only", "junk-form", "stale", "future", "other-peer",
             "other-path", "bad-nonce", "stream-on-json", "huge-timestamp")
        )  # fmt: skip
        junk = bytes(rng.randrange(256) for _ in range(48))
        if name == "empty":
            authorization = ""
        elif name == "basic":
            authorization = "Basic dXNlcjpwYXNz"
        elif name == "scheme-only":
            authorization = "gossipnet-hmac-sha256"
        elif name == "junk-form":
            authorization = junk_authorization(junk, receiver=self.target_id)
        elif name == "stream-on-json":
            authorization = junk_authorization(
                junk, receiver=self.target_id, scheme="gossipnet-stream-poly1305"
            )
        elif name == "bad-nonce":
            authorization = junk_authorization(junk, receiver=self.target_id).replace(
                "nonce=", "nonce=zz"
            )
        elif name == "huge-timestamp":
            authorization = sign(
                self.secret, method, path, body, receiver=self.target_id, timestamp=10**15
            )["Authorization"]
        elif name in ("stale", "future"):
            seconds = 3600 if name == "stale" else -3600
            authorization = sign(
                self.secret,
                method,
                path,
                body,
                receiver=self.target_id,
                timestamp=stamp_seconds_ago(seconds),
            )["Authorization"]
        elif name == "other-peer":
            authorization = sign(self.secret, method, path, body, receiver="someone-else")[
                "Authorization"
            ]
        else:  # other-path
            other = "/v1/peers" if path != "/v1/peers" else "/v1/state"
            authorization = sign(self.secret, method, other, body, receiver=self.target_id)[
                "Authorization"
            ]
        headers: tuple[tuple[str, str], ...] = (("Authorization", authorization),)
        if body:
            content_type = "application/msgpack" if path == "/v1/exchange" else "application/json"
            headers += (("Content-Type", content_type),)
        return Hostile(f"auth:{name}", method, path, headers, body, "none")

    # ------------------------------------------------------------------ raw sockets

    def raw_http(self) -> Hostile:
        rng = self.rng
        host = b"Host: 127.0.0.1\r\n"
        envelope = _pack({**self.base_envelope, "v": [1]})
        name, data = rng.choice(
            (
                ("big-header", b"GET /v1/status HTTP/1.1\r\n" + host + b"X-Big: " + b"a" * rng.choice((9000, 70_000)) + b"\r\n\r\n"),
                ("many-headers", b"GET /v1/status HTTP/1.1\r\n" + host + b"".join(b"X-%d: 1\r\n" % i for i in range(rng.choice((200, 3000)))) + b"\r\n"),
                ("long-line", b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n" + host + b"\r\n"),
                ("cl-negative", b"POST /v1/join HTTP/1.1\r\n" + host + b"Content-Length: -1\r\n\r\n{}"),
                ("cl-text", b"POST /v1/join HTTP/1.1\r\n" + host + b"Content-Length: abc\r\n\r\n{}"),
                ("cl-huge", b"POST /v1/exchange HTTP/1.1\r\n" + host + b"Content-Length: 99999999999999999999\r\n\r\n" + envelope[:64]),
                ("cl-twice", b"POST /v1/join HTTP/1.1\r\n" + host + b"Content-Length: 2\r\nContent-Length: 9\r\n\r\n{}"),
                ("cl-and-chunked", b"POST /v1/exchange HTTP/1.1\r\n" + host + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
                ("cl-short-body", b"POST /v1/exchange HTTP/1.1\r\n" + host + b"Content-Length: %d\r\n\r\n" % (len(envelope) + 100) + envelope),
                ("cl-long-body", b"POST /v1/join HTTP/1.1\r\n" + host + b"Content-Length: 2\r\n\r\n{}GARBAGE / HTTP/1.1\r\n\r\n"),
                ("chunk-bad-size", b"POST /v1/join HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
                ("chunk-huge-size", b"POST /v1/exchange HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n\r\nffffffffffff\r\nabc"),
                ("chunk-no-end", b"POST /v1/join HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n"),
                ("te-gzip", b"POST /v1/join HTTP/1.1\r\n" + host + b"Transfer-Encoding: gzip\r\n\r\n{}"),
                ("http09", b"GET /v1/status\r\n\r\n"),
                ("http20", b"GET /v1/status HTTP/2.0\r\n" + host + b"\r\n"),
                ("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
                ("no-version", b"GET /v1/status\r\n" + host + b"\r\n"),
                ("garbage", bytes(rng.randrange(256) for _ in range(rng.randint(1, 2000)))),
                ("tls-hello", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64)),
                ("no-colon", b"GET /v1/status HTTP/1.1\r\n" + host + b"NoColonHere\r\n\r\n"),
                ("space-in-name", b"GET /v1/status HTTP/1.1\r\n" + host + b"Bad Name: x\r\n\r\n"),
                ("obs-fold", b"GET /v1/status HTTP/1.1\r\n" + host + b"X-A: 1\r\n  folded\r\n\r\n"),
                ("nul-in-header", b"GET /v1/status HTTP/1.1\r\n" + host + b"X-A: a\x00b\r\n\r\n"),
                ("bare-lf", b"GET /v1/status HTTP/1.1\n" + host.replace(b"\r\n", b"\n") + b"\n"),
                ("bare-cr", b"GET /v1/status HTTP/1.1\r" + host + b"\r\n"),
                ("expect-100", b"POST /v1/join HTTP/1.1\r\n" + host + b"Expect: 100-continue\r\nContent-Length: 10\r\n\r\n"),
                ("absolute-uri", b"GET http://evil.invalid/v1/status HTTP/1.1\r\n" + host + b"\r\n"),
                ("connect", b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n" + host + b"\r\n"),
                ("options-star", b"OPTIONS * HTTP/1.1\r\n" + host + b"\r\n"),
                ("pipelined", (b"GET /v1/status HTTP/1.1\r\n" + host + b"\r\n") * 20),
                ("header-injection", b"GET /v1/status HTTP/1.1\r\n" + host + b"X-A: 1\rX-B: 2\r\n\r\n"),
                ("lower-method", b"post /v1/join HTTP/1.1\r\n" + host + b"Content-Length: 2\r\n\r\n{}"),
            )
        )  # fmt: skip
        return Hostile(f"raw:{name}", raw=data)
