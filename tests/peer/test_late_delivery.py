"""Late messages in a real sync swarm: what the rule's ``late`` promises, over HTTP.

CHOCO keeps public copies that are sums of increments, so an increment that misses its
round must still arrive and be applied (gossip.Choco): a peer that answers a neighbour's
call before it has its own round's message owes it that message and pushes it once it
has it; the receiver hands it to ``late`` at its next round's start (or in ``settle``).
With no training (lr = 0) CHOCO-Gossip keeps the network average exactly (and push-sum the
mass), so the test slows one peer past the others' round deadline (a step callback) and
checks the average at the end: a late message dropped, or applied twice, would move it.
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


def _slow_second_step(step: int, loss: float) -> None:
    """A step callback (``Peer.run``'s, in a worker thread: the peer's server keeps answering)
    that holds the peer SLOW_S after its second step, so its round-1 message comes late."""
    if step == 2:
        time.sleep(SLOW_S)


async def _run(peers: list[Peer], slow: Peer) -> None:
    async with contextlib.AsyncExitStack() as stack:
        for peer in peers:
            await peer.start()
            stack.push_async_callback(peer.stop)
        for peer in peers:
            assert await peer.wait_for_members(N - 1, timeout_s=10)
        await asyncio.gather(
            *(
                peer.run(ROUNDS, callbacks=[_slow_second_step] if peer is slow else [])
                for peer in peers
            )
        )
        await asyncio.sleep(DEADLINE_S)  # let the last pushes land
        for peer in peers:
            await peer.settle()


def _missed(peers: list[Peer]) -> int:
    """Neighbours' messages that had not arrived when their round mixed, over all peers (each
    counts as a failed exchange in the peer's health, ``gossipnet_exchanges``)."""
    return sum(peer.health.exchanges_failed for peer in peers)


@pytest.mark.parametrize("codec", ["none", "fp16"])
async def test_choco_keeps_the_average_when_a_peer_misses_the_deadline(
    codec: str, caplog: pytest.LogCaptureFixture
) -> None:
    peers = _peers("choco", compressor=codec, consensus_step=0.5)
    initial = torch.stack([p.flat.vector.detach().clone() for p in peers])
    await _run(peers, slow=peers[2])
    final = torch.stack([p.flat.vector.detach() for p in peers])
    assert _missed(peers) > 0, "no message was late: the slow peer did not miss a deadline"
    assert "more than" not in caplog.text  # nothing was dropped
    torch.testing.assert_close(final.mean(0), initial.mean(0), rtol=0, atol=1e-5)
    # and the peers did mix: they are closer together than at the start
    assert (final - final.mean(0)).norm() < 0.5 * (initial - initial.mean(0)).norm()


async def test_push_sum_conserves_mass_when_a_peer_misses_the_deadline() -> None:
    peers = _peers("push-sum")
    initial = torch.stack([p.flat.vector.detach().clone() for p in peers])
    await _run(peers, slow=peers[2])
    assert _missed(peers) > 0, "no message was late: the slow peer did not miss a deadline"
    weights = torch.cat([p.gossip_state.weight for p in peers])
    numerators = torch.stack([p.gossip_state.x for p in peers])
    # late mass was added, none lost or counted twice: sum w = n, sum x = the start's sum
    assert float(weights.sum()) == pytest.approx(N, abs=1e-5)
    torch.testing.assert_close(numerators.sum(0), initial.sum(0), rtol=0, atol=1e-5)
