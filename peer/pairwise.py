"""The async exchange (``mode="async"``): AD-PSGD's pairwise averaging, caller and callee.

AD-PSGD (Lian et al., ICML 2018): with each of ``fanout`` random neighbours (or the
topology's partners of the round), push-pull ``POST /v1/exchange``. The callee computes
``gossip.average_pair`` (x_i, x_j <- (x_i + x_j)/2) atomically under its model lock and
answers with it (``gossip.PairwiseGossip.callee_answer``); the caller adds
``average - sent`` to its model (``gossip.PairwiseGossip.caller_update``), so local
progress made during the round trip is kept and the pair's sum is preserved under any
interleaving. When two peers call each other at once, the smaller id declines with
``409 busy``, so the pair averages exactly once.

Both halves of the rule are the ones the simulator runs; this room only moves the
model to and from the wire, in worker threads (``asyncio.to_thread``), never on the
event loop.
"""

from __future__ import annotations

import asyncio
import time

import torch

from gossip.pairwise import PairwiseGossip
from peer.body import ArenaPool
from peer.client import PeerUnavailable, RemoteRefused
from peer.core import PeerCore
from peer.errors import ALIVE_REFUSALS, Busy, ProtocolError
from peer.membership import Member
from peer.threads import in_thread
from peer.wire import Envelope


class PairwiseExchange(PeerCore):
    """The async room of a :class:`~peer.node.Peer`: one exchange phase
    (``_gossip_async``), the caller's side (``_pairwise``) and the callee's answer
    (``_pairwise_answer``)."""

    _in_flight: set[str]
    """Neighbours this peer is calling right now (a crossing call from one is declined)."""
    _send_buffer: torch.Tensor | None
    """The model copy every outgoing exchange reuses (allocated on the first)."""

    def _init_pairwise(self) -> None:
        self._in_flight = set()
        self._send_buffer = None
        self._answer_arenas = ArenaPool(1, pin=self.pin_buffers)

    async def _gossip_async(self) -> int:
        neighbours = self._neighbours()
        chosen = self._rng.sample(neighbours, min(self.config.fanout, len(neighbours)))
        done = 0
        for member in chosen:
            done += await self._pairwise(member)
        return done

    # ------------------------------------------------------------------ caller

    def _snapshot_into_buffer(self) -> torch.Tensor:
        """The model copied into one buffer reused by every outgoing pairwise exchange.

        Async exchanges of a peer run one at a time, so one buffer suffices; copying
        into memory already mapped is several times faster than a fresh clone.
        """
        with self.lock:
            if self._send_buffer is None:
                self._send_buffer = torch.empty_like(
                    self.flat.vector, device="cpu", pin_memory=self.pin_buffers
                )
            self._send_buffer.copy_(self.flat.vector)
            return self._send_buffer

    async def _pairwise(self, member: Member) -> bool:
        assert member.address is not None
        self._in_flight.add(member.id)
        try:
            sent = await in_thread(self._snapshot_into_buffer)
            started = time.perf_counter()
            arena = self._answer_arenas.take(self.max_body_bytes)
            try:
                envelope = await in_thread(self._envelope, sent)
                # signed for member.id, and answered by it (else UnknownPeer)
                reply = await self._client().exchange(
                    member.address, envelope, receiver=member.id, codecs=self.codecs, arena=arena
                )
                codec = self.codecs[reply.codec]
                averaged = await in_thread(codec.decode, reply.payload, self.spec)
            except RemoteRefused as error:
                if error.code in ALIVE_REFUSALS:  # full (e.g. averaging with us as the callee)
                    self.metrics.exchanges(role="caller", outcome="busy").inc()
                    return False
                self.metrics.exchanges(role="caller", outcome="failed").inc()
                self.health.record(failed=1)
                self._failed(member, error)
                return False
            except (PeerUnavailable, ProtocolError) as error:
                self.metrics.exchanges(role="caller", outcome="failed").inc()
                self.health.record(failed=1)
                self._failed(member, error)
                return False
            await asyncio.to_thread(self._add_locked, averaged, sent)
        finally:
            self._in_flight.discard(member.id)
            self._answer_arenas.give(arena)  # nothing views it any more
        self.membership.record_success(member.id)
        self.metrics.exchanges(role="caller", outcome="ok").inc()
        self.health.record(ok=1)
        self.metrics.exchange_seconds.observe(time.perf_counter() - started)
        return True

    def _add_locked(self, averaged: torch.Tensor, sent: torch.Tensor) -> None:
        """The caller's half, ``gossip.PairwiseGossip.caller_update``: x <- x + (answer - sent),
        adopting the pair's average and keeping progress made meanwhile."""
        with self.lock:
            PairwiseGossip.caller_update(self.flat.vector, sent, averaged)

    # ------------------------------------------------------------------ callee

    async def _pairwise_answer(self, envelope: Envelope, vector: torch.Tensor) -> Envelope:
        """Answer a neighbour's ``POST /v1/exchange`` in async mode: the pair's average."""
        if envelope.sender in self._in_flight and self.peer_id < envelope.sender:
            # Both sides of the pair called at once. If both averaged as callee and
            # then added (average - sent) as caller, the pair would swap models; the
            # smaller id declines, so the pair averages exactly once.
            raise Busy(f"{self.peer_id} is exchanging with {envelope.sender} as the caller")
        averaged = await in_thread(self._average_locked, vector.to(self.spec.dtype))
        self.health.record(ok=1)  # averaged as the callee: this peer is not alone
        return await in_thread(self._envelope, averaged)

    def _average_locked(self, other: torch.Tensor) -> torch.Tensor:
        """The callee's half, ``gossip.PairwiseGossip.callee_answer``: adopt
        ``average_pair(own, other, aggregator)`` atomically and return it (the answer)."""
        with self.lock:
            return self.pairwise_rule.callee_answer(self.flat.vector, other)
