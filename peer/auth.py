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
RESPONSE_SIGNATURE_HEADER = "X-Gossipnet-Signature"
SECRET_ENV = "GOSSIPNET_SECRET"
MIN_SECRET_BYTES = 16

_AUTH_PATTERN = re.compile(
    rf"{SCHEME} timestamp=(?P<timestamp>[0-9]{{1,12}}),"
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


def request_nonce(headers: Mapping[str, str]) -> str:
    """The nonce of a signed request's ``Authorization`` header (to bind the response)."""
    match = _AUTH_PATTERN.fullmatch(headers.get("Authorization", ""))
    if match is None:
        raise Unauthorized("Authorization header missing or malformed")
    return match["nonce"]


def sign_response(secret: bytes, status: int, nonce: str, body: bytes) -> dict[str, str]:
    """The header that authenticates a response to the request carrying ``nonce``."""
    message = f"response\n{status}\n{nonce}\n{body_digest(body)}".encode()
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
        """Return the request's nonce if it is authentic, fresh and new; else raise :class:`Unauthorized`."""
        header = headers.get("Authorization")
        if not header:
            raise Unauthorized(f"request is not signed: send 'Authorization: {SCHEME} ...'")
        match = _AUTH_PATTERN.fullmatch(header)
        if match is None:
            raise Unauthorized(
                f"Authorization must be '{SCHEME} timestamp=<int>,nonce=<32 hex>,signature=<64 hex>'"
            )
        timestamp, nonce = int(match["timestamp"]), match["nonce"]
        want = _mac(self._secret, _canonical_request(method, path, timestamp, nonce, body))
        if not hmac.compare_digest(match["signature"].encode(), want.encode()):
            raise Unauthorized("signature does not match (wrong swarm secret or altered request)")
        current = int(time.time() if now is None else now)
        if abs(current - timestamp) > self.clock_window_s:
            raise Unauthorized(
                f"stale request: timestamp {timestamp} is more than {self.clock_window_s} s "
                f"from this peer's clock {current}"
            )
        if timestamp <= self.nonces.floor:
            raise Unauthorized("stale request: older than the replay cache's floor, resend")
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
