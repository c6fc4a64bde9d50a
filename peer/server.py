"""The peer's HTTP server (aiohttp): endpoints, body caps, authentication, JSON errors.

Endpoints (protocol version 1, see docs/protocol.md and peer/openapi.yaml):

==========================  ==========  ======================================================
``POST /v1/exchange``       msgpack     push-pull: caller's parameters in, ours out, one round trip
``POST /v1/join``           JSON        announce ``{id, address}``; answer with our membership view
``GET  /v1/peers``          JSON        our membership view
``GET  /v1/state``          msgpack     the full model (dense codec) for a newcomer
``GET  /v1/status``         JSON        id, round, step, loss, neighbours, bytes in/out (open)
``GET  /metrics``           text        Prometheus exposition of this peer's registry (open)
==========================  ==========  ======================================================

One wrapper (``protected``) runs before every model or membership handler: it
refuses a body larger than the cap derived from the model size (413) --
aiohttp's ``client_max_size`` is set to the same cap -- and, when the swarm has
a secret, refuses unsigned, wrongly signed, stale or replayed requests (401);
the handler gets the checked body as an argument. Every
refusal is a :class:`~peer.errors.ProtocolError` answered as
``{"error": code, "detail": message}``, and nothing has touched the model.
Responses to signed requests are signed in turn (bound to the request's nonce).

At most ``service.max_concurrent_exchanges`` ``/v1/exchange`` requests are
served at once; one more is answered ``409 busy`` *before its body is read*, so
a peer never holds more than that many incoming model buffers however many
callers arrive (the caller counts it as a sign of life, not a failure).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import torch
from aiohttp import web

from peer.auth import (
    SCHEME,
    STREAM_SCHEME,
    RequestVerifier,
    body_key,
    is_streamed,
    sign_response,
    sign_response_digest,
)
from peer.body import MSGPACK, ArenaPool, EnvelopeBody, read_envelope_object
from peer.codecs import Codec
from peer.errors import BodyTooLarge, Busy, MalformedBody, ProtocolError, SlowBody, Unauthorized
from peer.metrics import PeerMetrics
from peer.threads import in_thread
from peer.wire import Envelope, ModelSpec, check_envelope, envelope_object, pack_envelope

logger = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/v1/status", "/metrics"})
"""Read-only endpoints that carry no model and answer without a signature (not wrapped)."""
MAX_JSON_BYTES = 1 << 20
"""Cap on a JSON control body (join)."""


class Service(Protocol):
    """What the server needs from a peer (``peer.node.Peer`` implements it)."""

    peer_id: str
    spec: ModelSpec
    message_spec: ModelSpec
    max_body_bytes: int
    max_concurrent_exchanges: int
    codecs: dict[str, Codec]
    verifier: RequestVerifier | None
    secret: bytes | None
    metrics: PeerMetrics

    async def on_exchange(self, envelope: Envelope, vector: torch.Tensor) -> Envelope: ...

    def on_join(self, peer_id: object, address: object) -> list[dict[str, Any]]: ...

    def peers_view(self) -> list[dict[str, Any]]: ...

    async def state_envelope(self) -> Envelope: ...

    def status(self) -> dict[str, Any]: ...

    def render_metrics(self) -> bytes: ...


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodyHandler = Callable[[web.Request, bytes], Awaitable[web.Response]]
EnvelopeHandler = Callable[[web.Request, Any, Any], Awaitable[Envelope]]

BODY_DEADLINE_S = 120.0
"""Default for the time a request body may take to arrive (``Service.body_timeout_s``)."""


def error_response(error: ProtocolError) -> web.Response:
    return web.json_response(error.to_json(), status=error.status)


def msgpack_response(envelope: Envelope) -> web.Response:
    return web.Response(body=pack_envelope(envelope), content_type=MSGPACK)


async def _read_body(request: web.Request, cap: int) -> bytes:
    """The request body, at most ``cap`` bytes (the caller checked Content-Length).

    With a Content-Length the body is read in one ``readexactly`` (one copy, where
    ``request.read()`` makes two); a chunked body goes through ``request.read()``,
    which aiohttp cuts off at ``client_max_size`` (the same cap).
    """
    length = request.content_length
    if length == 0:
        return b""
    if length is None:
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(f"body exceeds the cap of {cap} bytes") from None
    try:
        return await request.content.readexactly(length)
    except asyncio.IncompleteReadError as error:
        raise MalformedBody(
            f"body ended after {len(error.partial)} of {length} bytes (Content-Length)"
        ) from None


def _digest_of(pieces: list[Any]) -> str:
    sha = hashlib.sha256()
    for piece in pieces:
        sha.update(piece)
    return sha.hexdigest()


def build_app(service: Service) -> web.Application:
    """The aiohttp application serving ``service``'s endpoints."""

    in_flight = 0  # exchanges being served (one event loop: a plain counter is exact)
    body_timeout_s = float(getattr(service, "body_timeout_s", BODY_DEADLINE_S))
    arenas = ArenaPool(
        service.max_concurrent_exchanges, pin=bool(getattr(service, "pin_buffers", False))
    )

    def _sign(response: web.Response, nonce: str | None) -> web.Response:
        body_out = response.body
        if isinstance(body_out, bytes | bytearray):
            service.metrics.bytes(direction="out").inc(len(body_out))
            if service.secret is not None and nonce is not None:
                response.headers.update(
                    sign_response(service.secret, response.status, nonce, bytes(body_out))
                )
        return response

    def protected(handler: BodyHandler) -> Handler:
        """Run the protocol checks, then ``handler(request, body)``; sign what it answers
        (JSON control endpoints: bodies of at most ``MAX_JSON_BYTES``, digest-signed)."""

        async def checked(request: web.Request) -> web.StreamResponse:
            nonce = None
            response: web.Response
            try:
                if service.verifier is not None:
                    service.verifier.check_form(request.headers)
                    if is_streamed(request.headers):
                        raise Unauthorized(
                            f"{request.path} takes digest-signed requests ({SCHEME}), "
                            f"not {STREAM_SCHEME}"
                        )
                length = request.content_length
                if length is not None and length > service.max_body_bytes:
                    raise BodyTooLarge(
                        f"body has {length} bytes, the cap is {service.max_body_bytes}"
                    )
                async with asyncio.timeout(body_timeout_s):
                    body = await _read_body(request, service.max_body_bytes)
                if service.verifier is not None:
                    nonce = service.verifier.verify(
                        request.method, request.path_qs, request.headers, body
                    )
                service.metrics.bytes(direction="in").inc(len(body))
                response = await handler(request, body)
            except ProtocolError as error:
                response = _refused(request, error)
            except TimeoutError:
                response = _refused(
                    request, SlowBody(f"body not received within {body_timeout_s:g} s")
                )
            return _sign(response, nonce)

        return checked

    def _refused(request: web.Request, error: ProtocolError) -> web.Response:
        service.metrics.errors(code=error.code).inc()
        logger.info("%s %s refused: %s", request.method, request.path, error.detail)
        return error_response(error)

    def streamed(handler: EnvelopeHandler, *, bounded: bool) -> Handler:
        """The model-sized endpoints: authenticate before spending (header signature and
        clock window checked before an exchange slot is taken or a byte of body is read),
        read the body as it streams (into a reused buffer where the service allows),
        answer with a streamed envelope, signed as the request was.

        ``bounded``: count the request against ``max_concurrent_exchanges`` (409 busy
        beyond it, before the body is read).
        """

        async def checked(request: web.Request) -> web.StreamResponse:
            nonlocal in_flight
            nonce = None
            stream = False
            counted = False
            arena = None
            length = request.content_length
            try:
                if service.verifier is not None:
                    stream = is_streamed(request.headers)
                    if stream:
                        nonce = service.verifier.verify_stream(
                            request.method, request.path_qs, request.headers, length or 0
                        )
                    else:
                        service.verifier.check_form(request.headers)
                if length is not None and length > service.max_body_bytes:
                    raise BodyTooLarge(
                        f"body has {length} bytes, the cap is {service.max_body_bytes}"
                    )
                if bounded:
                    if in_flight >= service.max_concurrent_exchanges:
                        raise Busy(
                            f"{in_flight} exchanges in progress, the bound is "
                            f"{service.max_concurrent_exchanges}; retry later"
                        )
                    in_flight += 1
                    counted = True
                reuse = length is not None and not getattr(service, "retains_messages", True)
                obj: Any = None
                if length or (length is None and request.body_exists):
                    if reuse and length is not None:
                        arena = arenas.take(length)
                    tag_key = None
                    if stream and nonce is not None and service.verifier is not None:
                        tag_key = service.verifier.body_key(nonce, "request")
                    async with asyncio.timeout(body_timeout_s):
                        obj, digest = await read_envelope_object(
                            request.content,
                            length=length,
                            cap=service.max_body_bytes,
                            arena=arena,
                            tag_key=tag_key,
                            digest=service.verifier is not None and not stream,
                        )
                    service.metrics.bytes(direction="in").inc(length or 0)
                else:
                    digest = hashlib.sha256(b"").hexdigest()
                if service.verifier is not None and not stream:
                    assert digest is not None
                    nonce = service.verifier.verify_digest(
                        request.method, request.path_qs, request.headers, digest
                    )
                reply = await handler(request, obj, arena)
            except ProtocolError as error:
                return _sign(_refused(request, error), nonce)
            except TimeoutError:
                slow = SlowBody(f"body not received within {body_timeout_s:g} s")
                return _sign(_refused(request, slow), nonce)
            finally:
                if counted:
                    in_flight -= 1
                if arena is not None:
                    arenas.give(arena)
            return await _envelope_response(reply, nonce, stream)

        return checked

    async def _envelope_response(
        reply: Envelope, nonce: str | None, stream: bool
    ) -> web.StreamResponse:
        signing = service.secret is not None and nonce is not None
        tag_key = body_key(service.secret, nonce, "response", 200) if signing and stream else None  # type: ignore[arg-type]
        body = EnvelopeBody(envelope_object(reply), tag_key=tag_key)
        response = web.Response(body=body, status=200)
        if signing and not stream:
            digest = await asyncio.to_thread(_digest_of, body.pieces)
            response.headers.update(
                sign_response_digest(service.secret, 200, nonce, digest)  # type: ignore[arg-type]
            )
        service.metrics.bytes(direction="out").inc(body.size or 0)
        return response

    @web.middleware
    async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Unknown paths and methods answer in the same JSON error shape."""
        try:
            return await handler(request)
        except web.HTTPException as error:
            code = error.reason.lower().replace(" ", "_")
            detail = f"{request.method} {request.path}: {error.reason}"
            return web.json_response({"error": code, "detail": detail}, status=error.status)

    async def exchange(request: web.Request, obj: Any, arena: Any) -> Envelope:
        try:
            if obj is None:
                raise MalformedBody("an exchange needs a body (the caller's envelope)")
            envelope = check_envelope(obj, codecs=service.codecs)
            if envelope.sender == service.peer_id:
                raise MalformedBody(f"sender {envelope.sender!r} is this peer's own id")
            codec = service.codecs[envelope.codec]
            vector = await in_thread(codec.decode, envelope.payload, service.message_spec)
        except ProtocolError:
            service.metrics.exchanges(role="callee", outcome="refused").inc()
            raise
        reply = await service.on_exchange(envelope, vector)
        service.metrics.exchanges(role="callee", outcome="ok").inc()
        return reply

    async def join(request: web.Request, body: bytes) -> web.Response:
        if len(body) > MAX_JSON_BYTES:
            raise BodyTooLarge(f"join body has {len(body)} bytes, the cap is {MAX_JSON_BYTES}")
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise MalformedBody('join body must be JSON {"id": ..., "address": ...}') from None
        if not isinstance(obj, dict) or set(obj) != {"id", "address"}:
            raise MalformedBody("join body must be a JSON object with exactly id and address")
        view = service.on_join(obj["id"], obj["address"])
        return web.json_response({"v": 1, "id": service.peer_id, "peers": view})

    async def peers(request: web.Request, body: bytes) -> web.Response:
        return web.json_response({"v": 1, "id": service.peer_id, "peers": service.peers_view()})

    async def state(request: web.Request, obj: Any, arena: Any) -> Envelope:
        if obj is not None:
            raise MalformedBody("GET /v1/state takes no body")
        return await service.state_envelope()

    async def status(request: web.Request) -> web.StreamResponse:
        return web.json_response(service.status())

    async def metrics(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=service.render_metrics(), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    app = web.Application(middlewares=[json_errors], client_max_size=service.max_body_bytes)
    app.add_routes(
        [
            web.post("/v1/exchange", streamed(exchange, bounded=True)),
            web.post("/v1/join", protected(join)),
            web.get("/v1/peers", protected(peers)),
            web.get("/v1/state", streamed(state, bounded=False)),
            web.get("/v1/status", status),
            web.get("/metrics", metrics),
        ]
    )
    return app
