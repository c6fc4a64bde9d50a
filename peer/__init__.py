"""The networked gossip peer: wire format, auth, server and client, membership, checkpoints.

Embed a peer in any asyncio program::

    from peer import Peer, PeerConfig
    async with Peer(model, optimizer_factory, loss_fn, batches, PeerConfig(peer_id="a")) as p:
        await p.run(steps=1000)

or in an ordinary synchronous training loop (the peer runs in a background thread and
gossips after ``optimizer.step()``, :mod:`peer.node.background`)::

    from peer import BackgroundPeer, PeerConfig
    with BackgroundPeer(model, optimizer, PeerConfig(peer_id="a", join=("10.0.0.2:7000",))):
        ...  # your loop, unchanged

Modules: :mod:`peer.protocol.wire` (versioned msgpack envelope, raw tensor bytes, size
caps), :mod:`peer.protocol.auth` (HMAC-SHA256 signatures, TLS contexts),
:mod:`peer.transport.server` / :mod:`peer.transport.client` (the ``/v1`` endpoints),
:mod:`peer.node.membership`, :mod:`peer.node.checkpoint`, :mod:`peer.protocol.codecs`,
:mod:`peer.node.config`, :mod:`peer.node.peer` (:class:`Peer`, a facade over its rooms:
:mod:`peer.node.core`, :mod:`peer.node.trainer`, :mod:`peer.node.pairwise`, :mod:`peer.node.sync_round`,
:mod:`peer.node.handlers`, :mod:`peer.node.training_state`), :mod:`peer.app.cli` (``gossipnet
peer``, running through :mod:`peer.app.run`). The protocol is written down in
docs/protocol.md and peer/openapi.yaml. :mod:`peer.transport.admission` holds the server's bounds,
:mod:`peer.protocol.strict_json` the one decoder of network JSON, :mod:`peer.app.export` the model a
user takes home (``load_model``).

``Peer``, ``BackgroundPeer`` and ``PeerConfig`` are imported on first use, so
``gossipnet status`` (which needs none of them) answers without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from peer.node.background import BackgroundPeer
    from peer.node.config import PeerConfig
    from peer.node.peer import Peer

__all__ = ["BackgroundPeer", "Peer", "PeerConfig"]


def __getattr__(name: str) -> Any:
    if name == "Peer":
        from peer.node.peer import Peer

        return Peer
    if name == "BackgroundPeer":
        from peer.node.background import BackgroundPeer

        return BackgroundPeer
    if name == "PeerConfig":
        from peer.node.config import PeerConfig

        return PeerConfig
    raise AttributeError(f"module 'peer' has no attribute {name!r}")
