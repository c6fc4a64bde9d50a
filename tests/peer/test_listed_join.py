"""Ranks of a known peer list (``--topology --peers``) find each other in any start order."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from peer.app.swarm import free_ports
from peer.node.config import PeerConfig
from peer.node.peer import Peer

SECRET = b"listed-join-test-secret-32-bytes"


def _peer(rank: int, addresses: tuple[str, ...], join: tuple[str, ...]) -> Peer:
    config = PeerConfig(
        peer_id=f"r{rank}",
        port=int(addresses[rank].rsplit(":", 1)[1]),
        mode="sync",
        topology="ring",
        peer_list=addresses,
        rank=rank,
        join=join,
        fetch_state=False,
        secret=SECRET,
        request_timeout_s=2.0,
    )
    batch = (torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    model = nn.Linear(3, 2)
    return Peer(
        model, lambda p: torch.optim.SGD(p, lr=0.1), nn.functional.cross_entropy, [batch], config
    )


async def test_a_rank_that_started_alone_is_found_by_the_others() -> None:
    addresses = tuple(f"127.0.0.1:{port}" for port in free_ports(3))
    async with contextlib.AsyncExitStack() as stack:
        # rank 2 starts first: nobody is up, so its joins fail and it starts alone
        lonely = _peer(2, addresses, join=addresses[:2])
        await lonely.start()
        stack.push_async_callback(lonely.stop)
        # ranks 0 and 1 come up joining only each other: nobody tells them about rank 2
        first = _peer(0, addresses, join=())
        await first.start()
        stack.push_async_callback(first.stop)
        second = _peer(1, addresses, join=addresses[:1])
        await second.start()
        stack.push_async_callback(second.stop)
        assert lonely.membership.neighbours() == []
        # waiting for the others joins the listed addresses that are not members yet
        for peer in (first, second, lonely):
            assert await peer.wait_for_members(2, timeout_s=10), peer.peer_id
        assert sorted(m.id for m in lonely.membership.neighbours()) == ["r0", "r1"]
