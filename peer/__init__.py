"""The networked gossip peer, in layers: protocol, transport, node, app.

Embed a peer in any asyncio program::

    from peer import Peer, PeerConfig
    async with Peer(model, optimizer_factory, loss_fn, batches, PeerConfig(peer_id="a")) as p:
        await p.run(steps=1000)

or in an ordinary synchronous training loop (the peer runs in a background thread and
gossips after ``optimizer.step()``, :mod:`peer.node.background`)::

    from peer import BackgroundPeer, PeerConfig
    with BackgroundPeer(model, optimizer, PeerConfig(peer_id="a", join=("10.0.0.2:7000",))):
        ...  # your loop, unchanged

Four layers, each importing only the ones below it (an import-linter contract):

* :mod:`peer.protocol`: what crosses the wire, with no HTTP library (envelopes, the strict
  msgpack and JSON readers, typed errors, signatures, the codec adapter);
* :mod:`peer.transport`: HTTP over aiohttp (the server's endpoints and admission, the
  client's calls, bodies); it knows a peer only through ``peer.transport.server.Service``;
* :mod:`peer.node`: one peer (:class:`~peer.node.peer.Peer`, its configuration, one
  exchange mode object, membership, trainer, health, metrics, checkpoints);
* :mod:`peer.app`: the commands (``gossipnet peer``, ``launch``, ``demo``, ``export``,
  ``status``).

The protocol is written down in docs/protocol.md and peer/openapi.yaml; docs/architecture.md
lists every module and its one job.

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
