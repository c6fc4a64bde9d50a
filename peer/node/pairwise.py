"""The async exchange (``mode="async"``): AD-PSGD's pairwise averaging, caller and callee.

AD-PSGD (Lian et al., ICML 2018): with each of ``fanout`` random neighbours (or the
topology's partners of the round), push-pull ``POST /v1/exchange``. The callee computes
``gossip.average_pair`` (x_i, x_j <- (x_i + x_j)/2) atomically under its model lock and
answers with it (``gossip.PairwiseGossip.callee_answer``); the caller adds
``average - sent`` to its model (``gossip.PairwiseGossip.caller_update``), so local
progress made during the round trip is kept and the pair's sum is preserved under any
interleaving. When two peers call each other at once, the smaller id declines with
``409 busy``, so the pair averages exactly once.

Both halves of the rule are the ones the simulator runs; this mode only moves the
model to and from the wire, in worker threads (``peer.protocol.threads.in_thread``),
never on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import torch

from gossip.pairwise import PairwiseGossip
from peer.node.context import PeerContext
from peer.node.membership import Member
from peer.protocol.codecs import CompressorCodec
from peer.protocol.errors import ALIVE_REFUSALS, Busy, ProtocolError
from peer.protocol.growing import GrowingBuffer, fill_in_thread
from peer.protocol.threads import in_thread
from peer.protocol.wire import Envelope
from peer.transport.admission import ServingShare
from peer.transport.body import ArenaPool
from peer.transport.client import PeerUnavailable, RemoteRefused

Outcome = Literal["ok", "busy", "failed"]
"""How one call ended: averaged, refused by a live neighbour at one of its bounds, or failed."""

BUSY_RETRIES = 2
"""How many ``busy`` neighbours an async round may pass over for another (per round)."""


class PairwiseExchange:
    """The async mode of a :class:`~peer.node.peer.Peer`: one exchange phase
    (:meth:`exchange`), the caller's side (:meth:`_pairwise`) and the callee's answer
    (:meth:`answer`), over the peer's shared parts (``ctx``).

    Its fast path can be turned off (a constructor argument, kept as the public attribute
    of the same name, read at every exchange); its "off" form is the plain one, which gives
    the same bits (``bench/exchange.py --ablate`` times both):

    * ``stream_answer``: the callee's answer is sent while a worker averages it chunk by
      chunk (``gossip.PairwiseGossip.callee_answer_by_chunk``); off: averaged whole
      (``callee_answer``), then sent.
    """

    retains_messages = False
    """A received message is averaged before its request ends: the server reads exchanges
    into reused buffers."""

    def __init__(
        self,
        ctx: PeerContext,
        *,
        stream_answer: bool = True,
    ) -> None:
        self.ctx = ctx
        self.stream_answer = stream_answer
        self.pairwise_rule = PairwiseGossip(ctx.algorithm.aggregator)
        """AD-PSGD's halves (gossip.pairwise); the codec is the wire's (``ctx.codec``)."""
        self.serving_share: ServingShare | None = ServingShare(
            ctx.config.max_serving_share, ctx.trainer.training
        )
        """While this peer trains, serving neighbours' exchanges takes at most this share of
        its time (a sync round serves each neighbour once per round by design)."""
        self._in_flight: set[str] = set()
        """Neighbours this peer is calling right now (a crossing call from one is declined)."""
        self._send_buffer: torch.Tensor | None = None
        """The model copy every outgoing exchange reuses (allocated on the first)."""
        self._answer_arenas = ArenaPool(1, pin=ctx.pin_buffers)
        self._result_buffers = ArenaPool(1, pin=ctx.pin_buffers)
        self._snapshot_taken = -2
        """The model lock's count at our last snapshot (``_add_locked``)."""

    def start(self) -> None:
        """Nothing to prepare: the async mode makes its state when it is built."""

    async def settle(self) -> None:
        """Nothing to settle: every pairwise exchange is complete when it returns."""

    async def exchange(self) -> int:
        """Average with ``fanout`` neighbours, called one at a time in a random order.

        A neighbour that answers ``busy`` (at one of its bounds, or calling us right now)
        is alive but cannot average now: its place goes to the next neighbour in the
        order, at most :data:`BUSY_RETRIES` times a round, so a caller that nobody can
        call (a client-only peer) is not left training alone while one neighbour's
        serving share is spent. A failed call keeps its place (the neighbour is
        suspected; trying others could hold the round for several timeouts)."""
        neighbours = self.ctx.neighbours()
        fanout = self.ctx.config.fanout
        assert fanout is not None  # resolved by PeerConfig
        wanted = min(fanout, len(neighbours))
        retries = BUSY_RETRIES
        done = 0
        for member in self.ctx.rng.sample(neighbours, len(neighbours)):
            if wanted == 0:
                break
            outcome = await self._pairwise(member)
            if outcome == "busy" and retries > 0:
                retries -= 1
                continue
            wanted -= 1
            done += outcome == "ok"
        return done

    # ------------------------------------------------------------------ streaming

    def _streams_dense(self) -> bool:
        """Whether this peer's messages stream as its model's raw bytes (codec ``none``,
        no error feedback) from a CPU model: then an answer can be sent while a worker
        thread still computes it (``peer.protocol.growing``)."""
        codec = self.ctx.codec
        return (
            isinstance(codec, CompressorCodec)
            and codec.compressor.spec == "none"
            and self.ctx.flat.vector.device.type == "cpu"
        )

    def _send_buffer_for(self) -> torch.Tensor:
        if self._send_buffer is None:
            self._send_buffer = torch.empty_like(
                self.ctx.flat.vector, device="cpu", pin_memory=self.ctx.pin_buffers
            )
        return self._send_buffer

    # ------------------------------------------------------------------ caller

    def _snapshot_into_buffer(self) -> torch.Tensor:
        """The model copied into one buffer reused by every outgoing pairwise exchange.

        Async exchanges of a peer run one at a time, so one buffer suffices; copying
        into memory already mapped is several times faster than a fresh clone.
        """
        with self.ctx.lock:
            buffer = self._send_buffer_for()
            buffer.copy_(self.ctx.flat.vector)
            self._snapshot_taken = self.ctx.lock.acquisitions
            return buffer

    async def _outgoing(self) -> tuple[Envelope, torch.Tensor]:
        """Our request: ``(envelope, the snapshot it sends)``, the snapshot copied whole
        (:meth:`_snapshot_into_buffer`) and encoded in worker threads."""
        sent = await in_thread(self._snapshot_into_buffer)
        return await in_thread(self.ctx.envelope, sent), sent

    async def _pairwise(self, member: Member) -> Outcome:
        """One push-pull exchange with ``member``: ``"ok"``, ``"busy"`` (alive, refused
        at one of its bounds) or ``"failed"``."""
        assert member.address is not None
        self._in_flight.add(member.id)
        try:
            started = time.perf_counter()
            arena = self._answer_arenas.take(self.ctx.max_body_bytes)
            try:
                envelope, sent = await self._outgoing()
                # signed for member.id, and answered by it (else UnknownPeer)
                reply = await self.ctx.started_client().exchange(
                    member.address,
                    envelope,
                    receiver=member.id,
                    codecs=self.ctx.codecs,
                    arena=arena,
                )
                answer_read = time.perf_counter()
                await in_thread(self._mix_answer, reply, sent)
            except RemoteRefused as error:
                if error.code in ALIVE_REFUSALS:  # full (e.g. averaging with us as the callee)
                    self.ctx.metrics.exchanges(role="caller", outcome="busy").inc()
                    return "busy"
                self.ctx.metrics.exchanges(role="caller", outcome="failed").inc()
                self.ctx.health.record(failed=1)
                self.ctx.failed(member, error)
                return "failed"
            except (PeerUnavailable, ProtocolError) as error:
                self.ctx.metrics.exchanges(role="caller", outcome="failed").inc()
                self.ctx.health.record(failed=1)
                self.ctx.failed(member, error)
                return "failed"
        finally:
            self._in_flight.discard(member.id)
            self._answer_arenas.give(arena)  # nothing views it any more
        self.ctx.membership.record_success(member.id)
        self.ctx.metrics.exchanges(role="caller", outcome="ok").inc()
        self.ctx.health.record(ok=1)
        ended = time.perf_counter()
        self.ctx.metrics.exchange_seconds.observe(ended - started)
        phase = self.ctx.metrics.exchange_phase_seconds
        phase(role="caller", phase="round_trip").observe(answer_read - started)
        phase(role="caller", phase="adopt").observe(ended - answer_read)
        return "ok"

    def _mix_answer(self, reply: Envelope, sent: torch.Tensor) -> None:
        """Decode the neighbour's answer with the codec's full validation (a typed error
        refuses it: a non-finite answer as ``non_finite``) and apply the caller's half
        (:meth:`_add_locked`), in one worker thread."""
        codec = self.ctx.codecs[reply.codec]
        self._add_locked(codec.decode(reply.payload, self.ctx.spec), sent)

    def _add_locked(self, averaged: torch.Tensor, sent: torch.Tensor) -> None:
        """The caller's half, ``gossip.PairwiseGossip.caller_update``: x <- x + (answer - sent),
        adopting the pair's average and keeping progress made meanwhile. When nobody took
        the model lock since the snapshot (``peer.node.model_lock``), the model still is the
        snapshot, and the rule is told so (``sent = own``: no comparison pass)."""
        with self.ctx.lock:
            own = self.ctx.flat.vector
            untouched = self.ctx.lock.acquisitions == self._snapshot_taken + 1
            PairwiseGossip.caller_update(own, own if untouched else sent, averaged)

    # ------------------------------------------------------------------ callee

    async def answer(self, envelope: Envelope, vector: torch.Tensor) -> Envelope:
        """Answer a neighbour's ``POST /v1/exchange`` (validated): the pair's average."""
        if envelope.sender in self._in_flight and self.ctx.peer_id < envelope.sender:
            # Both sides of the pair called at once. If both averaged as callee and
            # then added (average - sent) as caller, the pair would swap models; the
            # smaller id declines, so the pair averages exactly once.
            raise Busy(f"{self.ctx.peer_id} is exchanging with {envelope.sender} as the caller")
        if self._streams_average(vector):
            return self._streamed_answer(vector)
        averaged = await in_thread(self._average_locked, vector.to(self.ctx.spec.dtype))
        self.ctx.health.record(ok=1)  # averaged as the callee: this peer is not alone
        return await in_thread(self.ctx.envelope, averaged)

    def _average_locked(self, other: torch.Tensor) -> torch.Tensor:
        """The callee's half, ``gossip.PairwiseGossip.callee_answer``: adopt
        ``average_pair(own, other, aggregator)`` atomically and return it (the answer)."""
        with self.ctx.lock:
            return self.pairwise_rule.callee_answer(self.ctx.flat.vector, other)

    def _streams_average(self, other: torch.Tensor) -> bool:
        """Whether the answer can stream while it is averaged: the rule is the plain mean
        (elementwise, so a chunk of the average is the average of the chunks), the answer
        is dense (:meth:`_streams_dense`), and the caller's vector is the model's dtype and
        shape, in CPU memory."""
        own = self.ctx.flat.vector
        return (
            self.stream_answer
            and self.pairwise_rule.answers_by_chunk
            and self._streams_dense()
            and other.device.type == "cpu"
            and other.dtype == own.dtype
            and other.shape == own.shape
            and other.is_contiguous()
        )

    def _streamed_answer(self, other: torch.Tensor) -> Envelope:
        """The answer as a :class:`~peer.protocol.growing.GrowingBuffer` that a worker fills with the
        pair's average chunk by chunk (:meth:`_average_in_chunks`) while the server sends
        what is ready. The result buffer is reused once the answer is written."""
        own = self.ctx.flat.vector
        raw = self._result_buffers.take(own.numel() * own.element_size())
        result = raw[: own.numel() * own.element_size()].view(own.dtype)
        payload = self.ctx.codec.encode(result)
        growing = GrowingBuffer(payload["data"], asyncio.get_running_loop())
        payload["data"] = growing
        growing.when_released(lambda: self._result_buffers.give(raw))
        task = fill_in_thread(growing, self._average_in_chunks, other, result, growing)
        task.add_done_callback(self._answered)
        return self.ctx.envelope_of(payload)

    def _answered(self, task: asyncio.Future[object]) -> None:
        if not task.cancelled() and task.exception() is None:
            self.ctx.health.record(ok=1)  # averaged as the callee: this peer is not alone

    def _average_in_chunks(
        self, other: torch.Tensor, result: torch.Tensor, growing: GrowingBuffer
    ) -> None:
        """The callee's half, ``gossip.PairwiseGossip.callee_answer_by_chunk``, under the model
        lock (atomic, as the whole-vector rule), each chunk of the answer published as it is
        computed but the last bytes, which follow the commit: a complete answer means an
        adopted average; a failure (a non-finite own vector) leaves the model untouched and
        the answer incomplete. The server holds the exchange's slot until this returns."""
        own = self.ctx.flat.vector
        itemsize = own.element_size()
        numel = own.numel()

        def computed(end: int) -> None:
            growing.advance(max(0, min(end, numel - _HELD_BACK)) * itemsize)

        with self.ctx.lock:
            self.pairwise_rule.callee_answer_by_chunk(
                own, other, result, chunk=_chunk_elements(own), computed=computed
            )
        growing.advance(numel * itemsize)


STREAM_CHUNK_BYTES = 4 << 20
"""Bytes of a streamed average computed (and published) at a time: large enough
that the rule's per-call cost is small, small enough that the first bytes go out early."""
_HELD_BACK = 1024
"""Elements of a streamed answer published only once the average is committed."""


def _chunk_elements(vector: torch.Tensor) -> int:
    return max(1, STREAM_CHUNK_BYTES // vector.element_size())
