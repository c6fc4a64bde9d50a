"""Request and response signatures: HMAC-SHA256 headers, Poly1305 body tags, and their checks.

Every peer of a swarm shares one secret. A request carries (protocol version 2)::

    Authorization: gossipnet-hmac-sha256 v=2,to=<receiver id>,timestamp=<unix ms>,nonce=<32 hex>,signature=<64 hex>

where ``signature = HMAC-SHA256(secret, signed text)`` (RFC 2104 HMAC over a canonical
request, in the manner of AWS SigV4) and the signed text is the eight lines::

    gossipnet-hmac-sha256 \n 2 \n <receiver id> \n METHOD \n PATH \n timestamp \n nonce \n hex(SHA-256(body))

The signed text names the protocol version and the *receiving* peer: a request captured on
its way to one peer is refused by every other peer of the swarm (``401 unauthorized``, "signed
for another peer"), and a peer of another version refuses it as ``unsupported_version``
instead of as a bad signature. The receiver recomputes the MAC, compares in constant time,
refuses timestamps outside a clock window, timestamps from before it started (so a request
signed before a restart is never accepted again: the nonce cache is in memory and would not
remember it), and nonces it has already seen (a bounded cache; see :class:`NonceCache`),
and only then reads the body. Timestamps are Unix milliseconds, so "before it started" is
exact to the millisecond; a caller whose clock lags the receiver's by L ms is refused for the
first L ms after the receiver starts, and no longer. Responses are signed too, bound to the
request's nonce, so a neighbour's answer cannot be forged or replayed::

    X-Gossipnet-Signature: <hex HMAC-SHA256(secret, "response\n" + status + "\n" + nonce + "\n" + hex(SHA-256(body)))>

Streamed bodies (``/v1/exchange`` and ``/v1/state``, the model-sized ones) are signed
without a pass over the body before its first byte leaves: the header names the stream
scheme and signs the request line and the body's length instead of its digest::

    Authorization: gossipnet-stream-poly1305 v=2,to=<receiver id>,timestamp=<unix ms>,nonce=<32 hex>,signature=<64 hex>

    signature = HMAC-SHA256(secret, "gossipnet-stream-poly1305\n" 2 "\n" receiver "\n" METHOD "\n" PATH "\n" timestamp "\n" nonce "\n" length)

and the body's last 16 bytes are a Poly1305 tag (RFC 8439) of everything before them, under
a one-time key ``HMAC-SHA256(secret, "body\nrequest\n" nonce)``; the answer to such a
request ends with the tag under ``HMAC-SHA256(secret, "body\nresponse\n" status "\n"
nonce)``. Both sides compute the tag as the bytes stream (Poly1305 runs at several GB/s),
and the receiver checks the header (version, receiver, signature, clock window, nonce)
*before* it reads the body and the tag before anything is applied. Nonces never repeat
within the window, so no Poly1305 key is used twice.

The receiver's side is :class:`RequestVerifier`; its replay memory is
:class:`~peer.protocol.replay_cache.NonceCache`. The secret itself comes from
:mod:`peer.protocol.swarm_secret`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Mapping

from peer.protocol.errors import Unauthorized, UnsupportedVersion
from peer.protocol.replay_cache import NonceCache
from peer.protocol.swarm_secret import MIN_SECRET_BYTES
from peer.protocol.wire import PROTOCOL_VERSION, SENDER_ID_PATTERN, SUPPORTED_VERSIONS

__all__ = [
    "RESPONSE_SIGNATURE_HEADER",
    "SCHEME",
    "STREAM_SCHEME",
    "TAG_BYTES",
    "RequestVerifier",
    "body_digest",
    "body_key",
    "is_streamed",
    "now_ms",
    "parse_authorization",
    "request_nonce",
    "sign_request",
    "sign_response",
    "sign_response_digest",
    "sign_stream_request",
    "verify_response",
]

SCHEME = "gossipnet-hmac-sha256"
STREAM_SCHEME = "gossipnet-stream-poly1305"
TAG_BYTES = 16
"""Length of the Poly1305 tag that ends a stream-signed body."""
RESPONSE_SIGNATURE_HEADER = "X-Gossipnet-Signature"

_FIELDS = (
    r"v=(?P<version>[0-9]{1,6}),"
    rf"to=(?P<to>{SENDER_ID_PATTERN.pattern}),"
    r"timestamp=(?P<timestamp>[0-9]{1,16}),"
    r"nonce=(?P<nonce>[0-9a-f]{32}),signature=(?P<signature>[0-9a-f]{64})"
)
_AUTH_PATTERN = re.compile(rf"{SCHEME} {_FIELDS}")
_STREAM_PATTERN = re.compile(rf"{STREAM_SCHEME} {_FIELDS}")
_VERSION_1_PATTERN = re.compile(
    rf"(?:{SCHEME}|{STREAM_SCHEME}) timestamp=[0-9]{{1,12}},nonce=[0-9a-f]{{32}},signature=[0-9a-f]{{64}}"
)
"""Protocol version 1's header (no ``v``, no receiver, seconds): refused as a version."""
_FORM = (
    f"'{SCHEME} (or {STREAM_SCHEME}) v={PROTOCOL_VERSION},to=<receiver id>,"
    "timestamp=<unix ms>,nonce=<32 hex>,signature=<64 hex>'"
)


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def now_ms() -> int:
    """The Unix time in milliseconds (what a signature's ``timestamp`` holds)."""
    return time.time_ns() // 1_000_000


