"""A robust rule through the networked peer: an insider pushing huge models is trimmed away."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest
import torch

from peer.node.peer import Peer
from peer.protocol import wire
from peer.protocol.codecs import DenseCodec
from peer.transport.client import PeerClient

from .conftest import SECRET, started_peer


async def attack(client: PeerClient, peers: list[Peer], round_: int) -> None:
    """The Byzantine member sends every honest peer a model of 1e6 in round ``round_``."""
    huge = torch.full((peers[0].spec.numel,), 1e6)
    envelope = wire.Envelope(
        sender="z-byzantine",
        round=round_,
        codec="none",
        payload=DenseCodec().encode(huge),
    )
    await asyncio.gather(
        *(client.exchange(p.address, envelope, codecs={"none"}) for p in peers)  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(("aggregator", "robust"), [("trimmed-mean:b=1", True), ("mean", False)])
async def test_sync_round_with_a_byzantine_member(aggregator: str, robust: bool) -> None:
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(
            started_peer("p0", seed=0, mode="sync", aggregator=aggregator, round_deadline_s=5.0)
        )
        peers = [first]
        for i in (1, 2):
            peers.append(
                await stack.enter_async_context(
                    started_peer(f"p{i}", seed=i, mode="sync", aggregator=aggregator,
                                 round_deadline_s=5.0, join=(first.address,), fetch_state=False)
                )
            )  # fmt: skip
        client = await stack.enter_async_context(
            PeerClient(secret=SECRET, timeout_s=10.0, max_body_bytes=1 << 20)
        )
        for p in peers:  # an insider: it holds the swarm secret and joins as client-only
            await client.join(p.address, "z-byzantine", None)  # type: ignore[arg-type]
        honest = torch.stack([p.flat.vector for p in peers])
        low, high = honest.min(0).values, honest.max(0).values
        for round_ in range(2):
            results = await asyncio.gather(
                *(p.gossip() for p in peers), attack(client, peers, round_)
            )
            assert results[:3] == [3, 3, 3]  # two honest neighbours and the attacker arrived
        for p in peers:
            inside = bool(((p.flat.vector >= low - 1e-6) & (p.flat.vector <= high + 1e-6)).all())
            assert inside == robust
