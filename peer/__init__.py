"""The networked gossip peer: wire format, auth, server and client, membership, checkpoints.

Embed a peer in any asyncio program::

    from peer import Peer, PeerConfig
    async with Peer(model, optimizer_factory, loss_fn, batches, PeerConfig(peer_id="a")) as p:
        await p.run(steps=1000)

or in an ordinary synchronous training loop (the peer runs in a background thread and
gossips after ``optimizer.step()``, :mod:`peer.background`)::

    from peer import BackgroundPeer, PeerConfig
    with BackgroundPeer(model, optimizer, PeerConfig(peer_id="a", join=("10.0.0.2:7000",))):
        ...  # your loop, unchanged

Modules: :mod:`peer.wire` (versioned msgpack envelope, raw tensor bytes, size
caps), :mod:`peer.auth` (HMAC-SHA256 signatures, TLS contexts),
:mod:`peer.server` / :mod:`peer.client` (the ``/v1`` endpoints),
:mod:`peer.membership`, :mod:`peer.checkpoint`, :mod:`peer.codecs`,
:mod:`peer.config`, :mod:`peer.node` (:class:`Peer`, a facade over its rooms:
:mod:`peer.core`, :mod:`peer.trainer`, :mod:`peer.pairwise`, :mod:`peer.sync_round`,
:mod:`peer.handlers`, :mod:`peer.training_state`), :mod:`peer.cli` (``gossipnet
peer``, running through :mod:`peer.run`). The protocol is written down in
docs/protocol.md and peer/openapi.yaml. :mod:`peer.admission` holds the server's bounds,
:mod:`peer.strict_json` the one decoder of network JSON, :mod:`peer.export` the model a
user takes home (``load_model``).

``Peer``, ``BackgroundPeer`` and ``PeerConfig`` are imported on first use, so
``gossipnet status`` (which needs none of them) answers without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peer.background import BackgroundPeer
    from peer.config import PeerConfig
    from peer.node import Peer

__all__ = ["BackgroundPeer", "Peer", "PeerConfig"]


def __getattr__(name: str) -> Any:
    if name == "Peer":
        from peer.node import Peer

        return Peer
    if name == "BackgroundPeer":
        from peer.background import BackgroundPeer

        return BackgroundPeer
    if name == "PeerConfig":
        from peer.config import PeerConfig

        return PeerConfig
    raise AttributeError(f"module 'peer' has no attribute {name!r}")
