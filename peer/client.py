"""Outgoing calls to other peers: signed, timed out, size-capped, responses validated.

Every call has a total timeout. A neighbour that cannot be reached, times out or
answers 5xx raises :class:`PeerUnavailable`; one that refuses our request with a
4xx raises :class:`RemoteRefused` (its JSON error code and detail attached).
Both count as a failed call for membership. A response that is too large,
unsigned (when the swarm has a secret) or malformed raises the same typed
:class:`~peer.errors.ProtocolError` the server would answer with.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
from collections.abc import Callable
from typing import Any

import aiohttp
import torch

from peer.auth import (
    body_key,
    request_nonce,
    sign_request,
    sign_stream_request,
    verify_response,
)
from peer.body import MSGPACK, EnvelopeBody, read_envelope_object
from peer.errors import BodyTooLarge, MalformedBody, Unauthorized
from peer.server import MAX_JSON_BYTES
from peer.wire import Envelope, check_envelope, envelope_object


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


class PeerClient:
    """Calls other peers' endpoints over one pooled ``aiohttp.ClientSession``.

    Args:
        secret: swarm secret to sign requests and check response signatures (``None``: open).
        timeout_s: total time allowed per call (connect, send, receive).
        max_body_bytes: cap on any response body (the model-derived cap).
        ssl_context: client TLS context; when given, peers are called over ``https``.
        on_bytes: called as ``on_bytes("out", n)`` / ``on_bytes("in", n)`` with the body
            bytes of every request sent and response read (traffic accounting).
    """

    def __init__(
        self,
        *,
        secret: bytes | None,
        timeout_s: float,
        max_body_bytes: int,
        ssl_context: ssl.SSLContext | None = None,
        on_bytes: Callable[[str, int], None] | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.secret = secret
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_body_bytes = max_body_bytes
        self.ssl_context = ssl_context
        self.scheme = "https" if ssl_context is not None else "http"
        self._session: aiohttp.ClientSession | None = None
        self.on_bytes = on_bytes

    async def __aenter__(self) -> PeerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self.ssl_context if self.ssl_context else True)
            self._session = aiohttp.ClientSession(timeout=self.timeout, connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        address: str,
        path: str,
        body: bytes = b"",
        *,
        content_type: str = MSGPACK,
        max_body_bytes: int | None = None,
    ) -> bytes:
        """Send one signed request; return the verified response body of a 2xx."""
        cap = self.max_body_bytes if max_body_bytes is None else max_body_bytes
        headers = {"Content-Type": content_type} if body else {}
        nonce = None
        if self.secret is not None:
            signed = sign_request(self.secret, method, path, body)
            nonce = request_nonce(signed)
            headers.update(signed)
        url = f"{self.scheme}://{address}{path}"
        try:
            async with self._get_session().request(
                method, url, data=body or None, headers=headers
            ) as response:
                data = await _read_capped(response, cap)
                status = response.status
                response_headers = response.headers
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as error:
            raise PeerUnavailable(address, f"{type(error).__name__}: {error}") from error
        if self.on_bytes is not None:
            self.on_bytes("out", len(body))
            self.on_bytes("in", len(data))
        if status >= 400:
            _raise_refusal(address, status, data)
        if self.secret is not None and nonce is not None:
            verify_response(self.secret, status, nonce, data, response_headers)
        return data

    async def exchange(
        self,
        address: str,
        envelope: Envelope,
        *,
        codecs: set[str] | frozenset[str] | Any,
        arena: torch.Tensor | None = None,
    ) -> Envelope:
        """``POST /v1/exchange``: send our envelope, return the neighbour's (frame validated).

        Our envelope streams from its tensors' memory; the answer's tensor bytes land in
        ``arena`` (a byte buffer the caller reuses once it is done with the answer) or in a
        fresh buffer.
        """
        obj = await self._envelope_call("POST", address, "/v1/exchange", envelope, arena=arena)
        return check_envelope(obj, codecs=codecs)

    async def state(self, address: str, *, codecs: Any) -> Envelope:
        """``GET /v1/state``: the neighbour's full model as a dense envelope."""
        obj = await self._envelope_call("GET", address, "/v1/state", None)
        return check_envelope(obj, codecs=codecs)

    async def _envelope_call(
        self,
        method: str,
        address: str,
        path: str,
        envelope: Envelope | None,
        *,
        arena: torch.Tensor | None = None,
    ) -> Any:
        """One stream-signed call whose request and answer are envelopes: the request body
        is written from its tensors' memory with its tag computed as it goes, the answer
        parsed and authenticated as it arrives (``peer.body``)."""
        nonce = secrets.token_hex(16) if self.secret is not None else None
        tag_key = (
            body_key(self.secret, nonce, "request")
            if self.secret is not None and nonce is not None and envelope is not None
            else None
        )
        body = EnvelopeBody(envelope_object(envelope), tag_key=tag_key) if envelope else None
        length = body.size or 0 if body is not None else 0
        headers: dict[str, str] = {}
        if self.secret is not None:
            headers.update(sign_stream_request(self.secret, method, path, length, nonce=nonce))
        url = f"{self.scheme}://{address}{path}"
        try:
            async with self._get_session().request(
                method, url, data=body, headers=headers
            ) as response:
                status = response.status
                if status >= 400:
                    data = await _read_capped(response, MAX_JSON_BYTES)
                else:
                    response_key = (
                        body_key(self.secret, nonce, "response", status)
                        if self.secret is not None and nonce is not None
                        else None
                    )
                    try:
                        obj, _ = await read_envelope_object(
                            response.content,
                            length=response.content_length,
                            cap=self.max_body_bytes,
                            arena=arena,
                            tag_key=response_key,
                        )
                    except Unauthorized as error:
                        raise Unauthorized(
                            f"response signature missing or wrong: {error.detail}"
                        ) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as error:
            raise PeerUnavailable(address, f"{type(error).__name__}: {error}") from error
        if self.on_bytes is not None:
            self.on_bytes("out", length)
            self.on_bytes("in", response.content_length or 0)
        if status >= 400:
            _raise_refusal(address, status, data)
        return obj

    async def join(self, address: str, peer_id: str, own_address: str | None) -> dict[str, Any]:
        """``POST /v1/join``: announce ourselves; returns ``{"v", "id", "peers"}``."""
        body = json.dumps({"id": peer_id, "address": own_address}).encode()
        data = await self.request(
            "POST",
            address,
            "/v1/join",
            body,
            content_type="application/json",
            max_body_bytes=MAX_JSON_BYTES,
        )
        return _json_view(data)

    async def peers(self, address: str) -> dict[str, Any]:
        """``GET /v1/peers``: the neighbour's membership view."""
        data = await self.request("GET", address, "/v1/peers", max_body_bytes=MAX_JSON_BYTES)
        return _json_view(data)


def _raise_refusal(address: str, status: int, data: bytes) -> None:
    """A 5xx as :class:`PeerUnavailable`; a 4xx (a refusal: nothing was applied, so it need
    not be signed) as :class:`RemoteRefused` with its JSON error code and detail."""
    if status >= 500:
        raise PeerUnavailable(address, f"HTTP {status}")
    try:
        err = json.loads(data)
        code, detail = str(err["error"]), str(err["detail"])
    except (ValueError, KeyError, TypeError):
        code, detail = "unknown", data[:200].decode(errors="replace")
    raise RemoteRefused(address, status, code, detail)


def _json_view(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        raise MalformedBody("membership view is not JSON") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("peers"), list) or "id" not in obj:
        raise MalformedBody("membership view must be a JSON object with id and a peers list")
    return obj


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
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
