"""Each fast path of the pairwise exchange turned off alone (its public switch, the one
``bench/exchange.py --ablate`` uses) gives the same bits as the full path: two real peers on
127.0.0.1, a signed async exchange, and both end with the pair's average.

The model is 1.5 MB (a body above the direct-read threshold, below one streaming chunk),
and the two peers start from different models, so the average has work to do.
"""

from __future__ import annotations

import pytest
import torch

from peer.node.config import PeerConfig
from peer.node.pairwise import PairwiseExchange
from peer.node.peer import Peer
from peer.transport import socket_reads

from .conftest import SECRET

NUMEL = int(1.5 * 2**20) // 4
PATHS = ("stream_answer", "direct_reads", "stream_signed")


class FlatModel(torch.nn.Module):
    """A model that is just ``numel`` float32 parameters."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(NUMEL, generator=generator))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight.sum()


def make_peer(peer_id: str, seed: int, off: str, **config: object) -> Peer:
    """A peer with the fast path ``off`` turned off ("" for none) through its switch."""
    peer = Peer(
        FlatModel(seed),
        lambda params: torch.optim.SGD(params, lr=0.0),
        torch.nn.functional.mse_loss,
        [],
        PeerConfig(peer_id=peer_id, secret=SECRET, request_timeout_s=30.0, **config),  # type: ignore[arg-type]
    )
    mode = peer.mode
    assert isinstance(mode, PairwiseExchange)
    mode.stream_answer = off != "stream_answer"
    if off == "stream_signed":  # the callee admits a digest-signed model (read, then checked)
        peer.handlers.max_unauthenticated_bytes = 8 << 20
    return peer


def model(peer: Peer) -> torch.Tensor:
    return peer.flat.vector.detach().clone()


async def exchanged(off: str, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The callee's and the caller's models after one exchange."""
    monkeypatch.setattr(socket_reads, "DIRECT_READS", off != "direct_reads")
    callee = make_peer("callee", 1, off)
    await callee.start()
    try:
        caller = make_peer(
            "caller", 2, off, client_only=True, join=(callee.address,), fetch_state=False
        )
        await caller.start()
        try:
            assert caller.client is not None
            caller.client.stream_signed = off != "stream_signed"
            assert caller.client.direct_reads == (off != "direct_reads")
            assert await caller.gossip() == 1
            return model(callee), model(caller)
        finally:
            await caller.stop()
    finally:
        await callee.stop()


async def test_every_fast_path_turned_off_alone_gives_the_full_paths_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start = [FlatModel(seed).weight.detach() for seed in (1, 2)]
    callee, caller = await exchanged("", monkeypatch)
    assert torch.equal(callee, caller)  # both hold the pair's average, x <- (x_1 + x_2) / 2
    torch.testing.assert_close(callee, (start[0] + start[1]) / 2)
    for off in PATHS:
        off_callee, off_caller = await exchanged(off, monkeypatch)
        assert torch.equal(off_callee, callee) and torch.equal(off_caller, caller), off
