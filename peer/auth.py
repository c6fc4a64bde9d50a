"""Swarm authentication: HMAC-SHA256 request and response signatures, and TLS contexts.

Every peer of a swarm shares one secret. A request carries::

    Authorization: gossipnet-hmac-sha256 timestamp=<unix s>,nonce=<32 hex>,signature=<64 hex>

where ``signature = HMAC-SHA256(secret, canonical)`` and ``canonical`` is the five
lines ``METHOD``, ``PATH``, ``timestamp``, ``nonce``, ``hex(SHA-256(body))`` joined
by ``\\n`` (RFC 2104 HMAC over a canonical request, in the manner of AWS SigV4).
The receiver recomputes it, compares in constant time, refuses timestamps
outside a clock window and nonces it has already seen (a bounded cache; see
:class:`NonceCache`), and only then reads the body. Responses are signed too,
bound to the request's nonce, so a neighbour's answer cannot be forged or replayed::

    X-Gossipnet-Signature: <hex HMAC-SHA256(secret, "response\\n" + status + "\\n" + nonce + "\\n" + hex(SHA-256(body)))>

Streamed bodies (``/v1/exchange`` and ``/v1/state``, the model-sized ones) are signed
without a pass over the body before its first byte leaves: the header names the stream
scheme and signs the request line and the body's length instead of its digest::

    Authorization: gossipnet-stream-poly1305 timestamp=<unix s>,nonce=<32 hex>,signature=<64 hex>

    signature = HMAC-SHA256(secret, "stream\n" METHOD "\n" PATH "\n" timestamp "\n" nonce "\n" length)

and the body's last 16 bytes are a Poly1305 tag (RFC 8439) of everything before them, under
a one-time key ``HMAC-SHA256(secret, "body\nrequest\n" nonce)``; the answer to such a
request ends with the tag under ``HMAC-SHA256(secret, "body\nresponse\n" status "\n"
nonce)``. Both sides compute the tag as the bytes stream (Poly1305 runs at several GB/s),
and the receiver checks the header (signature, clock window, nonce) *before* it reads the
body and the tag before anything is applied. Nonces never repeat within the window, so no
Poly1305 key is used twice.

Without a secret the swarm is open: :func:`load_secret` returns ``None`` and the
peer warns loudly (:func:`warn_open_swarm`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import ssl
import time
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path

from peer.errors import Unauthorized

SCHEME = "gossipnet-hmac-sha256"
STREAM_SCHEME = "gossipnet-stream-poly1305"
TAG_BYTES = 16
"""Length of the Poly1305 tag that ends a stream-signed body."""
RESPONSE_SIGNATURE_HEADER = "X-Gossipnet-Signature"
SECRET_ENV = "GOSSIPNET_SECRET"
MIN_SECRET_BYTES = 16

_AUTH_PATTERN = re.compile(
    rf"{SCHEME} timestamp=(?P<timestamp>[0-9]{{1,12}}),"
    r"nonce=(?P<nonce>[0-9a-f]{32}),signature=(?P<signature>[0-9a-f]{64})"
)

_STREAM_PATTERN = re.compile(
    rf"{STREAM_SCHEME} timestamp=(?P<timestamp>[0-9]{{1,12}}),"
    r"nonce=(?P<nonce>[0-9a-f]{32}),signature=(?P<signature>[0-9a-f]{64})"
)

logger = logging.getLogger(__name__)


class OpenSwarmWarning(UserWarning):
    """Issued when a peer runs without a swarm secret: anyone can join and send updates."""


def load_secret(
    secret_file: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> bytes | None:
    """The swarm secret from ``secret_file`` or else the ``GOSSIPNET_SECRET`` variable.

    A file's content is used verbatim except for one trailing newline. Returns
    ``None`` when neither is set. Raises ``ValueError`` (naming the source) for a
    secret shorter than 16 bytes, and ``FileNotFoundError`` for a missing file.
    """
    env = os.environ if environ is None else environ
    if secret_file is not None:
        raw = Path(secret_file).read_bytes()
        secret = raw[:-1] if raw.endswith(b"\n") else raw
        secret = secret[:-1] if secret.endswith(b"\r") else secret
        source = f"secret file {secret_file}"
    elif env.get(SECRET_ENV):
        secret = env[SECRET_ENV].encode()
        source = f"environment variable {SECRET_ENV}"
    else:
        return None
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"{source}: the swarm secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}"
        )
    return secret


def warn_open_swarm(peer_id: str) -> None:
    """Warn, through both ``warnings`` and ``logging``, that a peer runs unauthenticated."""
    message = (
        f"peer {peer_id}: NO SWARM SECRET — the swarm is OPEN: anyone who can reach this "
        f"port can read the model and push updates into it. Set --secret-file FILE or "
        f"{SECRET_ENV} on every peer."
    )
    logger.warning(message)
    warnings.warn(message, OpenSwarmWarning, stacklevel=2)


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _canonical_request(method: str, path: str, timestamp: int, nonce: str, body: bytes) -> bytes:
    return f"{method.upper()}\n{path}\n{timestamp}\n{nonce}\n{body_digest(body)}".encode()


def _mac(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign_request(
    secret: bytes,
    method: str,
    path: str,
    body: bytes,
    *,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """Headers that authenticate one request: ``{"Authorization": ...}``.

    ``timestamp`` defaults to now and ``nonce`` to 16 fresh random bytes in hex.
    """
    timestamp = int(time.time()) if timestamp is None else timestamp
    nonce = secrets.token_hex(16) if nonce is None else nonce
    signature = _mac(secret, _canonical_request(method, path, timestamp, nonce, body))
    return {"Authorization": f"{SCHEME} timestamp={timestamp},nonce={nonce},signature={signature}"}


def _canonical_stream(method: str, path: str, timestamp: int, nonce: str, length: int) -> bytes:
    return f"stream\n{method.upper()}\n{path}\n{timestamp}\n{nonce}\n{length}".encode()


def sign_stream_request(
    secret: bytes,
    method: str,
    path: str,
    length: int,
    *,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """Headers of a stream-signed request whose body has ``length`` bytes, tag included
    (the body then ends with :func:`body_tagger` ``(secret, nonce, "request")``'s tag)."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    nonce = secrets.token_hex(16) if nonce is None else nonce
    signature = _mac(secret, _canonical_stream(method, path, timestamp, nonce, length))
    return {
        "Authorization": f"{STREAM_SCHEME} timestamp={timestamp},nonce={nonce},signature={signature}"
    }


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


def request_nonce(headers: Mapping[str, str]) -> str:
    """The nonce of a signed request's ``Authorization`` header (to bind the response)."""
    header = headers.get("Authorization", "")
    match = (_STREAM_PATTERN if header.startswith(STREAM_SCHEME) else _AUTH_PATTERN).fullmatch(
        header
    )
    if match is None:
        raise Unauthorized("Authorization header missing or malformed")
    return match["nonce"]


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
    if not hmac.compare_digest(got.encode(), want.encode()):
        raise Unauthorized("response signature missing or wrong")


class NonceCache:
    """The nonces seen within the clock window, bounded to ``capacity`` entries.

    Entries older than the window are dropped (their requests would be stale
    anyway). If the cache is still full, the oldest entry is evicted and the
    *floor* rises to its timestamp: from then on every request at or below the
    floor is refused as stale, so an evicted nonce can never be replayed.
    Memory stays bounded; under a flood the effective window shrinks instead.
    """

    def __init__(self, capacity: int = 65536) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.floor = -1
        self._seen: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, nonce: object) -> bool:
        return nonce in self._seen

    def add(self, nonce: str, timestamp: int, *, oldest_valid: int) -> None:
        """Remember ``nonce``; drop entries whose timestamp is below ``oldest_valid``."""
        while self._seen:
            first_nonce, first_ts = next(iter(self._seen.items()))
            if first_ts >= oldest_valid and len(self._seen) < self.capacity:
                break
            del self._seen[first_nonce]
            if first_ts >= oldest_valid:
                self.floor = max(self.floor, first_ts)
        self._seen[nonce] = timestamp


