"""``POST /v1/exchange``: admission, then the body read as it streams, checked, answered.

One :class:`Exchange` per request runs the pipeline, holding what the request took (an
exchange slot, a share of the unauthenticated byte budget, a receive buffer) until it ends,
however it ends:

1. **admit** (nothing read yet): the signature header (a stream-signed one verified whole,
   a digest-signed one for its form and clock), the size cap (``413``), then an exchange
   slot and the serving share (``409 busy``) for a body whose header is authentic or in an
   open swarm, or the unauthenticated byte budget (``429 overloaded``) for a digest-signed
   body, which must be read before its signature can be checked;
2. **read** the body under the body deadline (``408``), into a reused buffer where the
   service allows; model-sized bodies straight from the socket (``peer.transport.receive``);
3. **check** the digest signature (then take the slot), the envelope and the vector;
4. **answer** with our envelope, within the slot (:func:`peer.transport.answer.send_envelope`).

``Expect: 100-continue`` runs the checks of step 1 that cost nothing on the headers alone
(:func:`exchange_expect`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from peer.protocol.auth import STREAM_SCHEME, is_streamed
from peer.protocol.errors import (
    BodyTooLarge,
    ExpectationFailed,
    MalformedBody,
    ProtocolError,
    SlowBody,
)
from peer.protocol.threads import in_thread
from peer.protocol.wire import Envelope, check_envelope
from peer.transport.answer import has_body, send_envelope
from peer.transport.body import read_envelope_object
from peer.transport.connection import JsonErrorRequestHandler
from peer.transport.context import ServerContext
from peer.transport.receive import can_take_over, take_over
from peer.transport.service import ANSWERED, DIRECT_READ

__all__ = ["Exchange", "exchange_expect"]


class Exchange:
    """One ``POST /v1/exchange`` through the pipeline of the module docstring."""

    def __init__(self, ctx: ServerContext, request: web.Request) -> None:
        self.ctx = ctx
        self.request = request
        self.length = request.content_length
        self.nonce: str | None = None
        self.stream = False
        """Stream-signed: the header is verified whole, the body ends with a Poly1305 tag."""
        self.unverified = False
        """Digest-signed: read under the byte budget before its signature can be checked."""
        self.slot = False
        self.started = 0.0
        self.arena: torch.Tensor | None = None

    async def run(self) -> web.StreamResponse:
        ctx = self.ctx
        service = ctx.service
        request = self.request
        entered = time.perf_counter()
        try:
            with ctx.budget.account() as account:
                self._admit(account)
                obj, digest = await self._read()
                service.metrics.bytes(direction="in").inc(self.length or 0)
                self._check_digest(digest)
                received = time.perf_counter()
                envelope, vector = await self._decode(obj)
                checked = time.perf_counter()
                reply = await service.on_exchange(envelope, vector)
                response = await send_envelope(ctx, request, reply, self.nonce, self.stream)
                # ok: averaged and answered whole; unanswered: averaged, but the caller did
                # not take the answer (it applies nothing: the pair's sum moved); failed:
                # the answer failed before it was whole (the model is unchanged)
                outcome = request.get(ANSWERED, "ok")
                service.metrics.exchanges(role="callee", outcome=outcome).inc()
                if outcome == "ok":
                    phase = service.metrics.exchange_phase_seconds
                    phase(role="callee", phase="receive").observe(received - entered)
                    phase(role="callee", phase="check").observe(checked - received)
                    phase(role="callee", phase="answer").observe(time.perf_counter() - checked)
                return response
        except ProtocolError as error:
            return ctx.sign(ctx.refused(request, error), self.nonce)
        finally:
            self._release()

    def _admit(self, account: Any) -> None:
        ctx = self.ctx
        service = ctx.service
        request = self.request
        length = self.length
        verifier = service.verifier
        if verifier is not None:
            self.stream = is_streamed(request.headers)
            if self.stream:
                self.nonce = verifier.verify_stream(
                    request.method, request.path_qs, request.headers, length or 0
                )
            else:
                verifier.check_form(request.headers)
        if length is not None and length > service.max_body_bytes:
            raise BodyTooLarge(f"body has {length} bytes, the cap is {service.max_body_bytes}")
        if not has_body(request):
            raise MalformedBody("an exchange needs a body (the caller's envelope)")
        self.unverified = verifier is not None and not self.stream
        if self.unverified:
            # read before its digest can be checked: held under the byte budget
            need = length if length is not None else service.max_body_bytes
            if need > ctx.budget.capacity:
                raise BodyTooLarge(
                    f"a digest-signed body is read before its signature can be "
                    f"checked: at most {ctx.budget.capacity} bytes, got {need}; sign "
                    f"larger bodies with {STREAM_SCHEME}"
                )
            account.charge(need)
        else:
            self._take_slot()
            if length is not None and not getattr(service, "retains_messages", True):
                self.arena = ctx.arenas.take(length)

    def _take_slot(self) -> None:
        self.ctx.take_exchange_slot()
        self.slot = True
        share = self.ctx.share
        self.started = share.start() if share is not None else 0.0

    async def _read(self) -> tuple[Any, str | None]:
        """The request's envelope, read under the body deadline. A model-sized body is read
        straight into the arena (``peer.transport.receive``: its connection then closes after
        the answer, ``request[DIRECT_READ]``); other bodies through aiohttp's stream."""
        ctx = self.ctx
        request = self.request
        verifier = ctx.service.verifier
        tag_key = None
        if self.stream and self.nonce is not None and verifier is not None:
            tag_key = verifier.body_key(self.nonce, "request")
        length = self.length
        deadline_s = ctx.deadline_s
        direct = None
        if length is not None and can_take_over(request.headers, length):
            # until the parser is renewed, the connection must close after the answer
            direct = take_over(request.transport, request.protocol, request.content, length=length)
            request[DIRECT_READ] = direct is not None
        read_whole = False
        try:
            async with asyncio.timeout(deadline_s):
                result = await read_envelope_object(
                    direct if direct is not None else request.content,
                    length=length,
                    cap=ctx.service.max_body_bytes,
                    arena=self.arena,
                    tag_key=tag_key,
                    digest=self.unverified,
                )
            read_whole = True
            return result
        except TimeoutError:
            raise SlowBody(f"body not received within {deadline_s:g} s") from None
        except (ConnectionError, web.RequestPayloadError, HttpProcessingError) as error:
            raise MalformedBody(f"body broken off: {error}") from None
        finally:
            if direct is not None:
                # a body read to its last byte and then refused (a wrong tag, trailing
                # bytes) leaves the connection in step as a good one does
                if read_whole or (direct.remaining == 0 and not direct.ended):
                    handler = request.protocol
                    renewed = isinstance(handler, JsonErrorRequestHandler) and (
                        handler.renew_parser()
                    )
                    direct.finish(request.content, keep_alive=renewed)
                    request[DIRECT_READ] = not renewed
                else:
                    direct.abandon()

    def _check_digest(self, digest: str | None) -> None:
        if not self.unverified:
            return
        request = self.request
        verifier = self.ctx.service.verifier
        assert verifier is not None and digest is not None
        self.nonce = verifier.verify_digest(
            request.method, request.path_qs, request.headers, digest
        )
        self._take_slot()

    async def _decode(self, obj: Any) -> tuple[Envelope, torch.Tensor]:
        """The request's envelope and its validated vector (a typed error refuses it)."""
        service = self.ctx.service
        try:
            envelope = check_envelope(obj, codecs=service.codecs)
            if envelope.sender == service.peer_id:
                raise MalformedBody(f"sender {envelope.sender!r} is this peer's own id")
            codec = service.codecs[envelope.codec]
            vector = await in_thread(codec.decode, envelope.payload, service.message_spec)
        except ProtocolError:
            service.metrics.exchanges(role="callee", outcome="refused").inc()
            raise
        return envelope, vector

    def _release(self) -> None:
        ctx = self.ctx
        if self.slot:
            ctx.slots.give()
            if ctx.share is not None:
                ctx.share.done(self.started)
        if self.arena is not None:
            ctx.arenas.give(self.arena)


