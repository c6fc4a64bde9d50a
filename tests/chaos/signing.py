"""Requests signed the way a swarm member signs them, built with ``peer.protocol.auth``'s own functions.

The suite signs hostile bodies with the real secret (a *member* attacking), forges
signatures with a wrong one, and captures signed requests to replay them. It calls the
peer's signing functions rather than re-implementing them: a signature names its receiving
peer and protocol version, and its timestamp is in milliseconds (docs/protocol.md).
"""

from __future__ import annotations

import secrets

from peer.protocol import auth
from peer.protocol.wire import PROTOCOL_VERSION
from peer.transport.body import poly1305_tag


def stamp_seconds_ago(seconds: float) -> int:
    """A signature timestamp ``seconds`` in the past (negative: the future)."""
    return auth.now_ms() - int(seconds * 1000)


def sign(
    secret: bytes,
    method: str,
    path: str,
    body: bytes,
    *,
    receiver: str,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """The ``Authorization`` header of a digest-signed request to peer ``receiver``."""
    return auth.sign_request(
        secret, method, path, body, receiver=receiver, timestamp=timestamp, nonce=nonce
    )


def sign_stream(
    secret: bytes, method: str, path: str, payload: bytes, *, receiver: str
) -> tuple[dict[str, str], bytes]:
    """Headers and body of a stream-signed request: ``payload`` followed by its Poly1305 tag
    under the request's one-time key (an empty payload is sent without a tag)."""
    nonce = secrets.token_hex(16)
    length = len(payload) + (auth.TAG_BYTES if payload else 0)
    headers = auth.sign_stream_request(secret, method, path, length, receiver=receiver, nonce=nonce)
    if not payload:
        return headers, b""
    return headers, payload + poly1305_tag(auth.body_key(secret, nonce, "request"), payload)


def nonce_of(headers: dict[str, str]) -> str:
    """The nonce a signed request's ``Authorization`` header carries."""
    return auth.request_nonce(headers)


def sign_json_response(secret: bytes, status: int, nonce: str, body: bytes) -> dict[str, str]:
    """The signature header a member puts on a JSON answer to the request with ``nonce``."""
    return auth.sign_response(secret, status, nonce, body)


def stream_response_body(secret: bytes, status: int, nonce: str, payload: bytes) -> bytes:
    """A stream-signed answer's body: ``payload`` and its tag under the response key."""
    return payload + poly1305_tag(auth.body_key(secret, nonce, "response", status), payload)


def junk_authorization(rng_bytes: bytes, *, receiver: str, scheme: str = auth.SCHEME) -> str:
    """An ``Authorization`` header of the right form and a fresh timestamp whose signature is
    wrong (``rng_bytes``: 48 random bytes): it passes a form and clock check, not the MAC."""
    nonce, signature = rng_bytes[:16].hex(), rng_bytes[16:48].hex()
    return (
        f"{scheme} v={PROTOCOL_VERSION},to={receiver},timestamp={auth.now_ms()},"
        f"nonce={nonce},signature={signature}"
    )