def _signed_text(
    scheme: str, receiver: str, method: str, path: str, timestamp: int, nonce: str, last: str
) -> bytes:
    """The text a request signature MACs: scheme, version, receiver, request line, time,
    nonce and the body's digest (``SCHEME``) or length (``STREAM_SCHEME``), one per line."""
    return (
        f"{scheme}\n{PROTOCOL_VERSION}\n{receiver}\n{method.upper()}\n{path}\n"
        f"{timestamp}\n{nonce}\n{last}"
    ).encode()


def _mac(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _check_receiver(receiver: object) -> str:
    if not isinstance(receiver, str) or SENDER_ID_PATTERN.fullmatch(receiver) is None:
        raise ValueError(
            f"receiver must be a peer id matching {SENDER_ID_PATTERN.pattern}, got {receiver!r:.80}"
        )
    return receiver


def _header(scheme: str, receiver: str, timestamp: int, nonce: str, signature: str) -> str:
    return (
        f"{scheme} v={PROTOCOL_VERSION},to={receiver},timestamp={timestamp},"
        f"nonce={nonce},signature={signature}"
    )


def sign_request(
    secret: bytes,
    method: str,
    path: str,
    body: bytes,
    *,
    receiver: str,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """Headers that authenticate one request to the peer ``receiver``: ``{"Authorization": ...}``.

    ``timestamp`` (Unix ms) defaults to now and ``nonce`` to 16 fresh random bytes in hex.
    Only the peer whose id is ``receiver`` accepts it (``ValueError`` for an id that is not
    one).
    """
    _check_receiver(receiver)
    timestamp = now_ms() if timestamp is None else timestamp
    nonce = secrets.token_hex(16) if nonce is None else nonce
    text = _signed_text(SCHEME, receiver, method, path, timestamp, nonce, body_digest(body))
    return {"Authorization": _header(SCHEME, receiver, timestamp, nonce, _mac(secret, text))}


def sign_stream_request(
    secret: bytes,
    method: str,
    path: str,
    length: int,
    *,
    receiver: str,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """Headers of a stream-signed request to ``receiver`` whose body has ``length`` bytes, tag
    included (the body then ends with the Poly1305 tag under
    :func:`body_key` ``(secret, nonce, "request")``)."""
    _check_receiver(receiver)
    timestamp = now_ms() if timestamp is None else timestamp
    nonce = secrets.token_hex(16) if nonce is None else nonce
    text = _signed_text(STREAM_SCHEME, receiver, method, path, timestamp, nonce, str(length))
    return {"Authorization": _header(STREAM_SCHEME, receiver, timestamp, nonce, _mac(secret, text))}


def body_key(secret: bytes, nonce: str, direction: str, status: int | None = None) -> bytes:
    """The one-time Poly1305 key of a stream-signed body: the request's or, with its
    ``status``, the response's."""
    if direction == "request":
        label = f"body\nrequest\n{nonce}"
    elif direction == "response" and status is not None:
        label = f"body\nresponse\n{status}\n{nonce}"
    else:
        raise ValueError(
            f"direction must be 'request' or 'response' (with a status), got {direction!r}"
        )
    return hmac.new(secret, label.encode(), hashlib.sha256).digest()


def is_streamed(headers: Mapping[str, str]) -> bool:
    """Whether a request is stream-signed (its body, and its answer's, end with a tag)."""
    return headers.get("Authorization", "").startswith(STREAM_SCHEME + " ")


def parse_authorization(header: str | None) -> re.Match[str]:
    """The fields of a version-2 ``Authorization`` header (either scheme).

    Raises :class:`~peer.protocol.errors.UnsupportedVersion` for a header of another protocol version
    (version 1's has no ``v`` field), :class:`~peer.protocol.errors.Unauthorized` for a missing or
    malformed one. Checks the form only, not the signature.
    """
    if not header:
        raise Unauthorized(f"request is not signed: send 'Authorization: {SCHEME} ...'")
    pattern = _STREAM_PATTERN if header.startswith(STREAM_SCHEME + " ") else _AUTH_PATTERN
    match = pattern.fullmatch(header)
    if match is None:
        if _VERSION_1_PATTERN.fullmatch(header):
            raise UnsupportedVersion(
                "the request is signed in protocol version 1's form; this peer speaks version "
                f"{PROTOCOL_VERSION} (Authorization: {_FORM})"
            )
        raise Unauthorized(f"Authorization must be {_FORM}")
    if int(match["version"]) not in SUPPORTED_VERSIONS:
        raise UnsupportedVersion(
            f"the request is signed for protocol version {int(match['version'])}; this peer "
            f"speaks version {PROTOCOL_VERSION}"
        )
    return match


def request_nonce(headers: Mapping[str, str]) -> str:
    """The nonce of a signed request's ``Authorization`` header (to bind the response)."""
    return parse_authorization(headers.get("Authorization"))["nonce"]


def sign_response(secret: bytes, status: int, nonce: str, body: bytes) -> dict[str, str]:
    """The header that authenticates a response to the request carrying ``nonce``."""
    return sign_response_digest(secret, status, nonce, body_digest(body))


def sign_response_digest(secret: bytes, status: int, nonce: str, digest: str) -> dict[str, str]:
    """:func:`sign_response` for a body whose SHA-256 hex ``digest`` is already known."""
    message = f"response\n{status}\n{nonce}\n{digest}".encode()
    return {RESPONSE_SIGNATURE_HEADER: _mac(secret, message)}


def verify_response(
    secret: bytes, status: int, nonce: str, body: bytes, headers: Mapping[str, str]
) -> None:
    """Raise :class:`Unauthorized` unless the response is signed for our request's nonce."""
    got = headers.get(RESPONSE_SIGNATURE_HEADER, "")
    want = sign_response(secret, status, nonce, body)[RESPONSE_SIGNATURE_HEADER]
    if not hmac.compare_digest(got.encode(errors="replace"), want.encode()):
        raise Unauthorized("response signature missing or wrong")


class RequestVerifier:
    """Checks the signatures of requests to the peer ``peer_id``: right version and receiver,
    right MAC, fresh timestamp, unseen nonce.

    ``clock_window_s`` bounds |now - timestamp| (peers' clocks must agree to that). Nonces
    are cached for the window (:class:`NonceCache`), so a replay within the window is
    refused, and one after it is stale. The cache lives in memory, so a restarted peer
    would not remember the nonces its previous run accepted; instead every request signed
    at or before ``started_ms`` (the verifier's creation, in Unix ms, by default) is refused:
    a request captured before a restart is refused after it, whatever the window. The cost:
    a legitimate caller whose clock lags ours by L ms is refused for the first L ms after
    this verifier is created (at most the clock window).

    Raises ``ValueError`` for a secret shorter than 16 bytes, a ``peer_id`` that is not a
    peer id, or a window below 1 s.
    """

    def __init__(
        self,
        secret: bytes,
        *,
        peer_id: str,
        clock_window_s: int = 60,
        nonce_capacity: int = 65536,
        started_ms: int | None = None,
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
        if not isinstance(peer_id, str) or SENDER_ID_PATTERN.fullmatch(peer_id) is None:
            raise ValueError(
                f"peer_id must match {SENDER_ID_PATTERN.pattern} (1-64 chars), got {peer_id!r:.80}"
            )
        if clock_window_s < 1:
            raise ValueError(f"clock_window_s must be >= 1, got {clock_window_s}")
        self._secret = secret
        self.peer_id = peer_id
        self.clock_window_s = clock_window_s
        self.started_ms = now_ms() if started_ms is None else started_ms
        self.nonces = NonceCache(nonce_capacity)

    def verify(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        now: int | None = None,
    ) -> str:
        """Return the request's nonce if it is authentic, fresh and new; else raise
        :class:`Unauthorized` (or :class:`UnsupportedVersion`).

        A digest-signed request (:data:`SCHEME`), its whole ``body`` read. ``now``: the time
        in Unix ms (default: the clock).
        """
        match = self.check_form(headers, now=now)
        if match.re is not _AUTH_PATTERN:
            raise Unauthorized(f"this request must be signed with {SCHEME}, not {STREAM_SCHEME}")
        return self.verify_digest(method, path, headers, body_digest(body), now=now)

    def check_form(self, headers: Mapping[str, str], *, now: int | None = None) -> re.Match[str]:
        """The parsed ``Authorization`` header (either scheme) if its form and version are
        right, it names this peer as the receiver, and its timestamp is inside the clock
        window and after this verifier's start; else :class:`Unauthorized` (or
        :class:`UnsupportedVersion`). Cheap: run it before spending anything on the request."""
        match = parse_authorization(headers.get("Authorization"))
        if match["to"] != self.peer_id:
            raise Unauthorized(
                f"the request was signed for another peer ({match['to']!r}), "
                f"not for this peer ({self.peer_id!r})"
            )
        self._fresh(int(match["timestamp"]), now)
        return match

    def verify_digest(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        digest: str,
        *,
        now: int | None = None,
    ) -> str:
        """:meth:`verify` for a body whose SHA-256 hex ``digest`` the caller computed as it read."""
        match = self.check_form(headers, now=now)
        if match.re is not _AUTH_PATTERN:
            raise Unauthorized(f"this request must be signed with {SCHEME}, not {STREAM_SCHEME}")
        text = _signed_text(
            SCHEME, self.peer_id, method, path, int(match["timestamp"]), match["nonce"], digest
        )
        return self._accept(match, text, now)

    def verify_stream(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        length: int,
        *,
        now: int | None = None,
    ) -> str:
        """The nonce of a stream-signed request (:data:`STREAM_SCHEME`) whose header is
        authentic, fresh and new, checked before its body is read (``length``: its
        Content-Length); the body's tag is checked as it is read (:func:`body_key`)."""
        match = self.check_form(headers, now=now)
        if match.re is not _STREAM_PATTERN:
            raise Unauthorized(f"this request must be signed with {STREAM_SCHEME}")
        text = _signed_text(
            STREAM_SCHEME,
            self.peer_id,
            method,
            path,
            int(match["timestamp"]),
            match["nonce"],
            str(length),
        )
        return self._accept(match, text, now)

    def body_key(self, nonce: str, direction: str, status: int | None = None) -> bytes:
        """:func:`body_key` under this verifier's secret."""
        return body_key(self._secret, nonce, direction, status)

    def _fresh(self, timestamp: int, now: int | None) -> None:
        current = now_ms() if now is None else now
        window_ms = self.clock_window_s * 1000
        if abs(current - timestamp) > window_ms:
            raise Unauthorized(
                f"stale request: timestamp {timestamp} ms is more than {self.clock_window_s} s "
                f"from this peer's clock {current} ms"
            )
        if timestamp <= self.started_ms:
            raise Unauthorized(
                f"stale request: signed at {timestamp} ms, not after this peer started "
                f"({self.started_ms} ms); requests from before a restart are never accepted, "
                "resend"
            )
        if timestamp <= self.nonces.floor:
            raise Unauthorized("stale request: older than the replay cache's floor, resend")

    def _accept(self, match: re.Match[str], text: bytes, now: int | None) -> str:
        timestamp, nonce = int(match["timestamp"]), match["nonce"]
        want = _mac(self._secret, text)
        if not hmac.compare_digest(match["signature"].encode(), want.encode()):
            raise Unauthorized("signature does not match (wrong swarm secret or altered request)")
        current = now_ms() if now is None else now
        if nonce in self.nonces:
            raise Unauthorized("replayed request: nonce already seen")
        self.nonces.add(nonce, timestamp, oldest_valid=current - self.clock_window_s * 1000)
        return nonce
