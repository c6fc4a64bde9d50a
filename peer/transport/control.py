"""The JSON endpoints (``/v1/join``, ``/v1/leave``, ``/v1/peers``, ``/v1/key``, ``/v1/status``,
``/metrics``) and the
middleware answering every HTTP error in the JSON error shape.

A signed JSON endpoint checks the header's form and clock first; a body (join) is read
through :data:`~peer.transport.admission.MAX_JSON_BYTES` and the unauthenticated byte budget
as it arrives, under the body deadline, then its digest signature is checked, and only then
is it parsed; the answer is signed. A body with a Content-Encoding is refused before it is
read (``400 malformed_request``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from peer.protocol.errors import (
    BodyTooLarge,
    InternalError,
    MalformedBody,
    ProtocolError,
    SlowBody,
    Unauthorized,
)
from peer.protocol.signatures import SCHEME, STREAM_SCHEME, is_streamed
from peer.protocol.strict_json import expect_object, loads
from peer.protocol.wire import PROTOCOL_VERSION
from peer.transport.admission import MAX_JSON_BYTES, ByteAccount
from peer.transport.answer import has_body
from peer.transport.context import ServerContext
from peer.transport.reading import check_identity, read_whole
from peer.transport.responses import error_response, http_error_response
from peer.transport.service import server_log

__all__ = ["Handler", "json_errors", "json_routes"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodyHandler = Callable[[web.Request, bytes], Awaitable[web.Response]]


async def _read_json_body(ctx: ServerContext, request: web.Request, account: ByteAccount) -> bytes:
    """A JSON control body, read whole (:func:`~peer.transport.reading.read_whole`) through
    :data:`MAX_JSON_BYTES` and the byte budget, under the body deadline."""
    deadline_s = ctx.deadline_s
    try:
        async with asyncio.timeout(deadline_s):
            return await read_whole(
                request.content,
                length=request.content_length,
                cap=MAX_JSON_BYTES,
                account=account,
            )
    except TimeoutError:
        raise SlowBody(f"body not received within {deadline_s:g} s") from None


def _check_json_header(ctx: ServerContext, request: web.Request) -> None:
    verifier = ctx.service.verifier
    if verifier is not None:
        verifier.check_form(request.headers)
        if is_streamed(request.headers):
            raise Unauthorized(
                f"{request.path} takes digest-signed requests ({SCHEME}), not {STREAM_SCHEME}"
            )


def protected(ctx: ServerContext, handler: BodyHandler, *, takes_body: bool) -> Handler:
    """``handler`` behind the JSON endpoints' checks (the module docstring), its answer
    signed. ``takes_body=False`` (a GET) refuses any body before reading it."""
    service = ctx.service

    async def checked(request: web.Request) -> web.StreamResponse:
        nonce = None
        response: web.Response
        try:
            with ctx.budget.account() as account:
                _check_json_header(ctx, request)
                length = request.content_length
                body = b""
                if not takes_body:
                    if has_body(request):
                        raise MalformedBody(f"{request.method} {request.path} takes no body")
                elif length is not None and length > MAX_JSON_BYTES:
                    raise BodyTooLarge(f"body has {length} bytes, the cap is {MAX_JSON_BYTES}")
                elif has_body(request):
                    check_identity(request.headers)
                    body = await _read_json_body(ctx, request, account)
                if service.verifier is not None:
                    nonce = service.verifier.verify(
                        request.method, request.path_qs, request.headers, body
                    )
                service.metrics.bytes(direction="in").inc(len(body))
                response = await handler(request, body)
        except ProtocolError as error:
            response = ctx.refused(request, error)
        return ctx.sign(response, nonce)

    return checked


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown paths and methods (and any other HTTP error) answer in the JSON error
    shape; an unexpected exception is a bug: ``500 internal_error``, logged."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return http_error_response(request, error)
    except Exception:
        server_log.exception("%s %s: unexpected error (a bug)", request.method, request.path)
        return error_response(InternalError("unexpected error in the peer (logged)"))


def json_routes(ctx: ServerContext) -> list[web.RouteDef]:
    """The routes of the JSON endpoints."""
    service = ctx.service

    async def join(request: web.Request, body: bytes) -> web.Response:
        obj = loads(body, what="join body", max_bytes=MAX_JSON_BYTES)
        fields = expect_object(
            obj, what="join body", required={"id": str, "address": (str, type(None))}
        )
        view = service.on_join(fields["id"], fields["address"])
        return web.json_response({"v": PROTOCOL_VERSION, "id": service.peer_id, "peers": view})

    async def leave(request: web.Request, body: bytes) -> web.Response:
        obj = loads(body, what="leave body", max_bytes=MAX_JSON_BYTES)
        fields = expect_object(obj, what="leave body", required={"id": str})
        view = service.on_leave(fields["id"])
        return web.json_response({"v": PROTOCOL_VERSION, "id": service.peer_id, "peers": view})

    async def peers(request: web.Request, body: bytes) -> web.Response:
        return web.json_response(
            {"v": PROTOCOL_VERSION, "id": service.peer_id, "peers": service.peers_view()}
        )

    async def key(request: web.Request, body: bytes) -> web.Response:
        return web.json_response(
            {"v": PROTOCOL_VERSION, "id": service.peer_id, "key": service.public_key()}
        )

    async def status(request: web.Request) -> web.StreamResponse:
        return web.json_response(service.status())

    async def metrics(request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=service.render_metrics(), headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    return [
        web.post("/v1/join", protected(ctx, join, takes_body=True)),
        web.post("/v1/leave", protected(ctx, leave, takes_body=True)),
        web.get("/v1/peers", protected(ctx, peers, takes_body=False), allow_head=False),
        web.get("/v1/key", protected(ctx, key, takes_body=False), allow_head=False),
        web.get("/v1/status", status),
        web.get("/metrics", metrics),
    ]
