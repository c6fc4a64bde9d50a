"""Outgoing calls to other peers: signed for their receiver, timed out, size-capped, and every
answer decoded strictly.

Every call has a total timeout and follows no redirect. A neighbour that cannot be reached,
times out, breaks the HTTP framing or answers 5xx raises :class:`PeerUnavailable`; one that
refuses our request with a 4xx raises :class:`RemoteRefused` (its JSON error code and
detail attached, bounded and printable; an error body that is not the documented JSON
becomes code ``unknown``). Both count as a failed call for membership. Any other answer is
decoded by the strict decoders and nothing else (:func:`peer.protocol.strict_json.loads` for JSON,
:func:`peer.transport.body.read_envelope_object` and :func:`peer.protocol.wire.check_envelope` for envelopes):
a response that is too large, unsigned or wrongly signed (when the swarm has a secret),
malformed, of another protocol version or from another peer than the one called raises the
same typed :class:`~peer.protocol.errors.ProtocolError` the server would answer with. These three
are the only exceptions a call raises for anything a neighbour sends.

With a swarm secret, a request is signed for its receiver's peer id (``peer.protocol.auth``: the
signed text names it, so nobody else accepts it). Callers that know the member they call
pass its id (``receiver=``); for a bare address (a bootstrap join) the client first asks
the open ``GET /v1/status`` which peer listens there, decoded as strictly. A neighbour that
lies there only gets our request refused by the real peer; the answer must then come from
the peer we signed for (:class:`~peer.protocol.errors.UnknownPeer` otherwise).
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import ssl
from collections.abc import Callable, Collection
from typing import Any

import aiohttp
import torch

from peer.protocol.auth import (
    body_key,
    sign_request,
    sign_stream_request,
    verify_response,
)
from peer.protocol.errors import (
    MalformedBody,
    Unauthorized,
)
from peer.protocol.strict_json import loads
from peer.protocol.threads import in_thread
from peer.protocol.wire import (
    Envelope,
    check_envelope,
    check_sender,
    check_version,
    envelope_object,
)
from peer.transport import socket_reads
from peer.transport.answers import (
    MAX_JSON_BYTES,
    PeerUnavailable,
    RemoteRefused,
    check_answer_digest,
    check_key,
    check_view,
    from_receiver,
    raise_refusal,
    read_capped,
)
from peer.transport.body import MSGPACK, EnvelopeBody, read_envelope_object
from peer.transport.receive import can_take_over, take_over
from peer.transport.shaping import EmulatedLink

__all__ = ["EXPECT_CONTINUE_BYTES", "PeerClient", "PeerUnavailable", "RemoteRefused"]

_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
"""What aiohttp raises for an unreachable, slow or broken neighbour (HTTP framing errors
included: aiohttp reports them as ``ClientResponseError``/``ClientPayloadError``)."""


EXPECT_CONTINUE_BYTES = 1 << 20
"""A model body of at least this many bytes is sent with ``Expect: 100-continue``: the callee
refuses a busy or unauthenticated exchange on its headers, before the model crosses the
network (one round trip more per exchange, against a model-sized transfer saved per refusal)."""


class PeerClient:
    """Calls other peers' endpoints over one pooled ``aiohttp.ClientSession``.

    Args:
        secret: swarm secret to sign requests and check response signatures (``None``: open).
        timeout_s: total time allowed per call (connect, send, receive).
        max_body_bytes: cap on any response body (the model-derived cap).
        ssl_context: client TLS context; when given, peers are called over ``https``.
        on_bytes: called as ``on_bytes("out", n)`` / ``on_bytes("in", n)`` with the body
            bytes of every request sent and response read (traffic accounting).
        direct_reads: read a model-sized answer straight from the socket
            (``peer.transport.receive``); ``False``: through aiohttp's stream, the same
            bytes. ``None`` follows :data:`peer.transport.socket_reads.DIRECT_READS` when
            the client is made.
        stream_signed: with a secret, sign envelope calls (``/v1/exchange``,
            ``/v1/state``) with the stream scheme, a Poly1305 tag computed as the body goes
            out and as the answer comes in; ``False``: the digest scheme, the body's SHA-256
            computed whole before it is sent and the answer's checked once it is read (the
            callee must then admit a digest-signed model-sized body: its
            ``max_unauthenticated_bytes``). The same bits either way.
        link: the peer's emulated uplink (``peer.transport.shaping``): every envelope body
            sent is delayed, paced and perhaps lost on it (a lost one raises
            :class:`PeerUnavailable` once its time on the link has passed). ``None``: not
            shaped.

    ``direct_reads`` and ``stream_signed`` are kept as attributes of the same names, read at
    every call.

    Every call takes ``receiver``, the id of the peer at ``address``: the request is signed
    for it and its answer must come from it. Leave it out only when the id is unknown (a
    bare address): with a secret, the call then costs one ``GET /v1/status`` more.
    """

    def __init__(
        self,
        *,
        secret: bytes | None,
        timeout_s: float,
        max_body_bytes: int,
        ssl_context: ssl.SSLContext | None = None,
        on_bytes: Callable[[str, int], None] | None = None,
        direct_reads: bool | None = None,
        stream_signed: bool = True,
        link: EmulatedLink | None = None,
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
        self.direct_reads = socket_reads.DIRECT_READS if direct_reads is None else direct_reads
        self.stream_signed = stream_signed
        self.link = link

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

    # ------------------------------------------------------------------ who is there

    async def peer_id(self, address: str) -> str:
        """``GET /v1/status`` (open, unsigned): the id of the peer listening at ``address``.

        Decoded strictly: a JSON object whose ``v`` is this protocol version and whose
        ``id`` is a peer id (other fields are not read). Nothing here is trusted beyond
        naming whom to sign for: a wrong id only gets our request refused by the real peer.
        """
        status, data, _ = await self._send("GET", address, "/v1/status", b"", {}, MAX_JSON_BYTES)
        if status >= 300:
            raise_refusal(address, status, data)
        what = f"status of {address}"
        obj = loads(data, what=what, max_bytes=MAX_JSON_BYTES)
        if not isinstance(obj, dict) or "v" not in obj or "id" not in obj:
            raise MalformedBody(f"{what} must be a JSON object with v and id")
        check_version(obj["v"], field_name=f"{what}: v")
        return check_sender(obj["id"], field_name=f"{what}: id")

    async def _receiver(self, address: str, receiver: str | None) -> str | None:
        """Whom to sign for: ``receiver``, or (with a secret) the id ``address`` names."""
        if receiver is not None:
            return check_sender(receiver, field_name="receiver")
        if self.secret is None:
            return None
        return await self.peer_id(address)

    # ------------------------------------------------------------------ JSON calls

    async def request(
        self,
        method: str,
        address: str,
        path: str,
        body: bytes = b"",
        *,
        receiver: str | None = None,
        content_type: str = MSGPACK,
        max_body_bytes: int | None = None,
    ) -> bytes:
        """Send one digest-signed request to ``receiver`` at ``address``; return the verified
        body of a 2xx answer (:class:`RemoteRefused` or :class:`PeerUnavailable` otherwise)."""
        cap = self.max_body_bytes if max_body_bytes is None else max_body_bytes
        headers = {"Content-Type": content_type} if body else {}
        nonce = None
        if self.secret is not None:
            to = await self._receiver(address, receiver)
            assert to is not None  # a secret always resolves the receiver
            nonce = secrets.token_hex(16)
            headers.update(sign_request(self.secret, method, path, body, receiver=to, nonce=nonce))
        status, data, response_headers = await self._send(method, address, path, body, headers, cap)
        if self.on_bytes is not None:
            self.on_bytes("out", len(body))
            self.on_bytes("in", len(data))
        if status >= 300:
            raise_refusal(address, status, data)
        if self.secret is not None and nonce is not None:
            verify_response(self.secret, status, nonce, data, response_headers)
        return data

    async def _send(
        self,
        method: str,
        address: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        cap: int,
    ) -> tuple[int, bytes, Any]:
        """One HTTP round trip: ``(status, body of at most cap bytes, headers)``."""
        url = f"{self.scheme}://{address}{path}"
        try:
            async with self._get_session().request(
                method, url, data=body or None, headers=headers, allow_redirects=False
            ) as response:
                status = response.status
                data = await read_capped(response, cap if status < 300 else MAX_JSON_BYTES)
                return status, data, response.headers
        except _NETWORK_ERRORS as error:
            raise PeerUnavailable(address, f"{type(error).__name__}: {error}") from error

    async def join(
        self,
        address: str,
        peer_id: str,
        own_address: str | None,
        *,
        receiver: str | None = None,
    ) -> dict[str, Any]:
        """``POST /v1/join``: announce ourselves; returns ``{"v", "id", "peers"}``, checked
        (:func:`check_view`: the entries of ``peers`` are the membership's to validate)."""
        to = await self._receiver(address, receiver)
        body = json.dumps({"id": peer_id, "address": own_address}).encode()
        data = await self.request(
            "POST",
            address,
            "/v1/join",
            body,
            receiver=to,
            content_type="application/json",
            max_body_bytes=MAX_JSON_BYTES,
        )
        return check_view(data, what=f"join answer of {address}", receiver=to)

    async def leave(
        self, address: str, peer_id: str, *, receiver: str | None = None
    ) -> dict[str, Any]:
        """``POST /v1/leave``: say goodbye (we stop cleanly); returns the callee's view,
        checked (:func:`check_view`)."""
        to = await self._receiver(address, receiver)
        data = await self.request(
            "POST",
            address,
            "/v1/leave",
            json.dumps({"id": peer_id}).encode(),
            receiver=to,
            content_type="application/json",
            max_body_bytes=MAX_JSON_BYTES,
        )
        return check_view(data, what=f"leave answer of {address}", receiver=to)

    async def peers(self, address: str, *, receiver: str | None = None) -> dict[str, Any]:
        """``GET /v1/peers``: the neighbour's membership view, checked (:func:`check_view`)."""
        to = await self._receiver(address, receiver)
        data = await self.request(
            "GET", address, "/v1/peers", receiver=to, max_body_bytes=MAX_JSON_BYTES
        )
        return check_view(data, what=f"membership view of {address}", receiver=to)

    async def public_key(self, address: str, *, receiver: str | None = None) -> bytes | None:
        """``GET /v1/key``: the neighbour's X25519 public key for secure sums (32 bytes), or
        None if it runs none; the answer is signed (with a secret) and checked
        (:func:`check_key`)."""
        to = await self._receiver(address, receiver)
        data = await self.request(
            "GET", address, "/v1/key", receiver=to, max_body_bytes=MAX_JSON_BYTES
        )
        return check_key(data, what=f"key answer of {address}", receiver=to)

    # ------------------------------------------------------------------ envelope calls

    async def exchange(
        self,
        address: str,
        envelope: Envelope,
        *,
        codecs: Collection[str],
        receiver: str | None = None,
        arena: torch.Tensor | None = None,
    ) -> Envelope:
        """``POST /v1/exchange``: send our envelope, return the neighbour's (frame validated,
        sent by ``receiver`` when given).

        Our envelope streams from its tensors' memory; the answer's tensor bytes land in
        ``arena`` (a byte buffer the caller reuses once it is done with the answer) or in a
        fresh buffer.
        """
        to = await self._receiver(address, receiver)
        obj = await self._envelope_call("POST", address, "/v1/exchange", envelope, to, arena)
        return from_receiver(check_envelope(obj, codecs=codecs), address, to)

    async def state(
        self, address: str, *, codecs: Collection[str], receiver: str | None = None
    ) -> Envelope:
        """``GET /v1/state``: the neighbour's full model as a dense envelope."""
        to = await self._receiver(address, receiver)
        obj = await self._envelope_call("GET", address, "/v1/state", None, to, None)
        return from_receiver(check_envelope(obj, codecs=codecs), address, to)

    async def _envelope_call(
        self,
        method: str,
        address: str,
        path: str,
        envelope: Envelope | None,
        receiver: str | None,
        arena: torch.Tensor | None,
    ) -> Any:
        """One signed call whose request and answer are envelopes: the request body is
        written from its tensors' memory, the answer parsed as it arrives
        (``peer.transport.body``). Stream-signed (:attr:`stream_signed`): the tags are
        computed as the bytes go; else digest-signed: the request's digest is computed
        before it is sent, the answer's as it is read, and checked once it is whole."""
        secret = self.secret
        stream = self.stream_signed
        nonce = secrets.token_hex(16)
        tag_key = (
            body_key(secret, nonce, "request")
            if secret is not None and envelope is not None and stream
            else None
        )
        link = self.link if envelope is not None else None
        delay, lost = link.draw() if link is not None else (0.0, False)
        body = (
            EnvelopeBody(envelope_object(envelope), tag_key=tag_key, link=link, delay=delay)
            if envelope
            else None
        )
        length = body.size or 0 if body is not None else 0
        if lost:
            await self._lose(address, body, delay, length)
        headers: dict[str, str] = {}
        if secret is not None:
            assert receiver is not None  # a secret always resolves the receiver
            if stream:
                headers.update(
                    sign_stream_request(
                        secret, method, path, length, receiver=receiver, nonce=nonce
                    )
                )
            else:
                headers.update(
                    await _digest_signed(secret, method, path, body, receiver=receiver, nonce=nonce)
                )
        url = f"{self.scheme}://{address}{path}"
        obj: Any = None
        data = b""
        started = asyncio.get_running_loop().time()
        try:
            async with self._get_session().request(
                method,
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
                expect100=length >= EXPECT_CONTINUE_BYTES,
            ) as response:
                status = response.status
                received = response.content_length or 0
                if status >= 300:
                    data = await read_capped(response, MAX_JSON_BYTES)
                else:
                    response_key = (
                        body_key(secret, nonce, "response", status)
                        if secret is not None and stream
                        else None
                    )
                    digested = secret is not None and not stream
                    try:
                        obj, digest = await self._read_answer(
                            response, arena, response_key, started, digest=digested
                        )
                        if secret is not None and digest is not None:
                            check_answer_digest(secret, status, nonce, digest, response.headers)
                    except Unauthorized as error:
                        raise Unauthorized(
                            f"response signature missing or wrong: {error.detail}"
                        ) from None
        except _NETWORK_ERRORS as error:
            raise PeerUnavailable(address, f"{type(error).__name__}: {error}") from error
        finally:
            if body is not None:
                await body.settled()  # a worker still filling a growing piece of it
                body.release()
        if self.on_bytes is not None:
            self.on_bytes("out", length)
            self.on_bytes("in", received)
        if status >= 300:
            raise_refusal(address, status, data)
        return obj

    async def _lose(
        self, address: str, body: EnvelopeBody | None, delay: float, length: int
    ) -> None:
        """A request body lost on the emulated link: its time passes, it never arrives."""
        assert self.link is not None
        try:
            await self.link.spend(delay, length)
        finally:
            if body is not None:
                await body.settled()
                body.release()
        if self.on_bytes is not None:
            self.on_bytes("out", length)
        raise PeerUnavailable(address, "message lost on the emulated link (message_loss)")

    async def _read_answer(
        self,
        response: aiohttp.ClientResponse,
        arena: torch.Tensor | None,
        tag_key: bytes | None,
        started: float,
        *,
        digest: bool,
    ) -> tuple[Any, str | None]:
        """An envelope answer, parsed and authenticated (``tag_key``) or digested
        (``digest``: its SHA-256 hex is returned) as it arrives. A model-sized one is read
        straight into ``arena`` (``peer.transport.receive``, where :attr:`direct_reads`),
        under what is left of the call's total timeout (its connection gets a fresh parser,
        in step with it again); a smaller one through aiohttp's stream."""
        length = response.content_length
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        direct = None
        if (
            self.direct_reads
            and length is not None
            and protocol is not None
            and can_take_over(response.headers, length)
        ):
            direct = take_over(protocol.transport, protocol, response.content, length=length)
        if direct is None:
            return await read_envelope_object(
                response.content,
                length=length,
                cap=self.max_body_bytes,
                arena=arena,
                tag_key=tag_key,
                digest=digest,
            )
        read_whole = False
        try:
            deadline = started + (self.timeout.total or math.inf)
            async with asyncio.timeout_at(deadline if math.isfinite(deadline) else None):
                answer = await read_envelope_object(
                    direct,
                    length=length,
                    cap=self.max_body_bytes,
                    arena=arena,
                    tag_key=tag_key,
                    digest=digest,
                )
            read_whole = True
            return answer
        finally:
            if read_whole and protocol is not None:
                # a fresh parser in step with the connection (the next request makes its
                # own anyway): the connection can go back to the pool
                protocol.set_response_params()
                direct.finish(response.content, keep_alive=True)
            else:
                if protocol is not None:
                    protocol.force_close()
                direct.abandon()


async def _digest_signed(
    secret: bytes,
    method: str,
    path: str,
    body: EnvelopeBody | None,
    *,
    receiver: str,
    nonce: str,
) -> dict[str, str]:
    """The digest-scheme headers of an envelope call (``peer.protocol.auth.sign_request``):
    the body, once whole, joined and hashed in a worker thread."""
    pieces = await body.written_pieces() if body is not None else []
    return await in_thread(
        lambda: sign_request(secret, method, path, b"".join(pieces), receiver=receiver, nonce=nonce)
    )