class RequestVerifier:
    """Checks request signatures: right MAC, fresh timestamp, unseen nonce.

    ``clock_window_s`` bounds |now - timestamp| (peers' clocks must agree to that).
    Nonces are cached for the window (:class:`NonceCache`), so a replay within the
    window is refused, and one after it is stale.
    """

    def __init__(
        self, secret: bytes, *, clock_window_s: int = 60, nonce_capacity: int = 65536
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
        if clock_window_s < 1:
            raise ValueError(f"clock_window_s must be >= 1, got {clock_window_s}")
        self._secret = secret
        self.clock_window_s = clock_window_s
        self.nonces = NonceCache(nonce_capacity)

    def verify(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        now: float | None = None,
    ) -> str:
        """Return the request's nonce if it is authentic, fresh and new; else raise :class:`Unauthorized`.

        A digest-signed request (:data:`SCHEME`), its whole ``body`` read.
        """
        match = self.check_form(headers, now=now)
        if match.re is not _AUTH_PATTERN:
            raise Unauthorized(f"this request must be signed with {SCHEME}, not {STREAM_SCHEME}")
        return self.verify_digest(method, path, headers, body_digest(body), now=now)

    def check_form(self, headers: Mapping[str, str], *, now: float | None = None) -> re.Match[str]:
        """The parsed ``Authorization`` header (either scheme) if its form is right and its
        timestamp inside the clock window; else :class:`Unauthorized`. Cheap: run it before
        spending anything on the request."""
        header = headers.get("Authorization")
        if not header:
            raise Unauthorized(f"request is not signed: send 'Authorization: {SCHEME} ...'")
        pattern = _STREAM_PATTERN if header.startswith(STREAM_SCHEME + " ") else _AUTH_PATTERN
        match = pattern.fullmatch(header)
        if match is None:
            raise Unauthorized(
                f"Authorization must be '{SCHEME} (or {STREAM_SCHEME}) "
                "timestamp=<int>,nonce=<32 hex>,signature=<64 hex>'"
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
        now: float | None = None,
    ) -> str:
        """:meth:`verify` for a body whose SHA-256 hex ``digest`` the caller computed as it read."""
        match = self.check_form(headers, now=now)
        timestamp, nonce = int(match["timestamp"]), match["nonce"]
        canonical = f"{method.upper()}\n{path}\n{timestamp}\n{nonce}\n{digest}".encode()
        return self._accept(match, canonical, now)

    def verify_stream(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        length: int,
        *,
        now: float | None = None,
    ) -> str:
        """The nonce of a stream-signed request (:data:`STREAM_SCHEME`) whose header is
        authentic, fresh and new, checked before its body is read (``length``: its
        Content-Length); the body's tag is checked as it is read (:func:`body_key`)."""
        match = self.check_form(headers, now=now)
        if match.re is not _STREAM_PATTERN:
            raise Unauthorized(f"this request must be signed with {STREAM_SCHEME}")
        timestamp, nonce = int(match["timestamp"]), match["nonce"]
        canonical = _canonical_stream(method, path, timestamp, nonce, length)
        return self._accept(match, canonical, now)

    def body_key(self, nonce: str, direction: str, status: int | None = None) -> bytes:
        """:func:`body_key` under this verifier's secret."""
        return body_key(self._secret, nonce, direction, status)

    def _fresh(self, timestamp: int, now: float | None) -> None:
        current = int(time.time() if now is None else now)
        if abs(current - timestamp) > self.clock_window_s:
            raise Unauthorized(
                f"stale request: timestamp {timestamp} is more than {self.clock_window_s} s "
                f"from this peer's clock {current}"
            )
        if timestamp <= self.nonces.floor:
            raise Unauthorized("stale request: older than the replay cache's floor, resend")

    def _accept(self, match: re.Match[str], canonical: bytes, now: float | None) -> str:
        timestamp, nonce = int(match["timestamp"]), match["nonce"]
        want = _mac(self._secret, canonical)
        if not hmac.compare_digest(match["signature"].encode(), want.encode()):
            raise Unauthorized("signature does not match (wrong swarm secret or altered request)")
        current = int(time.time() if now is None else now)
        if nonce in self.nonces:
            raise Unauthorized("replayed request: nonce already seen")
        self.nonces.add(nonce, timestamp, oldest_valid=current - self.clock_window_s)
        return nonce


def server_ssl_context(
    certfile: str | os.PathLike[str],
    keyfile: str | os.PathLike[str],
    *,
    cafile: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """TLS context for a listening peer; with ``cafile`` clients must present a cert it signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    if cafile is not None:
        context.load_verify_locations(cafile)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_ssl_context(
    *,
    cafile: str | os.PathLike[str] | None = None,
    certfile: str | os.PathLike[str] | None = None,
    keyfile: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """TLS context for calling peers: verify them against ``cafile`` (default: system CAs)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if certfile is not None:
        context.load_cert_chain(certfile, keyfile)
    elif keyfile is not None:
        raise ValueError("keyfile needs certfile (the client certificate)")
    return context
