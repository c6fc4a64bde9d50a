"""What a neighbour answers a call, checked before anything of it is used: refusals
(:class:`PeerUnavailable`, :class:`RemoteRefused`, :func:`parse_refusal`), membership views
(:func:`check_view`), the signature of a digested answer, the answering peer's id, and bodies
read under a cap. :mod:`peer.transport.client` makes the calls."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

import aiohttp

from peer.protocol.auth import RESPONSE_SIGNATURE_HEADER, sign_response_digest
from peer.protocol.errors import (
    BodyTooLarge,
    MalformedBody,
    ProtocolError,
    Unauthorized,
    UnknownPeer,
)
from peer.protocol.strict_json import expect_object, loads
from peer.protocol.wire import (
    MAX_VIEW_ENTRIES,
    Envelope,
    check_sender,
    check_version,
    describe,
)

__all__ = [
    "MAX_DETAIL_CHARS",
    "MAX_JSON_BYTES",
    "PeerUnavailable",
    "RemoteRefused",
    "check_answer_digest",
    "check_key",
    "check_view",
    "from_receiver",
    "parse_refusal",
    "raise_refusal",
    "read_capped",
]

MAX_JSON_BYTES = 1 << 20
"""Cap on a JSON answer (a view, a status, an error body): the server's cap on JSON bodies."""
MAX_DETAIL_CHARS = 500
"""Longest refusal detail kept from a neighbour's error body (the rest is cut)."""
_CODE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


class PeerUnavailable(Exception):
    """A neighbour could not be reached, timed out, or failed (5xx)."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"{address}: {reason}")
        self.address = address
        self.reason = reason


class RemoteRefused(Exception):
    """A neighbour refused our request with a 4xx and a JSON error body."""

    def __init__(self, address: str, status: int, code: str, detail: str) -> None:
        super().__init__(f"{address} refused with {status} {code}: {detail}")
        self.address = address
        self.status = status
        self.code = code
        self.detail = detail


def check_answer_digest(
    secret: bytes, status: int, nonce: str, digest: str, headers: Mapping[str, str]
) -> None:
    """:func:`peer.protocol.auth.verify_response` for an answer whose SHA-256 hex ``digest``
    was computed as it was read."""
    got = headers.get(RESPONSE_SIGNATURE_HEADER, "")
    want = sign_response_digest(secret, status, nonce, digest)[RESPONSE_SIGNATURE_HEADER]
    if not hmac.compare_digest(got.encode(errors="replace"), want.encode()):
        raise Unauthorized("response signature missing or wrong")


def from_receiver(envelope: Envelope, address: str, receiver: str | None) -> Envelope:
    """``envelope`` if it was sent by ``receiver`` (when known), else :class:`UnknownPeer`."""
    if receiver is not None and envelope.sender != receiver:
        raise UnknownPeer(f"{address} answered as {envelope.sender!r}, not {receiver!r}")
    return envelope


def check_view(data: bytes, *, what: str, receiver: str | None) -> dict[str, Any]:
    """A JSON membership view (the answer to ``/v1/join`` and ``/v1/peers``), decoded strictly.

    Exactly ``{"v": <this protocol version>, "id": <peer id>, "peers": [...]}`` with at most
    :data:`~peer.protocol.wire.MAX_VIEW_ENTRIES` entries, from ``receiver`` when known. The
    entries themselves are validated one by one by :meth:`peer.node.membership.Membership.merge`,
    which skips (and logs) the bad ones. Raises only typed protocol errors.
    """
    obj = loads(data, what=what, max_bytes=MAX_JSON_BYTES)
    checked = expect_object(obj, what=what, required={"v": int, "id": str, "peers": list})
    check_version(checked["v"], field_name=f"{what}: v")
    sender = check_sender(checked["id"], field_name=f"{what}: id")
    if receiver is not None and sender != receiver:
        raise UnknownPeer(f"{what} comes from {sender!r}, not from {receiver!r}")
    if len(checked["peers"]) > MAX_VIEW_ENTRIES:
        raise MalformedBody(
            f"{what}: peers has {len(checked['peers'])} entries, at most {MAX_VIEW_ENTRIES}"
        )
    return checked


def check_key(data: bytes, *, what: str, receiver: str | None) -> bytes | None:
    """A JSON key answer (``GET /v1/key``), decoded strictly: exactly ``{"v", "id", "key"}``
    from ``receiver`` when known, ``key`` 64 hex digits (an X25519 public key) or null.
    Raises only typed protocol errors."""
    obj = loads(data, what=what, max_bytes=MAX_JSON_BYTES)
    checked = expect_object(
        obj, what=what, required={"v": int, "id": str, "key": (str, type(None))}
    )
    check_version(checked["v"], field_name=f"{what}: v")
    sender = check_sender(checked["id"], field_name=f"{what}: id")
    if receiver is not None and sender != receiver:
        raise UnknownPeer(f"{what} comes from {sender!r}, not from {receiver!r}")
    key = checked["key"]
    if key is None:
        return None
    if len(key) != 64 or set(key) - set("0123456789abcdef"):
        raise MalformedBody(f"{what}: key must be 64 lower-case hex digits, got {describe(key)}")
    return bytes.fromhex(key)


def parse_refusal(data: bytes) -> tuple[str, str]:
    """``(code, detail)`` of a neighbour's error body: the documented JSON
    ``{"error": <code>, "detail": <text>}`` (other keys ignored), decoded strictly; anything
    else is code ``unknown`` with the body's start as detail. The code is lower-case
    ``[a-z0-9_]``, at most 64 characters; the detail printable, at most
    :data:`MAX_DETAIL_CHARS` (a neighbour's text goes into our logs)."""
    code, detail = "unknown", data[:200].decode("utf-8", errors="replace")
    try:
        obj = loads(data, what="error body", max_bytes=MAX_JSON_BYTES, max_depth=2)
    except ProtocolError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("error"), str):
        error = obj["error"]
        if 0 < len(error) <= 64 and set(error) <= _CODE_CHARS:
            code = error
            detail = obj["detail"] if isinstance(obj.get("detail"), str) else ""
    detail = detail[:MAX_DETAIL_CHARS]
    return code, "".join(c if c.isprintable() else "?" for c in detail)


def raise_refusal(address: str, status: int, data: bytes) -> None:
    """A 5xx as :class:`PeerUnavailable`; a 4xx (a refusal: nothing was applied, so it need
    not be signed) as :class:`RemoteRefused` with its code and detail (:func:`parse_refusal`); a
    3xx (the protocol never redirects, and we follow none) as :class:`MalformedBody`."""
    if status >= 500:
        raise PeerUnavailable(address, f"HTTP {status}")
    if status < 400:
        raise MalformedBody(f"{address} answered HTTP {status}; the protocol never redirects")
    code, detail = parse_refusal(data)
    raise RemoteRefused(address, status, code, detail)


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """The response body, refusing more than ``cap`` bytes before buffering them."""
    length = response.content_length
    if length is not None:
        if length > cap:
            raise BodyTooLarge(f"response has {length} bytes, the cap is {cap}")
        return await response.read()
    chunks, total = [], 0
    async for chunk in response.content.iter_chunked(1 << 20):
        total += len(chunk)
        if total > cap:
            raise BodyTooLarge(f"response exceeds the cap of {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
