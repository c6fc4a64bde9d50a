"""What a peer's server calls: the ``peer.transport.server.Service`` side of a :class:`~peer.node.peer.Peer`.

:func:`peer.transport.server.build_app` validates every request (signature, size caps, envelope,
payload) and then calls one of these; they answer from the peer's state:

* ``on_exchange`` (``POST /v1/exchange``): the async callee (:mod:`peer.node.pairwise`) or
  the sync callee (:mod:`peer.node.sync_round`), as ``PeerConfig.mode`` says;
* ``on_join`` (``POST /v1/join``): admit the newcomer, answer with the membership view;
* ``peers_view`` (``GET /v1/peers``), ``state_envelope`` (``GET /v1/state``: the model,
  uncompressed, for a newcomer to start from);
* ``status`` (``GET /v1/status``) and ``render_metrics`` (``GET /metrics``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from peer.node.membership import check_address
from peer.node.pairwise import PairwiseExchange
from peer.node.sync_round import SyncRound
from peer.protocol.codecs import DenseCodec
from peer.protocol.errors import InvalidSender, MalformedBody, UnknownPeer
from peer.protocol.threads import in_thread
from peer.protocol.wire import PROTOCOL_VERSION, Envelope, check_sender


class ServerHandlers(PairwiseExchange, SyncRound):
    """The server-facing room of a :class:`~peer.node.peer.Peer` (``peer.transport.server.Service``)."""

    async def on_exchange(self, envelope: Envelope, vector: torch.Tensor) -> Envelope:
        """Serve ``POST /v1/exchange`` (the body is already validated)."""
        self.membership.observe(envelope.sender)
        if self.config.mode == "async":
            return await self._pairwise_answer(envelope, vector)
        return await self._sync_answer(envelope, vector)

    def on_join(self, peer_id: str, address: str | None) -> list[dict[str, Any]]:
        """Serve ``POST /v1/join``: admit (or re-admit) the newcomer, answer with our view.

        The server has decoded the body strictly (``peer.protocol.strict_json``) and checked the
        types (``id`` a string, ``address`` a string or null); the values are checked here:
        ``invalid_sender`` for an id outside the pattern, ``malformed_body`` for an address
        that is not ``HOST:PORT``, ``unknown_peer`` for this peer's own id. Nothing is
        admitted unless every check passes.
        """
        if not isinstance(peer_id, str):
            raise InvalidSender(f"id must be a string, got {type(peer_id).__name__}")
        check_sender(peer_id)
        if peer_id == self.peer_id:
            raise UnknownPeer(f"id {peer_id!r} is already this peer's id; pick another")
        if address is not None:
            try:
                check_address(address)
            except ValueError as error:
                raise MalformedBody(str(error)) from None
        self.membership.observe(peer_id, address)
        return self.membership.view()

    def peers_view(self) -> list[dict[str, Any]]:
        """Serve ``GET /v1/peers``: the membership view."""
        return self.membership.view()

    async def state_envelope(self) -> Envelope:
        """Serve ``GET /v1/state``: the current model, uncompressed."""
        vector = await in_thread(self._snapshot)
        return Envelope(
            sender=self.peer_id,
            round=self.round,
            step=self.step,
            codec="none",
            payload=DenseCodec().encode(vector.cpu()),
        )

    def status(self) -> dict[str, Any]:
        """Serve ``GET /v1/status``: progress, configuration, neighbours, traffic, health
        (and refresh the member and health gauges of ``/metrics``)."""
        counts = self.membership.counts()
        for status, count in counts.items():
            self.metrics.members.labels(status=status).set(count)
        self.metrics.isolated.set(int(self.health.isolated))
        self.metrics.rounds_without_exchange.set(self.health.rounds_without_exchange)
        return {
            "v": PROTOCOL_VERSION,
            "id": self.peer_id,
            "address": self.address,
            "mode": self.config.mode,
            "round": self.round,
            "step": self.step,
            "loss": None if math.isnan(self.loss) else self.loss,
            "parameters": self.spec.numel,
            "dtype": str(self.spec.dtype).removeprefix("torch."),
            "compressor": self.codec.name,
            "aggregator": self.config.aggregator,
            "algorithm": self.config.algorithm,
            "local_steps": self.config.local_steps,
            "topology": self.config.topology,
            "rank": self.config.rank,
            "device": str(self.device),
            "neighbours": [m.to_json() for m in self.membership.members()],
            "bytes_in": self.metrics.bytes_total("in"),
            "bytes_out": self.metrics.bytes_total("out"),
            "authenticated": self.secret is not None,
            "serving_refused": 0 if self.serving_share is None else self.serving_share.refused,
            "byzantine": self.config.byzantine,
            **self.health.to_json(),
        }

    def render_metrics(self) -> bytes:
        """Serve ``GET /metrics``: the Prometheus text (gauges refreshed first)."""
        self.status()  # refreshes the member gauges
        return self.metrics.render()
