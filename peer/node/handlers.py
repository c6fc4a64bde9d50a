"""What a peer's server calls: :class:`ServerHandlers`, a ``peer.transport.server.Service``.

:func:`peer.transport.server.build_app` validates every request (signature, size caps, envelope,
payload) and then calls one of these; they answer from the peer's shared parts
(:class:`~peer.node.context.PeerContext`) and its exchange mode:

* ``on_exchange`` (``POST /v1/exchange``): the mode's answer, the async callee
  (:mod:`peer.node.pairwise`) or the sync callee (:mod:`peer.node.sync_round`);
* ``on_join`` (``POST /v1/join``): admit the newcomer, answer with the membership view;
* ``on_leave`` (``POST /v1/leave``): a member that stops cleanly says goodbye: it has left;
* ``peers_view`` (``GET /v1/peers``), ``state_envelope`` (``GET /v1/state``: the model,
  uncompressed, for a newcomer to start from);
* ``status`` (``GET /v1/status``) and ``render_metrics`` (``GET /metrics``).

Every attribute the server reads is a typed attribute here, the optional limits included
(``None``: the server's default).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from peer.node.context import PeerContext
from peer.node.membership import check_address
from peer.node.metrics import PeerMetrics
from peer.node.modes import ExchangeMode
from peer.node.privacy import privacy_status
from peer.protocol.codecs import Codec, DenseCodec
from peer.protocol.errors import InvalidSender, MalformedBody, UnknownPeer
from peer.protocol.signatures import RequestVerifier
from peer.protocol.threads import in_thread
from peer.protocol.wire import PROTOCOL_VERSION, Envelope, ModelSpec, check_sender
from peer.transport.admission import ServingShare

logger = logging.getLogger(__name__)


class ServerHandlers:
    """The server-facing part of a :class:`~peer.node.peer.Peer` (``peer.transport.server.Service``)
    over its shared parts ``ctx`` and its exchange ``mode``."""

    def __init__(self, ctx: PeerContext, mode: ExchangeMode) -> None:
        self.ctx = ctx
        self.mode = mode
        config = ctx.config
        self.peer_id: str = ctx.peer_id
        self.spec: ModelSpec = ctx.spec
        self.message_spec: ModelSpec = ctx.message_spec
        self.max_body_bytes: int = ctx.max_body_bytes
        self.max_concurrent_exchanges: int = config.max_concurrent_exchanges
        self.codecs: dict[str, Codec] = ctx.codecs
        self.verifier: RequestVerifier | None = ctx.verifier
        self.secret: bytes | None = ctx.secret
        self.body_timeout_s: float = config.request_timeout_s
        """How long a request body may take to arrive (the server's body deadline): the
        same as an outgoing call's total timeout."""
        self.max_connections: int | None = None
        """Open connections at once; ``None``: the server's default for the exchange bound."""
        self.max_unauthenticated_bytes: int | None = None
        """Body bytes held by requests not yet verified; ``None``: the server's default."""
        self.idle_timeout_s: float | None = None
        """When an idle connection closes; ``None``: the server's default."""
        self.retains_messages: bool = mode.retains_messages
        """Whether a received message outlives its request (sync rounds keep it until the
        round's combine): if not, the server reads exchanges into reused buffers."""
        self.pin_buffers: bool = ctx.pin_buffers
        self.serving_share: ServingShare | None = mode.serving_share

    @property
    def metrics(self) -> PeerMetrics:
        return self.ctx.metrics

    async def on_exchange(self, envelope: Envelope, vector: torch.Tensor) -> Envelope:
        """Serve ``POST /v1/exchange`` (the body is already validated)."""
        self.ctx.membership.observe(envelope.sender)
        return await self.mode.answer(envelope, vector)

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
        self.ctx.membership.observe(peer_id, address)
        return self.ctx.membership.view()

    def on_leave(self, peer_id: str) -> list[dict[str, Any]]:
        """Serve ``POST /v1/leave``: a member says goodbye as it stops cleanly; mark it
        left (not called, not shared, not counted as a failure) and answer with our view.
        ``invalid_sender`` for an id outside the pattern, ``unknown_peer`` for this peer's
        own id; an id we do not know changes nothing."""
        check_sender(peer_id)
        if peer_id == self.peer_id:
            raise UnknownPeer(f"id {peer_id!r} is this peer's own id")
        if self.ctx.membership.mark_left(peer_id):
            logger.info("peer %s: %s left the swarm (goodbye)", self.peer_id, peer_id)
        return self.ctx.membership.view()

    def peers_view(self) -> list[dict[str, Any]]:
        """Serve ``GET /v1/peers``: the membership view."""
        return self.ctx.membership.view()

    async def state_envelope(self) -> Envelope:
        """Serve ``GET /v1/state``: the current model, uncompressed."""
        vector = await in_thread(self.ctx.snapshot)
        return Envelope(
            sender=self.peer_id,
            round=self.ctx.round,
            step=self.ctx.step,
            codec="none",
            payload=DenseCodec().encode(vector.cpu()),
        )

    def status(self) -> dict[str, Any]:
        """Serve ``GET /v1/status``: progress, configuration, neighbours, traffic, health
        (and refresh the member and health gauges of ``/metrics``)."""
        counts = self.ctx.membership.counts()
        for status, count in counts.items():
            self.ctx.metrics.members.labels(status=status).set(count)
        self.ctx.metrics.isolated.set(int(self.ctx.health.isolated))
        self.ctx.metrics.rounds_without_exchange.set(self.ctx.health.rounds_without_exchange)
        loss = self.ctx.trainer.loss
        return {
            "v": PROTOCOL_VERSION,
            "id": self.peer_id,
            "address": self.ctx.address,
            "mode": self.ctx.config.mode,
            "round": self.ctx.round,
            "step": self.ctx.step,
            "loss": None if math.isnan(loss) else loss,
            "parameters": self.ctx.spec.numel,
            "dtype": str(self.ctx.spec.dtype).removeprefix("torch."),
            "compressor": self.ctx.codec.name,
            "aggregator": self.ctx.config.aggregator,
            "algorithm": self.ctx.config.algorithm,
            "local_steps": self.ctx.config.local_steps,
            "topology": self.ctx.config.topology,
            "rank": self.ctx.config.rank,
            "device": str(self.ctx.device),
            "neighbours": [m.to_json() for m in self.ctx.membership.members()],
            "bytes_in": self.ctx.metrics.bytes_total("in"),
            "bytes_out": self.ctx.metrics.bytes_total("out"),
            "authenticated": self.ctx.secret is not None,
            "serving_refused": 0 if self.serving_share is None else self.serving_share.refused,
            "byzantine": self.ctx.config.byzantine,
            **self.ctx.slowdown.to_json(),
            **self.ctx.health.to_json(),
            **privacy_status(self.ctx.trainer.privacy),
        }

    def render_metrics(self) -> bytes:
        """Serve ``GET /metrics``: the Prometheus text (gauges refreshed first)."""
        self.status()  # refreshes the member gauges
        return self.ctx.metrics.render()
