"""Shared helpers for peer tests: small real models and started peers on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import torch

from peer.node.config import PeerConfig
from peer.node.peer import Peer

SECRET = b"test-swarm-secret-0123456789"


def make_model(seed: int, width: int = 4) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(width, 2)


def make_data(seed: int, batches: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))
        for _ in range(batches)
    ]


def sgd(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


@asynccontextmanager
async def started_peer(peer_id: str, seed: int = 0, **overrides: Any) -> AsyncIterator[Peer]:
    overrides.setdefault("secret", SECRET)
    overrides.setdefault("request_timeout_s", 5.0)
    config = PeerConfig(peer_id=peer_id, **overrides)
    peer = Peer(make_model(seed), sgd, torch.nn.functional.cross_entropy, make_data(seed), config)
    await peer.start()
    # a peer refuses requests signed at or before the millisecond it started (replays
    # across a restart): let that millisecond pass before a test signs its first request
    await asyncio.sleep(0.002)
    try:
        yield peer
    finally:
        await peer.stop()


@pytest.fixture
def peer_factory() -> Callable[..., Any]:
    return started_peer


def model_bytes(peer: Peer) -> bytes:
    return peer.flat.vector.detach().numpy().tobytes()
