"""``PeerContext``: what the parts of one peer share, built once from its config.

A :class:`~peer.node.peer.Peer` is composed of parts that each hold only their own state:
its exchange mode (:class:`~peer.node.sync_round.SyncRound` or
:class:`~peer.node.pairwise.PairwiseExchange`), its membership protocol
(:class:`~peer.node.joins.MembershipProtocol`), its server handlers
(:class:`~peer.node.handlers.ServerHandlers`) and its checkpoints
(:class:`~peer.node.checkpoints.Checkpoints`). What they share is this context:

* the trainer (model, flat buffer, optimizer, model lock, step, loss);
* what is built from :class:`~peer.node.config.PeerConfig`: the wire spec and body cap,
  the codec (seeded per peer) and the receiving codecs, the update rule and its state
  (the same object the simulator builds, ``gossip.configuration.build_algorithm``), the
  topology's neighbours, the secret and verifier, the Byzantine attack, metrics, exchange
  health, membership and the peer's random generator;
* the three values that change over a peer's life: ``round`` (exchange phases run),
  ``address`` (where it listens, once started) and ``client`` (made by ``start``).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import torch

import consensus
from consensus.attacks import AttackBase
from gossip.algorithms import GossipAlgorithm
from gossip.compression import node_seed
from gossip.configuration import build_algorithm
from gossip.flat import FlatParameters
from peer.node.config import PeerConfig
from peer.node.health import ExchangeHealth
from peer.node.membership import Member, Membership
from peer.node.metrics import PeerMetrics
from peer.node.model_lock import ModelLock
from peer.node.straggler import Slowdown
from peer.node.topology import TopologyNeighbours
from peer.node.trainer import Trainer
from peer.protocol.codecs import Codec, build_codec, receiving_codecs
from peer.protocol.signatures import RequestVerifier
from peer.protocol.swarm_secret import load_secret, warn_open_swarm
from peer.protocol.tls import client_ssl_context
from peer.protocol.wire import Envelope, ModelSpec, max_body_bytes
from peer.transport.client import PeerClient
from peer.transport.shaping import EmulatedLink

logger = logging.getLogger(__name__)

HEALTH_WINDOW_ROUNDS = 5
"""A peer with no successful exchange in this many rounds in a row is *isolated* (logged)."""


@dataclass(eq=False)
class PeerContext:
    """The shared parts of one peer (see the module docstring); :meth:`build` makes them
    from a trainer and a config. ``round``, ``address`` and ``client`` change; the rest is
    fixed once built (``gossip_state`` is mutated in place by the rule)."""

    config: PeerConfig
    trainer: Trainer
    spec: ModelSpec
    """The model's flat vector: element count and dtype."""
    message_spec: ModelSpec
    """What a sync message holds (the model, or push-sum's ``[x, w]``)."""
    max_body_bytes: int
    codec: Codec
    """This peer's sending codec (seeded per peer)."""
    codecs: dict[str, Codec]
    """A decoder for every codec a peer accepts."""
    algorithm: GossipAlgorithm[Any]
    gossip_state: Any
    """The rule's state (``algorithm.init`` of the model)."""
    topology: TopologyNeighbours | None
    secret: bytes | None
    verifier: RequestVerifier | None
    """Checks requests signed for this peer; it refuses every request signed before it was
    made (a restart's replay protection, ``peer.protocol.signatures.RequestVerifier``)."""
    metrics: PeerMetrics
    health: ExchangeHealth
    membership: Membership
    attack: AttackBase | None
    """The attack this peer runs instead of honest messages (evaluation only), or None."""
    attack_generator: torch.Generator
    rng: random.Random
    """The peer's one random generator (neighbour order, view refreshes)."""
    link: EmulatedLink | None
    """The emulated uplink its client and server send on (seeded by seed and id), or None."""
    slowdown: Slowdown
    """The emulated straggler's stretch of each local step (factor 1: none)."""
    round: int = 0
    address: str | None = None
    client: PeerClient | None = None

    @classmethod
    def build(cls, trainer: Trainer, config: PeerConfig) -> PeerContext:
        """Every shared part, from ``config``, around ``trainer``."""
        flat = trainer.flat
        spec = ModelSpec.of(flat.vector, flat.layout)  # a refused payload names its tensor
        algorithm = build_algorithm(config.gossip)  # the same rule the simulator builds
        secret = config.secret if config.secret is not None else load_secret(config.secret_file)
        metrics = PeerMetrics(config.peer_id)
        attack = None if config.byzantine is None else consensus.build_attack(config.byzantine)
        metrics.byzantine.set(0 if attack is None else 1)
        topology = None
        if config.topology is not None:
            topology = TopologyNeighbours(
                config.topology,
                config.peer_list,
                config.rank if config.rank is not None else -1,
                weights=config.topology_weights,
                seed=config.seed,
            )
        return cls(
            config=config,
            trainer=trainer,
            spec=spec,
            message_spec=ModelSpec(
                numel=algorithm.message_size(spec.numel), dtype=spec.dtype, layout=flat.layout
            ),
            max_body_bytes=max_body_bytes(spec.num_bytes, factor=config.max_body_factor),
            codec=build_codec(
                config.gossip.compressor or "none", seed=node_seed(config.seed, config.peer_id)
            ),
            codecs=receiving_codecs(),
            algorithm=algorithm,
            gossip_state=algorithm.init(flat.vector),
            topology=topology,
            secret=secret,
            verifier=(
                RequestVerifier(
                    secret, peer_id=config.peer_id, clock_window_s=config.clock_window_s
                )
                if secret is not None
                else None
            ),
            metrics=metrics,
            health=ExchangeHealth(config.peer_id, window=HEALTH_WINDOW_ROUNDS),
            membership=Membership(
                config.peer_id,
                None,
                suspect_after=config.suspect_after,
                evict_after=config.evict_after,
            ),
            attack=attack,
            attack_generator=torch.Generator().manual_seed(
                node_seed(config.seed + 1, config.peer_id)
            ),
            rng=random.Random(f"{config.seed}:{config.peer_id}"),
            link=(
                EmulatedLink(config.link, seed=f"link:{config.seed}:{config.peer_id}")
                if config.link.shaped
                else None
            ),
            slowdown=Slowdown(config.slowdown),
        )

    # ------------------------------------------------------------------ the trainer's parts

    @property
    def peer_id(self) -> str:
        return self.config.peer_id

    @property
    def flat(self) -> FlatParameters:
        return self.trainer.flat

    @property
    def lock(self) -> ModelLock:
        """Guards the model, gradient and optimizer (``peer.node.model_lock``)."""
        return self.trainer.lock

    @property
    def device(self) -> torch.device:
        return self.trainer.device

    @property
    def step(self) -> int:
        """Optimizer steps taken (the trainer's count)."""
        return self.trainer.step

    @property
    def pin_buffers(self) -> bool:
        """Receive and send buffers are page-locked when the model is on a GPU (one DMA copy
        each way, no pageable staging)."""
        return self.device.type == "cuda"

    # ------------------------------------------------------------------ at start

    def warn_at_start(self) -> None:
        """Log what a starting peer's operator must know: a Byzantine peer, an open swarm
        (no secret), an algorithm on a topology it was not made for
        (``GossipConfig.topology_caveat``), floating-point buffers left out of averaging."""
        if self.attack is not None:
            logger.warning(
                "peer %s is BYZANTINE: every message it sends is the attack %r (for evaluating "
                "robust rules; never use in a real swarm)",
                self.peer_id,
                self.config.byzantine,
            )
        if self.secret is None:
            warn_open_swarm(self.peer_id)
        caveat = self.config.gossip.topology_caveat(self.config.topology)
        if caveat is not None:
            logger.warning("peer %s: %s", self.peer_id, caveat)
        local = self.trainer.local_buffers
        if local:
            logger.warning(
                "peer %s: average_buffers is off; its floating-point buffers stay local and "
                "are never averaged: %s",
                self.peer_id,
                ", ".join(local),
            )

    def open_client(self) -> PeerClient:
        """Make :attr:`client` (signing with the secret, TLS if configured, counting bytes)."""
        config = self.config
        context = None
        if config.tls_cert is not None or config.tls_ca is not None:
            context = client_ssl_context(
                cafile=config.tls_ca, certfile=config.tls_cert, keyfile=config.tls_key
            )
        self.client = PeerClient(
            secret=self.secret,
            timeout_s=config.request_timeout_s,
            max_body_bytes=self.max_body_bytes,
            ssl_context=context,
            on_bytes=lambda direction, n: self.metrics.bytes(direction=direction).inc(n),
            link=self.link,
        )
        return self.client

    # ------------------------------------------------------------------ shared helpers

    def started_client(self) -> PeerClient:
        """The client; a ``RuntimeError`` before ``start`` made it."""
        if self.client is None:
            raise RuntimeError("peer is not started: await peer.start() first")
        return self.client

    def failed(self, member: Member, error: Exception) -> None:
        """A call to ``member`` failed: count it towards suspicion, and log it."""
        status = self.membership.record_failure(member.id)
        logger.info(
            "peer %s: call to %s failed (%s), now %s", self.peer_id, member.id, error, status
        )

    def neighbours(self) -> list[Member]:
        """Members to exchange with this round: the view, or the topology's partners in it."""
        members = self.membership.neighbours()
        if self.topology is None:
            return members
        partners = self.topology.partners(self.round)
        return [m for m in members if m.address in partners]

    def snapshot(self) -> torch.Tensor:
        """A copy of the model on the CPU (one copy: a GPU model goes straight to host);
        takes the model lock (call it in a worker thread)."""
        with self.lock:
            return self.flat.vector.to("cpu", copy=True)

    def envelope(self, vector: torch.Tensor) -> Envelope:
        """``vector`` encoded with this peer's codec, in an envelope of this round."""
        return self.envelope_of(self.codec.encode(vector.cpu()))

    def envelope_of(self, payload: dict[str, Any]) -> Envelope:
        """An envelope of this round and step around an encoded ``payload``."""
        return Envelope(
            sender=self.peer_id,
            round=self.round,
            step=self.step,
            codec=self.codec.name,
            payload=payload,
        )
