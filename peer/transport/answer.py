"""Model-sized answers: an envelope written while its slot is held, signed as its request
was, under the body deadline; and ``GET /v1/state``, which is nothing but such an answer."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from peer.protocol.auth import body_key, is_streamed, sign_response_digest
from peer.protocol.errors import Busy, MalformedBody, ProtocolError
from peer.protocol.growing import ProducerFailed
from peer.protocol.wire import Envelope, envelope_object
from peer.transport.body import MSGPACK, EnvelopeBody
from peer.transport.context import ServerContext
from peer.transport.service import ANSWERED, DIRECT_READ, server_log

__all__ = ["has_body", "send_envelope", "state_endpoint"]


def has_body(request: web.Request) -> bool:
    """Whether the request announces a body (a Content-Length above 0, or chunked)."""
    length = request.content_length
    return bool(length) or (length is None and request.body_exists)


def _digest_of(pieces: list[Any]) -> str:
    sha = hashlib.sha256()
    for piece in pieces:
        sha.update(piece)
    return sha.hexdigest()


async def send_envelope(
    ctx: ServerContext, request: web.Request, reply: Envelope, nonce: str | None, stream: bool
) -> web.StreamResponse:
    """Write ``reply`` now (the caller holds its slot until it is written), signed as the
    request was (``stream``: a Poly1305 tag trailer; else a digest signature header), under
    the body deadline; a reader too slow for it is cut off (``request[ANSWERED]``). On an
    emulated link (``ctx.link``) it is delayed and paced, and a lost answer takes its time,
    then the connection is cut (``unanswered``: the caller gets nothing)."""
    secret = ctx.service.secret
    signing = secret is not None and nonce is not None
    tag_key = None
    if signing and stream:
        tag_key = body_key(secret, nonce, "response", 200)  # type: ignore[arg-type]
    link = ctx.link
    delay, lost = link.draw() if link is not None else (0.0, False)
    body = EnvelopeBody(envelope_object(reply), tag_key=tag_key, link=link, delay=delay)
    try:
        if lost:
            return await _lose_answer(ctx, request, body, delay)
        return await _write_envelope(ctx, request, body, nonce, signing and not stream)
    finally:
        await body.settled()  # a worker still filling the answer keeps the slot
        body.release()  # the answer's memory goes with the slot


async def _lose_answer(
    ctx: ServerContext, request: web.Request, body: EnvelopeBody, delay: float
) -> web.StreamResponse:
    """An answer lost on the emulated link: its time on the link passes, then the
    connection is cut before a byte of it is written."""
    assert ctx.link is not None
    ctx.service.metrics.bytes(direction="out").inc(body.size or 0)
    await ctx.link.spend(delay, body.size or 0)
    server_log.info("%s %s: answer lost on the emulated link", request.method, request.path)
    request[ANSWERED] = "unanswered"
    if request.transport is not None:
        request.transport.abort()
    return web.StreamResponse(status=200)


async def _write_envelope(
    ctx: ServerContext,
    request: web.Request,
    body: EnvelopeBody,
    nonce: str | None,
    digest_signed: bool,
) -> web.StreamResponse:
    response = web.StreamResponse(status=200)
    response.content_type = MSGPACK
    response.content_length = body.size
    if request.get(DIRECT_READ):
        response.force_close()
    if digest_signed:
        pieces = await body.written_pieces()
        digest = await asyncio.to_thread(_digest_of, pieces)
        response.headers.update(
            sign_response_digest(ctx.service.secret, 200, nonce, digest)  # type: ignore[arg-type]
        )
    ctx.service.metrics.bytes(direction="out").inc(body.size or 0)
    deadline_s = ctx.deadline_s
    try:
        async with asyncio.timeout(deadline_s):
            writer: AbstractStreamWriter | None = await response.prepare(request)
            if writer is not None:
                await body.write(writer)
            await response.write_eof()
    except (TimeoutError, ConnectionError) as error:
        server_log.info(
            "%s %s: answer not taken within %g s (%s); connection closed",
            request.method,
            request.path,
            deadline_s,
            type(error).__name__,
        )
        request[ANSWERED] = "unanswered"
        if request.transport is not None:
            request.transport.abort()
    except ProducerFailed as error:
        # the answer's headers are out: the caller gets a cut body, and applies nothing
        # (our own model non-finite: training diverged; anything else is a bug, whose
        # traceback --log-level DEBUG shows)
        cause = error.__cause__
        server_log.error(
            "%s %s: the answer failed mid-way (%s: %s); connection closed, model unchanged",
            request.method,
            request.path,
            type(cause).__name__,
            cause,
        )
        server_log.debug("the answer's failure", exc_info=cause)
        request[ANSWERED] = "failed"
        if request.transport is not None:
            request.transport.abort()
    return response


async def state_endpoint(ctx: ServerContext, request: web.Request) -> web.StreamResponse:
    """``GET /v1/state``: verified whole before anything (it has no body), then it waits
    for a slot (a snapshot of the model is one model copy) up to the body deadline."""
    nonce = None
    stream = False
    slot = False
    deadline_s = ctx.deadline_s
    try:
        verifier = ctx.service.verifier
        if verifier is not None:
            stream = is_streamed(request.headers)
            if stream:
                nonce = verifier.verify_stream(request.method, request.path_qs, request.headers, 0)
            else:
                verifier.check_form(request.headers)
        if has_body(request):
            raise MalformedBody("GET /v1/state takes no body")
        if verifier is not None and not stream:
            empty = hashlib.sha256(b"").hexdigest()
            nonce = verifier.verify_digest(request.method, request.path_qs, request.headers, empty)
        try:
            await ctx.slots.take(deadline_s)
        except TimeoutError:
            raise Busy(
                f"no exchange slot freed within {deadline_s:g} s (the bound is "
                f"{ctx.slots.size}); retry later"
            ) from None
        slot = True
        reply = await ctx.service.state_envelope()
        return await send_envelope(ctx, request, reply, nonce, stream)
    except ProtocolError as error:
        return ctx.sign(ctx.refused(request, error), nonce)
    finally:
        if slot:
            ctx.slots.give()
