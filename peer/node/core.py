"""``PeerCore``: the parts of a peer that all its rooms share, built from its config.

A :class:`~peer.node.peer.Peer` is this core plus its rooms, each a mixin over it:
:mod:`peer.node.pairwise` (the async exchange), :mod:`peer.node.sync_round` (the synchronous
round), :mod:`peer.node.handlers` (what the server calls); :mod:`peer.node.peer` adds the
lifecycle, the membership joins and the round loop. The core holds

* the trainer (:class:`~peer.node.trainer.Trainer`: model, flat buffer, optimizer, lock,
  step, loss), whose references it exposes as ``model``, ``flat``, ``optimizer``,
  ``lock``, ``step`` and ``loss``;
* what is built once from :class:`~peer.node.config.PeerConfig`: the wire spec and body cap,
  the codec (seeded per peer) and the receiving codecs, the update rule and its state
  (the same object the simulator builds, ``gossip.configuration.build_algorithm``),
  the topology's neighbours, the secret and verifier, the Byzantine attack, metrics,
  exchange health and membership;
* the helpers every exchange uses: the round's neighbours, envelopes, the client, and
  the bookkeeping of a failed call.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import torch

import consensus
from gossip.compression import node_seed
from gossip.configuration import build_algorithm
from gossip.pairwise import PairwiseGossip
from peer.node.config import PeerConfig
from peer.node.health import ExchangeHealth
from peer.node.membership import Member, Membership
from peer.node.metrics import PeerMetrics
from peer.node.topology import TopologyNeighbours
from peer.node.trainer import Trainer
from peer.protocol.auth import RequestVerifier, load_secret
from peer.protocol.codecs import build_codec, receiving_codecs
from peer.protocol.wire import Envelope, ModelSpec, max_body_bytes
from peer.transport.admission import DEFAULT_SERVING_SHARE, ServingShare
from peer.transport.client import PeerClient

logger = logging.getLogger(__name__)

HEALTH_WINDOW_ROUNDS = 5
"""A peer with no successful exchange in this many rounds in a row is *isolated* (logged)."""


class PeerCore:
    """The shared parts of a peer (see the module docstring), around its ``trainer`` and
    built from its ``config``; :class:`~peer.node.peer.Peer` makes both from its arguments."""

    def __init__(self, trainer: Trainer, config: PeerConfig) -> None:
        self.config = config
        self.peer_id = config.peer_id
        self.device = trainer.device
        self.trainer = trainer
        """Local training: batches, gradient, optimizer step, evaluation (:mod:`peer.node.trainer`)."""
        self.model = self.trainer.model
        self.flat = self.trainer.flat
        self.optimizer = self.trainer.optimizer
        self.loss_fn = self.trainer.loss_fn
        self.train_data = self.trainer.train_data
        self.lock = self.trainer.lock
        """Guards the model, gradient and optimizer: hold it while training by hand."""
        self.spec = ModelSpec.of(self.flat.vector)
        self.max_concurrent_exchanges = config.max_concurrent_exchanges
        self.max_body_bytes = max_body_bytes(self.spec.num_bytes, factor=config.max_body_factor)
        self.codec = build_codec(
            config.gossip.compressor or "none", seed=node_seed(config.seed, config.peer_id)
        )
        self.codecs = receiving_codecs()
        # the same rule object the simulator builds for this configuration
        self.algorithm = build_algorithm(config.gossip)
        self.aggregator = self.algorithm.aggregator
        self.pairwise_rule = PairwiseGossip(self.aggregator)
        """AD-PSGD's halves (gossip.pairwise); the codec is the wire's (``self.codec``)."""
        self.gossip_state = self.algorithm.init(self.flat.vector)
        self.message_spec = ModelSpec(
            numel=self.algorithm.message_size(self.spec.numel), dtype=self.spec.dtype
        )
        """What a sync message holds (the model, or push-sum's ``[x, w]``)."""
        self.topology = (
            TopologyNeighbours(
                config.topology,
                config.peer_list,
                config.rank if config.rank is not None else -1,
                weights=config.topology_weights,
                seed=config.seed,
            )
            if config.topology is not None
            else None
        )
        self.secret = (
            config.secret if config.secret is not None else load_secret(config.secret_file)
        )
        self.verifier = (
            RequestVerifier(self.secret, peer_id=self.peer_id, clock_window_s=config.clock_window_s)
            if self.secret is not None
            else None
        )
        """Checks requests signed for this peer; it refuses every request signed before it
        was made (a restart's replay protection, ``peer.protocol.auth.RequestVerifier``)."""
        self.metrics = PeerMetrics(self.peer_id)
        self.attack = None if config.byzantine is None else consensus.build_attack(config.byzantine)
        """The attack this peer runs instead of honest messages (evaluation only), or None."""
        self._attack_generator = torch.Generator().manual_seed(
            node_seed(config.seed + 1, config.peer_id)
        )
        self.metrics.byzantine.set(0 if self.attack is None else 1)
        self.serving_share = (
            ServingShare(
                getattr(config, "max_serving_share", DEFAULT_SERVING_SHARE),
                self.trainer.training,
            )
            if config.mode == "async"
            else None
        )
        """While this peer trains, serving neighbours' exchanges takes at most this share of
        its time (async mode; a sync round serves each neighbour once per round by design)."""
        self.health = ExchangeHealth(self.peer_id, window=HEALTH_WINDOW_ROUNDS)
        """Exchanges that succeeded / failed per round; isolation (:mod:`peer.node.health`)."""
        self.membership = Membership(
            self.peer_id,
            None,
            suspect_after=config.suspect_after,
            evict_after=config.evict_after,
        )
        self.round = 0
        self.address: str | None = None
        self._rng = random.Random(f"{config.seed}:{self.peer_id}")
        self.client: PeerClient | None = None

    @property
    def step(self) -> int:
        """Optimizer steps taken (the trainer's count)."""
        return self.trainer.step

    @step.setter
    def step(self, value: int) -> None:
        self.trainer.step = value

    @property
    def loss(self) -> float:
        """The loss of the last training batch (NaN before the first)."""
        return self.trainer.loss

    # ------------------------------------------------------------------ shared helpers

    def _client(self) -> PeerClient:
        if self.client is None:
            raise RuntimeError("peer is not started: await peer.start() first")
        return self.client

    def _failed(self, member: Member, error: Exception) -> None:
        status = self.membership.record_failure(member.id)
        logger.info(
            "peer %s: call to %s failed (%s), now %s", self.peer_id, member.id, error, status
        )

    def _neighbours(self) -> list[Member]:
        """Members to exchange with this round: the view, or the topology's partners in it."""
        members = self.membership.neighbours()
        if self.topology is None:
            return members
        partners = self.topology.partners(self.round)
        return [m for m in members if m.address in partners]

    def _snapshot(self) -> torch.Tensor:
        """A copy of the model on the CPU (one copy: a GPU model goes straight to host)."""
        with self.lock:
            return self.flat.vector.to("cpu", copy=True)

    @property
    def retains_messages(self) -> bool:
        """Whether a received message outlives its request (sync rounds keep it until the
        round's combine): if not, the server reads exchanges into reused buffers."""
        return self.config.mode != "async"

    @property
    def pin_buffers(self) -> bool:
        """Receive and send buffers are page-locked when the model is on a GPU (one DMA copy
        each way, no pageable staging)."""
        return self.device.type == "cuda"

    @property
    def body_timeout_s(self) -> float:
        """How long a request body may take to arrive (the server's body deadline): the
        same as an outgoing call's total timeout."""
        return self.config.request_timeout_s

    def _envelope(self, vector: torch.Tensor) -> Envelope:
        return self._envelope_of(self.codec.encode(vector.cpu()))

    def _envelope_of(self, payload: dict[str, Any]) -> Envelope:
        return Envelope(
            sender=self.peer_id,
            round=self.round,
            step=self.step,
            codec=self.codec.name,
            payload=payload,
        )
