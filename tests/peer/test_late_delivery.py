"""Late messages in a real sync swarm: what the rule's ``late`` promises, over HTTP.

CHOCO keeps public copies that are sums of increments, so an increment that misses its
round must still arrive and be applied (gossip.Choco): a peer that answers a neighbour's
call before it has its own round's message owes it that message and pushes it once it
has it; the receiver hands it to ``late`` at its next round's start (or in ``settle``).
With no training (lr = 0) CHOCO-Gossip keeps the network average exactly, so the test
slows one peer past the others' round deadline and checks the average at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import torch
from torch import nn

from peer.app.swarm import free_ports
from peer.node.config import PeerConfig
from peer.node.peer import Peer
from peer.node.sync_round import SyncRound

SECRET = b"late-delivery-test-secret-32b..."
N, ROUNDS, DEADLINE_S, SLOW_S = 3, 6, 0.3, 0.7


def _peers(algorithm: str, **settings: object) -> list[Peer]:
    addresses = tuple(f"127.0.0.1:{port}" for port in free_ports(N))
    generator = torch.Generator().manual_seed(0)
    batch = (torch.zeros(2, 4), torch.zeros(2, dtype=torch.long))
    peers = []
    for rank, address in enumerate(addresses):
        model = nn.Linear(4, 3)
        with torch.no_grad():  # different models, so consensus has work to do
            for parameter in model.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
        config = PeerConfig(
            peer_id=f"p{rank}",
            port=int(address.rsplit(":", 1)[1]),
            algorithm=algorithm,
            topology="complete",
            peer_list=addresses,
            rank=rank,
            join=addresses[:1] if rank else (),
            fetch_state=False,
            secret=SECRET,
            round_deadline_s=DEADLINE_S,
            **settings,  # type: ignore[arg-type]
        )
        peers.append(
            Peer(
                model,
                lambda params: torch.optim.SGD(params, lr=0.0),
                nn.functional.cross_entropy,
                [batch],
                config,
            )
        )
    return peers


def _slow_first_round(peer: Peer) -> list[int]:
    """Make ``peer``'s round-1 message come SLOW_S late; returns the rounds it published."""
    published: list[int] = []
    mode = peer.mode
    assert isinstance(mode, SyncRound)
    original = mode._message_locked

    def slow():  # type: ignore[no-untyped-def]
        if peer.round == 1:
            time.sleep(SLOW_S)  # a worker thread: the peer's server keeps answering
        published.append(peer.round)
        return original()

    mode._message_locked = slow  # type: ignore[method-assign]
    return published


async def _run(peers: list[Peer]) -> None:
    async with contextlib.AsyncExitStack() as stack:
        for peer in peers:
            await peer.start()
            stack.push_async_callback(peer.stop)
        for peer in peers:
            assert await peer.wait_for_members(N - 1, timeout_s=10)
        await asyncio.gather(*(peer.run(ROUNDS) for peer in peers))
        await asyncio.sleep(DEADLINE_S)  # let the last pushes land
        for peer in peers:
            await peer.settle()


def _count_late(peers: list[Peer]) -> list[int]:
    """How many late messages each ``late`` hand-over carried, over all peers."""
    counts: list[int] = []
    for peer in peers:
        mode = peer.mode
        assert isinstance(mode, SyncRound)
        original = mode._late_locked

        def spy(late, t, original=original):  # type: ignore[no-untyped-def]
            counts.append(len(late))
            return original(late, t)

        mode._late_locked = spy  # type: ignore[method-assign]
    return counts


@pytest.mark.parametrize("codec", ["none", "fp16"])
async def test_choco_keeps_the_average_when_a_peer_misses_the_deadline(
    codec: str, caplog: pytest.LogCaptureFixture
) -> None:
    peers = _peers("choco", compressor=codec, consensus_step=0.5)
    initial = torch.stack([p.flat.vector.detach().clone() for p in peers])
    counts = _count_late(peers)
    _slow_first_round(peers[2])
    await _run(peers)
    final = torch.stack([p.flat.vector.detach() for p in peers])
    assert sum(counts) > 0, "no message was late: the slow peer did not miss a deadline"
    assert "more than" not in caplog.text  # nothing was dropped
    torch.testing.assert_close(final.mean(0), initial.mean(0), rtol=0, atol=1e-5)
    # and the peers did mix: they are closer together than at the start
    assert (final - final.mean(0)).norm() < 0.5 * (initial - initial.mean(0)).norm()


async def test_push_sum_conserves_mass_when_a_peer_misses_the_deadline() -> None:
    peers = _peers("push-sum")
    initial = torch.stack([p.flat.vector.detach().clone() for p in peers])
    counts = _count_late(peers)
    _slow_first_round(peers[2])
    await _run(peers)
    assert sum(counts) > 0, "no message was late: the slow peer did not miss a deadline"
    weights = torch.cat([p.gossip_state.weight for p in peers])
    numerators = torch.stack([p.gossip_state.x for p in peers])
    # late mass was added, none lost or counted twice: sum w = n, sum x = the start's sum
    assert float(weights.sum()) == pytest.approx(N, abs=1e-5)
    torch.testing.assert_close(numerators.sum(0), initial.sum(0), rtol=0, atol=1e-5)
