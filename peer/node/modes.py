"""The exchange mode a peer runs, chosen once from its config: what both modes provide.

``PeerConfig.mode`` names it: ``"sync"`` is :class:`~peer.node.sync_round.SyncRound`
(D-PSGD rounds), ``"async"`` is :class:`~peer.node.pairwise.PairwiseExchange` (AD-PSGD).
Each holds only its own state, over the peer's shared :class:`~peer.node.context.PeerContext`.

Model copies held (d = parameter count; an edge device sizes for these): the
model itself, the flat gradient, the optimizer's state, the reused send buffer (the
request streams from it), the reused buffer the answer lands in, two per exchange
served (the request's buffer and the averaging result the answer streams from; at
most ``max_concurrent_exchanges`` at once: the server answers ``409 busy``
beyond it before reading the body), and in sync mode this round's message and the
inbox: up to two rounds of each neighbour's message (2k), or up to nine for push-sum
and CHOCO, whose late messages still count. docs/protocol.md counts them.
"""

from __future__ import annotations

from typing import Protocol

import torch

from peer.node.context import PeerContext
from peer.node.pairwise import PairwiseExchange
from peer.node.sync_round import SyncRound
from peer.protocol.wire import Envelope
from peer.transport.admission import ServingShare


class ExchangeMode(Protocol):
    """One exchange mode: the caller's phase, the callee's answer, and what the server
    needs to know of it."""

    @property
    def retains_messages(self) -> bool:
        """Whether a received message outlives its request (no reused receive buffers)."""
        ...

    @property
    def serving_share(self) -> ServingShare | None:
        """The share of its time a training peer may spend serving exchanges, or None."""
        ...

    def start(self) -> None:
        """Prepare for the running event loop (called by ``Peer.start``)."""
        ...

    async def exchange(self) -> int:
        """One exchange phase of round ``ctx.round``; how many neighbours took part."""
        ...

    async def answer(self, envelope: Envelope, vector: torch.Tensor) -> Envelope:
        """The answer to a neighbour's validated ``POST /v1/exchange``."""
        ...

    async def settle(self) -> None:
        """Hand the rule whatever arrived after the last round (nothing for async)."""
        ...


def build_mode(ctx: PeerContext) -> SyncRound | PairwiseExchange:
    """The mode ``ctx.config.mode`` names, over ``ctx``."""
    return PairwiseExchange(ctx) if ctx.config.mode == "async" else SyncRound(ctx)
