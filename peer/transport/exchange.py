"""``POST /v1/exchange``: admission, then the body read as it streams, checked, answered.

One :class:`Exchange` per request runs the pipeline, holding what the request took (an
exchange slot, a share of the unauthenticated byte budget, a receive buffer) until it ends,
however it ends:

1. **admit** (nothing read yet): the signature header (a stream-signed one verified whole,
   a digest-signed one for its form and clock: ``401``), an identity body (no
   Content-Encoding: ``400 malformed_request``), the size cap (``413``), then an exchange
   slot and the serving share (``409 busy``) for a body whose header is authentic or in an
   open swarm, or the unauthenticated byte budget (``429 overloaded``) for a digest-signed
   body, which must be read before its signature can be checked;
2. **read** the body under the body deadline (``408``), authenticated before it is parsed
   (:mod:`peer.transport.reading`: a digest-signed body read whole and its digest checked,
   then the slot taken; a stream-signed body's tag checked whatever the parser made of the
   bytes before it: ``401`` before any ``400``), into a reused buffer where the service
   allows, model-sized bodies straight from the socket (:mod:`peer.transport.socket_reads`);
3. **check** the envelope and the vector (``4xx``);
4. **answer** with our envelope, within the slot (:func:`peer.transport.answer.send_envelope`).

The serving share (:class:`~peer.transport.admission.ServingShare`) admits an exchange at
step 1 but counts its time only from the end of step 2: time spent on bytes not yet
authenticated (a stalled or forged body) never counts against it.

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

from peer.protocol.errors import (
    BodyTooLarge,
    ExpectationFailed,
    MalformedBody,
    ProtocolError,
    SlowBody,
)
from peer.protocol.signatures import STREAM_SCHEME, body_digest, is_streamed
from peer.protocol.source import BodySource, ChunkSource
from peer.protocol.threads import in_thread
from peer.protocol.wire import Envelope, check_envelope
from peer.transport.admission import ByteAccount
from peer.transport.answer import has_body, send_envelope
from peer.transport.body import read_envelope_object
from peer.transport.context import ServerContext
from peer.transport.reading import TaggedBody, check_identity, read_whole
from peer.transport.service import ANSWERED

__all__ = ["Exchange", "exchange_expect"]


class Exchange:
    """One ``POST /v1/exchange`` through the pipeline of the module docstring."""

    def __init__(self, ctx: ServerContext, request: web.Request) -> None:
        self.ctx = ctx
        self.request = request
        self.length = request.content_length
        self.nonce: str | None = None
        self.tag_key: bytes | None = None
        """Stream-signed: the header is verified whole, the body ends with a Poly1305 tag
        under this key."""
        self.unverified = False
        """Digest-signed: read under the byte budget before its signature can be checked."""
        self.budget_bytes = 0
        """What a digest-signed body was charged to the byte budget at admission."""
        self.slot = False
        self.started: float | None = None
        """When the authenticated work began (the serving share counts it from there)."""
        self.arena: torch.Tensor | None = None

    @property
    def stream(self) -> bool:
        return self.tag_key is not None

    async def run(self) -> web.StreamResponse:
        ctx = self.ctx
        service = ctx.service
        request = self.request
        entered = time.perf_counter()
        try:
            with ctx.budget.account() as account:
                self._admit(account)
                obj = await self._read()
                if ctx.share is not None:
                    self.started = ctx.share.start()
                service.metrics.bytes(direction="in").inc(self.length or 0)
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

    def _admit(self, account: ByteAccount) -> None:
        """Step 1: everything decided on the headers, before a body byte is read."""
        ctx = self.ctx
        service = ctx.service
        request = self.request
        length = self.length
        verifier = service.verifier
        if verifier is not None:
            if is_streamed(request.headers):
                self.nonce = verifier.verify_stream(
                    request.method, request.path_qs, request.headers, length or 0
                )
                self.tag_key = verifier.body_key(self.nonce, "request")
            else:
                verifier.check_form(request.headers)
        check_identity(request.headers)
        if length is not None and length > service.max_body_bytes:
            raise BodyTooLarge(f"body has {length} bytes, the cap is {service.max_body_bytes}")
        if not has_body(request):
            raise MalformedBody("an exchange needs a body (the caller's envelope)")
        if self.stream and length is None:
            raise MalformedBody("a stream-signed body needs a Content-Length")
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
            self.budget_bytes = need
        else:
            self._take_slot()
            if length is not None and not service.retains_messages:
                self.arena = ctx.arenas.take(length)

    def _take_slot(self) -> None:
        self.ctx.take_exchange_slot()
        self.slot = True

    async def _read(self) -> Any:
        """Step 2: the request's envelope object, authenticated before it is parsed
        (:mod:`peer.transport.reading`), under the body deadline. A large open or
        stream-signed body is read straight into the arena where the app reads directly
        (:class:`peer.transport.socket_reads.DirectReads`)."""
        deadline_s = self.ctx.deadline_s
        try:
            async with asyncio.timeout(deadline_s):
                if self.unverified:
                    return await self._read_digest_signed()
                return await self._read_streamed()
        except TimeoutError:
            raise SlowBody(f"body not received within {deadline_s:g} s") from None
        except (ConnectionError, web.RequestPayloadError, HttpProcessingError) as error:
            raise MalformedBody(f"body broken off: {error}") from None

    async def _read_digest_signed(self) -> Any:
        """Read whole (charged to the byte budget at admission), the digest checked, the
        slot taken, then parsed."""
        request = self.request
        service = self.ctx.service
        verifier = service.verifier
        assert verifier is not None
        body = await read_whole(
            request.content, length=self.length, cap=self.budget_bytes, account=None
        )
        digest = await in_thread(body_digest, body)
        self.nonce = verifier.verify_digest(
            request.method, request.path_qs, request.headers, digest
        )
        self._take_slot()
        chunks = [body]

        async def once() -> bytes:
            return chunks.pop() if chunks else b""

        obj, _ = await read_envelope_object(
            ChunkSource(once), length=len(body), cap=service.max_body_bytes
        )
        return obj

    async def _read_streamed(self) -> Any:
        """Parsed as it streams: an open swarm's body as it is, a stream-signed body through
        a :class:`~peer.transport.reading.TaggedBody`, whose tag is checked whatever the
        parser made of the bytes before it."""
        ctx = self.ctx
        request = self.request
        cap = ctx.service.max_body_bytes
        read = ctx.reads.open(request, self.length)
        source = read.source
        if not isinstance(source, BodySource):
            source = ChunkSource(source.readany)
        whole = False
        try:
            if self.tag_key is None:
                obj, _ = await read_envelope_object(
                    source, length=self.length, cap=cap, arena=self.arena
                )
            else:
                assert self.length is not None
                tagged = TaggedBody(source, length=self.length, key=self.tag_key)
                try:
                    obj, _ = await read_envelope_object(
                        tagged, length=tagged.content_length, cap=cap, arena=self.arena
                    )
                except (MalformedBody, BodyTooLarge):
                    await tagged.verify()  # a tag that does not verify is 401 first
                    raise
                await tagged.verify()
            whole = True
            return obj
        finally:
            read.end(whole=whole)

    async def _decode(self, obj: Any) -> tuple[Envelope, torch.Tensor]:
        """Step 3: the request's envelope and its validated vector (a typed error refuses
        it)."""
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
        if ctx.share is not None and self.started is not None:
            ctx.share.done(self.started)
        if self.arena is not None:
            ctx.arenas.give(self.arena)


async def exchange_expect(ctx: ServerContext, request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` on ``POST /v1/exchange``: the checks that cost nothing
    (the signature header's form, receiver and clock window; no Content-Encoding; the size
    cap; a free slot and the serving share) run on the headers alone, and a caller that would be refused
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
        check_identity(request.headers)
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