async def exchange_expect(ctx: ServerContext, request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` on ``POST /v1/exchange``: the checks that cost nothing
    (the signature header's form, receiver and clock window; the size cap; a free slot
    and the serving share) run on the headers alone, and a caller that would be refused
    gets its refusal *before* it sends its model (no model-sized body crosses the network
    to be dropped, no connection lingers to drain it). The full checks run again when the
    body comes (the slot may be gone by then: ``409 busy`` as without Expect)."""
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        return ctx.refused(request, ExpectationFailed(f"unknown Expect: {expect[:64]!r}"))
    service = ctx.service
    try:
        if service.verifier is not None:
            service.verifier.check_form(request.headers)
        length = request.content_length
        if length is not None and length > service.max_body_bytes:
            raise BodyTooLarge(f"body has {length} bytes, the cap is {service.max_body_bytes}")
        if ctx.slots.in_use >= ctx.slots.size:
            raise ctx.busy()
        if ctx.share is not None and not ctx.share.admit():
            raise ctx.share_busy()
    except ProtocolError as error:
        # answer and close now: the caller sends no body, and neither side may wait for
        # it (aiohttp's client keeps a connection whose 100 never came; its server would
        # linger for the unread body)
        response = ctx.sign(ctx.refused(request, error), None)
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        if request.transport is not None:
            request.transport.close()
        return response
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    return None
