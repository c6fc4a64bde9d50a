"""A peer by composition: one exchange mode per peer, and a server view with every attribute
the server reads given explicitly (none left to the server's ``getattr`` defaults)."""

from __future__ import annotations

import typing

import pytest
import torch

from peer.node.config import PeerConfig
from peer.node.pairwise import PairwiseExchange
from peer.node.peer import Peer
from peer.node.sync_round import SyncRound
from peer.transport.admission import ServerLimits
from peer.transport.server import SERVER_STATE, Service

from .conftest import SECRET, make_data, make_model, sgd, started_peer

OPTIONAL = (
    "body_timeout_s",
    "max_connections",
    "max_unauthenticated_bytes",
    "idle_timeout_s",
    "retains_messages",
    "pin_buffers",
    "serving_share",
)
"""What the server reads "where present" (``ServerLimits.of`` and ``build_app``)."""


def _peer(mode: str) -> Peer:
    config = PeerConfig(peer_id="a", mode=mode, secret=SECRET)  # type: ignore[arg-type]
    return Peer(make_model(0), sgd, torch.nn.functional.cross_entropy, make_data(0), config)


@pytest.mark.parametrize(("mode", "kind"), [("sync", SyncRound), ("async", PairwiseExchange)])
def test_a_peer_holds_the_one_mode_its_config_names(mode: str, kind: type) -> None:
    peer = _peer(mode)
    assert type(peer.mode) is kind
    # the server reads received sync messages into fresh buffers; async ones into reused ones
    assert peer.retains_messages is (mode == "sync")
    assert (peer.serving_share is not None) is (mode == "async")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_every_attribute_the_server_reads_is_given(mode: str) -> None:
    peer = _peer(mode)
    members = [
        *typing.get_type_hints(Service),
        *(name for name in vars(Service) if not name.startswith("_")),
        *OPTIONAL,
    ]
    for service in (peer, peer.handlers):
        for name in members:
            assert hasattr(service, name), name
        for name in OPTIONAL:
            assert name in vars(service) or name in vars(type(service)), name
    assert peer.handlers.body_timeout_s == peer.config.request_timeout_s
    limits = ServerLimits.of(peer.handlers)
    assert limits == ServerLimits.of(peer)
    assert limits.max_concurrent_exchanges == peer.config.max_concurrent_exchanges
    assert limits.body_timeout_s == peer.config.request_timeout_s


async def test_the_server_serves_the_handlers_within_the_peers_limits() -> None:
    async with started_peer("a", max_concurrent_exchanges=3, request_timeout_s=7.0) as peer:
        assert peer.listening is not None
        state = peer.listening.runner.app[SERVER_STATE]
        assert state.limits == ServerLimits.of(peer.handlers)
        assert state.limits.max_concurrent_exchanges == 3
        assert state.limits.body_timeout_s == 7.0
