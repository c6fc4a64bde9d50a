"""Gossip algorithms from ``gossip/`` run over all n peers at once, with Byzantine peers.

:class:`SynchronousGossip` drives any ``gossip.GossipAlgorithm`` (D-PSGD in either order,
local SGD, push-sum/SGP, CHOCO with a compressor, robust gossip through a ``consensus``
rule) exactly as its :class:`gossip.RoundPlan` says: ``gradient`` -> one ``vmap(grad)`` over
the peers, ``step`` -> the batched optimizer, ``exchange`` -> ``message``, the compressor,
a gather along the round's neighbour table (Byzantine senders' rows replaced by the attack)
and ``combine``. The network model charges each round its critical path,
``max_i (H·t_i + Σ_{j ∈ out(i)} (α_ij + M_i/B_ij))``, with M_i the bytes of the body peer i
sends (``gossip.compression.envelope_bytes``: the compressor's real encoded payload in the
envelope a peer wraps it in, peer i named ``peer-i`` as ``gossipnet launch`` names it, with
the round and its step counter), which is also what each message is charged.

:class:`AsynchronousGossip` is AD-PSGD (Lian et al., ICML 2018) driven by the discrete-event
simulation of :func:`sim.network.asynchronous_gossip_events`: each peer computes a gradient,
averages with one random neighbour (``gossip.PairwiseGossip``) and applies its gradient.
A round is the next n events in time order, run as :func:`conflict_free_waves`: each wave a
matching of disjoint pairs, batched, which gives the result of running the events one by
one in time order. Only the rows of a wave's peers are read and written: a round costs
O(n·d) like a synchronous one.

Memory, in ``[n, d]`` tensors of the model's dtype (d parameters, n peers): the parameters
(1), plus the optimizer's per-row state (SGD momentum 1, Adam 2), plus for synchronous gossip
a second buffer the exchange mixes into (1; it becomes the parameters by a storage swap).
Everything else is a block of peers at a time: gradients (:class:`BlockedOptimizer`, also for
combine-then-adapt), the gathered inboxes, Byzantine messages and AD-PSGD's waves. The
generic path (a stateful rule, push-sum, CHOCO) holds the whole ``[n, k, m]`` inbox and an
``[n, d]`` gradient buffer for combine-then-adapt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from consensus import byzantine_messages
from consensus.attacks import Attack
from gossip.algorithms import (
    DecentralizedSGD,
    GossipAlgorithm,
    GossipState,
    neighbourhood_fits,
)
from gossip.compression import launch_envelope_bytes, launch_peer_id, node_generators
from gossip.pairwise import PairwiseGossip, ad_psgd
from gossip.secure_sum import PAYLOAD_CODEC, SeededKeys, mix_sums, payload_bytes, secure_sums
from sim.algorithms import Context, RoundReport, _mean_loss
from sim.mixing import Injection, gather_mix, gather_rows, keeps_state, rows_for_budget
from sim.network import asynchronous_gossip_events
from sim.optimizers import BlockedOptimizer
from topologies.schedules import Schedule


@dataclass(frozen=True)
class _Hood:
    """One exchange's neighbour table as :func:`sim.engine.gather_mix` reads it."""

    index: Tensor
    weight: Tensor
    mask: Tensor
    self_weight: Tensor


def _row_tensors(state: Any, n: int) -> list[Tensor]:
    """The per-node tensors ``[n, ...]`` of an algorithm's state: its ``row_tensors()`` where
    the state lists them (an outer optimizer's buffers live outside the dataclass fields),
    else the tensors among its dataclass fields."""
    listed = getattr(state, "row_tensors", None)
    if callable(listed):
        values = list(listed())
    else:
        values = [getattr(state, f.name) for f in dataclasses.fields(state)]
    unique: dict[int, Tensor] = {}
    for value in values:
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == n:
            unique.setdefault(id(value), value)
    return list(unique.values())


@contextlib.contextmanager
def keeping_rows(state: Any, n: int, rows: Tensor) -> Iterator[None]:
    """Rows ``rows`` of every per-node tensor of ``state`` come out of the block as they went
    in (nodes that keep their state for an exchange: dead, or too few neighbours for the
    rule). State the block creates (an outer optimizer's first step) is zero in those rows:
    a node that has never stepped holds zero momentum and moments."""
    saved = [(t, t[rows].clone()) for t in _row_tensors(state, n)]
    yield
    with torch.no_grad():
        for tensor, value in saved:
            tensor[rows] = value
        known = {id(tensor) for tensor, _ in saved}
        for tensor in _row_tensors(state, n):
            if id(tensor) not in known:
                tensor[rows] = 0


@dataclass
class SynchronousGossip:
    """A ``gossip`` algorithm on a ``topologies.Schedule``, all peers in lock-step.

    Args:
        algorithm: e.g. ``gossip.DecentralizedSGD(aggregator=consensus.build("trimmed-mean:b=1"))``.
        schedule: ``topologies.Static(W)``, ``OnePeerExponential(n)``, ``RandomMatching(n, seed)``...
        attack: what Byzantine peers (``ctx.byzantine``) send instead of their messages.
        name: the name in records (default: the algorithm's).
    """

    algorithm: GossipAlgorithm
    schedule: Schedule
    attack: Attack | None = None
    name: str = ""
    secure: SeededKeys | None = None
    """Secure neighbour sums (``gossip.secure_sum``) with these keys, or None: plain mixing."""
    skipped_sums: int = field(default=0, init=False)
    """With secure sums: how many times a live receiver kept its model because a message of
    its row was missing (a sender down, or the message lost)."""
    state: Any = field(default=None, init=False, repr=False)
    _mixed: Tensor | None = field(default=None, init=False, repr=False)
    _late: Tensor | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.name = self.name or self.algorithm.name

    def setup(self, ctx: Context) -> None:
        if self.schedule.n != ctx.n:
            raise ValueError(
                f"schedule: has {self.schedule.n} nodes but the simulation has {ctx.n} peers"
            )
        table = self.schedule.neighbour_table(0)
        full = torch.as_tensor(table.mask, dtype=torch.bool, device=ctx.device)
        # only honest receivers count: a Byzantine peer's own aggregate is never used (what it
        # sends is the attack's), and one whose neighbourhood is too small keeps its model
        honest = ctx.honest
        if not bool(self._enough(full)[honest].all()):
            smallest = int(full[honest].sum(dim=1).min()) + 1
            raise ValueError(
                f"aggregator: {getattr(self.algorithm, 'aggregator', None)!r} cannot run on this "
                f"topology: its smallest neighbourhood has n = {smallest} (own + neighbours); "
                "use a denser topology or a smaller Byzantine budget"
            )
        # the peers' stacked parameters are trained in place (no second [n, d] copy)
        self.state = self.algorithm.init(ctx.peers.params)
        self.parameters = self.algorithm.model(self.state)
        # gradient + step fused per cache-sized block of peers (exactly one optimizer over all)
        self.trainer = BlockedOptimizer(ctx.peers, self.parameters, ctx.optimizer.build)
        # node i's codec draws from the generator peer-i would seed (gossip.compression
        # .node_generators): a randomized codec sends what the networked peer would send
        self.generators = node_generators(ctx.seed, [launch_peer_id(i) for i in range(ctx.n)])

    def round(self, ctx: Context) -> RoundReport:
        alive = ctx.alive()
        table = self.schedule.neighbour_table(ctx.round)
        losses = torch.full((ctx.n,), float("nan"), device=ctx.device)
        grads: Tensor | None = None
        deferred: tuple[Tensor, Tensor] | None = None  # a gradient the exchange takes
        stepped = False  # the exchange did the step phase that follows it
        local_steps = 0
        exchanges = 0
        sent_bytes = np.zeros(ctx.n)
        phases = self.algorithm.plan.phases()
        for position, phase in enumerate(phases):
            following = phases[position + 1 : position + 3]
            if phase == "gradient":
                x, y = ctx.batch()
                if following[:1] == ("step",):
                    losses = self.trainer.step(x, y, alive)  # the step phase is done here
                elif following == ("exchange", "step") and self._defers_gradient():
                    deferred = (x, y)  # combine-then-adapt: gradient and step in the exchange
                else:  # kept for a later step phase, in the trainer's reused buffer
                    losses, grads = ctx.peers.gradients(
                        x, y, self.parameters, out=self.trainer.grads
                    )
            elif phase == "step":
                if (position > 0 and phases[position - 1] == "gradient") or stepped:
                    stepped = False
                    local_steps += 1
                    continue
                if grads is None:
                    raise RuntimeError(f"plan {phases}: a step phase needs a gradient phase first")
                self.trainer.step_with(grads, alive)
                local_steps += 1
            else:  # the senders' step counters, as their envelopes carry them
                # exchange k of K in a round is the peers' round R * K + k (peer.node counts
                # every exchange as a round): its message loss and envelope are that one's
                gossip_steps = self.algorithm.plan.gossip_steps
                sent, taken = self._exchange(
                    ctx,
                    table,
                    alive,
                    ctx.step_count + local_steps,
                    deferred,
                    exchange=ctx.round * gossip_steps + exchanges,
                )
                sent_bytes += sent
                if deferred is not None and taken is not None:
                    losses, deferred, stepped = taken, None, True
                exchanges += 1
        ctx.step_count[alive.cpu().numpy()] += local_steps
        compute = np.zeros(ctx.n)
        for local in range(local_steps):
            compute += ctx.compute.sample(ctx.round * max(local_steps, 1) + local)
        communication = exchanges * self._send_time(ctx, table, alive)
        up = alive.cpu().numpy()
        time = float((compute + communication)[up].max()) if up.any() else 0.0
        honest_alive = alive & ctx.honest
        return RoundReport(
            time,
            sent_bytes,
            steps=int(up.sum()) * local_steps,
            train_loss=_mean_loss(losses, honest_alive),
        )

    def _defers_gradient(self) -> bool:
        """Whether combine-then-adapt's gradient can be taken inside the exchange: plain
        D-PSGD, whose exchange leaves the pre-mixing models readable until it ends (its
        ``late`` is a no-op), so a block of gradients at a time replaces an ``[n, d]`` buffer."""
        return (
            type(self.algorithm) is DecentralizedSGD
            and isinstance(self.state, GossipState)
            and self.state.x is self.parameters
        )

    def _exchange(
        self,
        ctx: Context,
        table: Any,
        alive: Tensor,
        steps: np.ndarray,
        batch: tuple[Tensor, Tensor] | None = None,
        *,
        exchange: int,
    ) -> tuple[np.ndarray, Tensor | None]:
        """One exchange (number ``exchange`` of the run: the round times the plan's gossip
        steps, plus the exchange's place in the round); returns the bytes each peer sent.
        With ``batch`` (combine-then-adapt, :meth:`_defers_gradient`), also the gradient at
        the pre-mixing models on that batch and the optimizer step on the mixed ones, and
        returns their losses too."""
        device = ctx.device
        index = torch.as_tensor(table.index, dtype=torch.long, device=device)
        listening = torch.as_tensor(table.mask, dtype=torch.bool, device=device)
        mask = listening & alive[index]
        delivered = ctx.failures.delivered(exchange, tuple(index.shape))
        mask &= torch.from_numpy(delivered).to(device)
        # a dead receiver, or one that heard from too few neighbours for the rule's bound,
        # keeps its state this exchange: mix it with the full table, then restore its rows
        frozen = ~alive | ~self._enough(mask)
        if self.secure is not None:
            return self._secure_exchange(ctx, table, alive, mask, frozen, steps, batch)
        mask = torch.where(frozen.unsqueeze(1), listening, mask)
        if self._late is not None:  # last exchange's lost messages arrive now, one round late
            self.algorithm.late(self.state, self._late, self._late)
            self._late = None
        message = self.algorithm.message(self.state)
        weights = torch.as_tensor(table.weight, dtype=message.dtype, device=device)
        self_weight = torch.as_tensor(table.self_weight, dtype=message.dtype, device=device)
        compressed = self.algorithm.compressor.compress(message, self.generators)
        # what peer-i's body for this message would weigh (gossip.compression.envelope)
        self.message_bytes = launch_envelope_bytes(
            compressed.wire_bytes,
            round=exchange,
            steps=steps,
            codec=self.algorithm.compressor.codec,
        )
        sent = compressed.values
        sent_bytes = self._sent_bytes(ctx, index, listening, alive, self.message_bytes)
        attacked = mask
        hopeless = ~self._enough(listening)
        if bool(hopeless.any()):
            # a receiver whose whole table is too small for the rule (a Byzantine one: setup
            # refuses any honest one) keeps its model: the rule runs on its own vector in
            # every slot, no attack enters, and the frozen row is restored after
            rows = hopeless.nonzero()
            index, mask = index.clone(), mask.clone()
            index[rows.squeeze(1)] = rows
            mask[rows.squeeze(1)] = True
            attacked = mask & ~hopeless.unsqueeze(1)
        inject = self._injection(ctx, sent, index, weights, attacked)
        losses: Tensor | None = None
        if self._streams(ctx, sent):
            # plain D-PSGD with a stateless rule: mix a cache-sized chunk of receivers at a
            # time into a reused buffer (no [n, k, d] gather; Byzantine messages injected
            # chunk by chunk), then restore frozen rows. The same rule on the same rows as
            # ``algorithm.combine``, so the same numbers.
            x = self.state.x
            assert isinstance(self.algorithm, DecentralizedSGD)  # checked by _streams
            if self._mixed is None or self._mixed.shape != x.shape:
                self._mixed = torch.empty_like(x)
            chunk = rows_for_budget(ctx.n, int(index.shape[1]), int(x.shape[1]))
            hood = _Hood(index, weights, mask, self_weight)
            mixed = gather_mix(
                x,
                hood,
                self.algorithm.aggregator,
                sent=sent,
                chunk_rows=chunk,
                out=self._mixed,
                inject=inject,
            )
            rows = frozen.nonzero().squeeze(1)
            with torch.no_grad():
                mixed[rows] = x[rows]
                if x is self.parameters and mixed is self._mixed:
                    old = self.trainer.swap(mixed)  # no [n, d] copy back
                    if batch is not None:  # gradient at the pre-mixing rows, block by block
                        losses = self.trainer.step(*batch, alive, at=old)
                    self._mixed = old
                    return sent_bytes, losses
                x.copy_(mixed)
            if batch is not None:
                raise RuntimeError("a deferred gradient needs the parameters to be the model")
            return sent_bytes, None
        if batch is not None:  # the models are untouched until combine: gradient now
            losses, grads = ctx.peers.gradients(*batch, self.parameters, out=self.trainer.grads)
        received = gather_rows(sent, index)
        if inject is not None:
            received = inject(slice(0, ctx.n), received)
        rows = frozen.nonzero().squeeze(1)
        # messages lost in transit to a live receiver are not gone: the transport retries and
        # they arrive at the next exchange, where the rule's ``late`` decides what they do
        lost = listening & alive[index] & ~mask & ~frozen.unsqueeze(1)
        if bool(lost.any()):
            late = torch.where(lost, weights, 0.0).unsqueeze(-1) * received
            self._late = late.sum(dim=1)
        with keeping_rows(self.state, ctx.n, rows):
            self.algorithm.combine(self.state, sent, received, weights, mask, self_weight)
        if batch is not None:
            self.trainer.step_with(grads, alive)
        return sent_bytes, losses

    def _secure_exchange(
        self,
        ctx: Context,
        table: Any,
        alive: Tensor,
        delivered: Tensor,
        frozen: Tensor,
        steps: np.ndarray,
        batch: tuple[Tensor, Tensor] | None,
    ) -> tuple[np.ndarray, Tensor | None]:
        """One exchange with secure sums (``gossip.secure_sum.secure_sums``): each receiver
        mixes the unmasked sum of its in-neighbours' masked messages, or keeps its model
        when any of them is missing (``delivered [n, k]``: sent by a live peer, not lost)."""
        assert self.secure is not None
        message = self.algorithm.message(self.state)
        self.message_bytes = launch_envelope_bytes(
            payload_bytes(int(message.shape[1])),
            round=ctx.round,
            steps=steps,
            codec=PAYLOAD_CODEC,
        )
        device = ctx.device
        index = torch.as_tensor(table.index, dtype=torch.long, device=device)
        listening = torch.as_tensor(table.mask, dtype=torch.bool, device=device)
        sent_bytes = self._sent_bytes(ctx, index, listening, alive, self.message_bytes)
        sums, totals, complete = secure_sums(
            message,
            np.asarray(table.index),
            np.asarray(table.weight),
            np.asarray(table.mask),
            (delivered | ~listening).cpu().numpy(),
            ctx.round,
            self.secure,
        )
        complete = complete.to(device) & ~frozen
        self.skipped_sums += int((alive & ~complete).sum())
        losses: Tensor | None = None
        grads: Tensor | None = None
        if batch is not None:  # the models are untouched until combine: gradient now
            losses, grads = ctx.peers.gradients(*batch, self.parameters, out=self.trainer.grads)
        rows = (~complete).nonzero().squeeze(1)
        with keeping_rows(self.state, ctx.n, rows):
            mix_sums(self.algorithm, self.state, message, sums.to(device), totals, complete)
        if grads is not None:
            self.trainer.step_with(grads, alive)
        return sent_bytes, losses

    def _injection(
        self, ctx: Context, sent: Tensor, index: Tensor, weights: Tensor, mask: Tensor
    ) -> Injection | None:
        """What Byzantine senders put in a chunk of receivers' inboxes (``consensus``'s
        :func:`~consensus.byzantine_messages` for those receivers), or None without any."""
        attack = self.attack
        if attack is None or not bool(ctx.byzantine.any()):
            return None
        byzantine = ctx.byzantine

        def inject(receivers: slice, received: Tensor) -> Tensor:
            nodes = torch.arange(
                receivers.start, receivers.stop, dtype=torch.long, device=index.device
            )
            return byzantine_messages(
                attack,
                sent,
                received,
                index[receivers],
                weights[receivers],
                mask[receivers],
                byzantine,
                receivers=nodes,
            )

        return inject

    @staticmethod
    def _sent_bytes(
        ctx: Context, index: Tensor, listening: Tensor, alive: Tensor, message_bytes: np.ndarray
    ) -> np.ndarray:
        """Each live sender transmits its message (``message_bytes [n]``, the envelope a peer
        would send) once per receiver that listens to it."""
        heard_by = listening & alive.unsqueeze(1)
        out_degree = np.bincount(index[heard_by].cpu().numpy(), minlength=ctx.n)
        return np.where(alive.cpu().numpy(), out_degree * message_bytes, 0).astype(np.float64)

    def _streams(self, ctx: Context, sent: Tensor) -> bool:
        """Whether this exchange can mix chunk by chunk (:func:`sim.mixing.gather_mix`): plain
        D-PSGD state, a stateless rule (Byzantine messages or not), a message of the model's
        dtype."""
        return (
            type(self.algorithm) is DecentralizedSGD
            and not keeps_state(self.algorithm.aggregator)
            and isinstance(self.state, GossipState)
            and sent.dim() == 2
            and sent.shape == self.state.x.shape
            and sent.dtype == self.state.x.dtype
        )

    def _enough(self, mask: Tensor) -> Tensor:
        """``[n]`` bool: whose neighbourhood (own + present neighbours) meets the rule's bound."""
        return neighbourhood_fits(self.algorithm.aggregator, mask.sum(dim=1) + 1)

    def _send_time(self, ctx: Context, table: Any, alive: Tensor) -> np.ndarray:
        """Per sender j: ``Σ_{i listening to j} (α_ji + M_j/B_ji)`` for one exchange, ``M_j``
        the bytes of j's message (envelope and payload)."""
        mask = np.asarray(table.mask) & alive.cpu().numpy()[:, None]
        receivers = np.broadcast_to(np.arange(ctx.n)[:, None], mask.shape)[mask]
        senders = np.asarray(table.index)[mask]
        sizes = getattr(self, "message_bytes", None)
        size = ctx.model_bytes if sizes is None else sizes[senders]
        per_edge = ctx.links.transfer_time(senders, receivers, size)
        return np.bincount(senders, weights=per_edge, minlength=ctx.n)

    def models(self, ctx: Context) -> Tensor:
        """The honest peers' models: the parameters themselves when every peer is honest (no
        ``[n, d]`` copy), else a copy of the honest rows."""
        if not bool(ctx.byzantine.any()):
            return self.parameters
        return self.parameters[ctx.honest]


#: AD-PSGD pairs per call of the exchange rule (its passes over 2 x 16 rows of 100k
#: parameters stay in a CPU's cache; on a GPU the whole block is one call)
_PAIRS_PER_CALL = 16


def conflict_free_waves(peers: Sequence[int], partners: Sequence[int], n: int) -> list[list[int]]:
    """Events in time order, grouped into waves of disjoint pairs that run as one batch each.

    Event e (peer ``peers[e]`` exchanging with ``partners[e]``, −1 for none, nodes in
    ``0..n-1``) goes to the earliest wave after every earlier event that shares a node with
    it: ``wave(e) = 1 + max(wave of the last earlier event touching peers[e], ... touching
    partners[e])``. So no two events of a wave share a node, and events that share one run
    in their given order. An event reads and writes only its two nodes' rows (and the peer's
    optimizer state), so events on disjoint nodes commute: running the waves in order, each
    as one batch, gives exactly the result of running the events one by one in the given
    order. The number of waves is the longest chain of events that share nodes (about
    log n per round of n events on a ring or a random graph), not the number of conflicts.

    Returns the positions of the events of each wave, waves in order, positions ascending.

    >>> conflict_free_waves([0, 2, 1, 3], [1, 3, 2, -1], 4)
    [[0, 1], [2, 3]]
    """
    last = [-1] * n
    waves: list[list[int]] = []
    for position, (peer, partner) in enumerate(zip(peers, partners, strict=True)):
        wave = last[peer]
        if partner >= 0 and last[partner] > wave:
            wave = last[partner]
        wave += 1
        if wave == len(waves):
            waves.append([])
        waves[wave].append(position)
        last[peer] = wave
        if partner >= 0:
            last[partner] = wave
    return waves


def _earlier_turns(peers: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """For each event e, how many earlier events (positions < e) have ``peers == nodes[e]``:
    how many local steps node ``nodes[e]`` has made in this round before event e."""
    count = peers.shape[0]
    position = np.arange(count, dtype=np.int64)
    keys = np.sort(peers * count + position)
    node = np.where(nodes >= 0, nodes, 0)
    before = np.searchsorted(keys, node * count + position)
    return (before - np.searchsorted(keys, node * count)).astype(np.int64)


@dataclass
class AsynchronousGossip:
    """AD-PSGD (Lian et al., ICML 2018): each peer, at its own speed, takes a gradient at
    ``x_i``, averages ``x_i, x_j <- (x_i + x_j)/2`` with one random neighbour and applies the
    gradient, ``x_i <- x_i − η g_i``; a discrete-event simulation decides the order.

    The exchange is ``gossip.PairwiseGossip`` of ``algorithm`` (its consensus rule over two
    inputs and its codec), the same halves a peer runs: the caller sends ``C(x_i)``, the
    callee adopts ``aggregator(x_j, C(x_i))`` and answers it compressed, the caller adopts
    the answer. Each side of a pair is charged one message of the codec's real encoded size
    (``compressor.wire_bytes(d)``) in the envelope a peer sends it in
    (``gossip.compression.envelope``); the event timing transfers the payload's size.

    Cost: a round runs its n events as :func:`conflict_free_waves` (O(log n) waves on a ring
    or a random graph), a block of events per batched call; a call gathers only its peers'
    and partners' rows, takes the peers' gradients, runs the pairwise rule on them, steps the
    peers' own optimizers (:class:`sim.optimizers.RowOptimizer`) and writes the rows back:
    O(n·d) per round, no work over all n rows per wave. Memory: the parameters and the
    optimizer's per-row state, plus two block-sized buffers. The result is that of the events
    one by one in time order; each peer trains at local step s on the batch it draws at step
    s (a networked peer's stream), Adam counts each peer's own steps, and a randomized codec
    draws in the waves' order from one seeded generator (not a peer's own draws).

    Args:
        schedule: its round-0 neighbour table says who may pair with whom.
        name: the name in records.
        algorithm: the built AD-PSGD rule (``gossip.build_algorithm`` of an ``ad-psgd``
            config, or ``gossip.ad_psgd(aggregator=..., compressor=...)``); default plain
            averaging, uncompressed.
    """

    schedule: Schedule
    name: str = "ad-psgd"
    algorithm: GossipAlgorithm = field(default_factory=ad_psgd)

    def __post_init__(self) -> None:
        if not isinstance(self.algorithm, DecentralizedSGD):
            raise ValueError(
                "algorithm: AD-PSGD exchanges models pairwise; give gossip.ad_psgd(...) or "
                f"gossip.build_algorithm of an ad-psgd config, got {self.algorithm!r}"
            )
        phases = self.algorithm.plan.phases()
        if phases != ("gradient", "exchange", "step"):
            raise ValueError(
                f"algorithm: AD-PSGD takes a gradient, exchanges, then steps (combine-then-adapt, "
                f"1 local step); {self.algorithm!r} runs {phases}"
            )
        self.exchange = PairwiseGossip.of(self.algorithm)
        self.exchange.check_batchable()

    def setup(self, ctx: Context) -> None:
        if self.schedule.n != ctx.n:
            raise ValueError(
                f"schedule: has {self.schedule.n} nodes but the simulation has {ctx.n} peers"
            )
        if bool(ctx.byzantine.any()):
            raise ValueError("byzantine: asynchronous gossip runs without Byzantine peers")
        self.parameters = ctx.peers.params  # trained in place
        # each peer's own optimizer, stepping the rows of a wave only
        self.optimizer = ctx.optimizer.build_rows(self.parameters)
        self.generator = torch.Generator().manual_seed(ctx.seed + 7)
        self.message_bytes = self.exchange.message_bytes(ctx.peers.dim)
        table = self.schedule.neighbour_table(0)
        self.events = asynchronous_gossip_events(
            ctx.compute,
            ctx.links,
            np.asarray(table.index),
            np.asarray(table.mask),
            self.message_bytes,
            total_steps=2**62,
            failures=ctx.failures,
            seed=ctx.seed,
        )
        # events per batched call: a block of peers' gradients in flight, as in the
        # synchronous runner; the wave's rows and gradients live in two reused buffers
        self.block_rows = ctx.peers.default_block_rows()
        self.waves = 0
        d = self.parameters.shape[1]
        self._rows = self.parameters.new_empty((2 * self.block_rows, d))
        self._grads = self.parameters.new_empty((self.block_rows, d))

    def round(self, ctx: Context) -> RoundReport:
        """The next n events in time order (each: gradient at the peer's model, exchange with
        its partner, step), run as :func:`conflict_free_waves` in blocks of peers.

        Peer i's event at its local step s trains on the batch peer i draws at step s
        (:meth:`Context.batch_indices`), as a networked peer does. The round's simulated time
        runs to its last event; each side of an exchange is charged one envelope of the
        codec's payload, with the sender's step counter at that event."""
        events = list(itertools.islice(self.events, ctx.n))
        sent = np.zeros(ctx.n)
        if not events:  # every peer is down for good
            return RoundReport(0.0, sent)
        peers = np.array([e.peer for e in events], dtype=np.int64)
        partners = np.array([e.partner for e in events], dtype=np.int64)
        steps = np.array([e.step for e in events], dtype=np.int64)
        batches = ctx.batch_indices(peers, steps)
        losses = torch.empty(len(events), dtype=self.parameters.dtype, device=ctx.device)
        waves = conflict_free_waves(peers.tolist(), partners.tolist(), ctx.n)
        self.waves = len(waves)  # of the last round (the bench prints it)
        for wave in waves:
            for start in range(0, len(wave), self.block_rows):
                chunk = np.asarray(wave[start : start + self.block_rows], dtype=np.int64)
                losses[torch.from_numpy(chunk).to(ctx.device)] = self._apply(
                    ctx, peers[chunk], partners[chunk], batches[torch.from_numpy(chunk)]
                )
        self._charge(ctx, peers, partners, sent)
        np.add.at(ctx.step_count, peers, 1)
        return RoundReport(
            max(events[-1].time - ctx.time, 0.0),
            sent,
            steps=len(events),
            train_loss=float(losses.mean()),
        )

    def _apply(
        self, ctx: Context, peers: np.ndarray, partners: np.ndarray, batches: Tensor
    ) -> Tensor:
        """One batch of disjoint events: gather the rows of the peers and their partners,
        gradients at the peers' rows, the pairwise exchanges, the peers' optimizer steps,
        scatter the rows back. Returns the events' losses ``[m]`` in the given order."""
        paired = partners >= 0
        order = np.concatenate([np.flatnonzero(paired), np.flatnonzero(~paired)])
        callers = peers[order]
        callees = partners[order[: int(paired.sum())]]
        m, p = callers.shape[0], callees.shape[0]
        rows = torch.from_numpy(np.concatenate([callers, callees])).to(ctx.device)
        values = self._rows[: m + p]  # callers' rows first (paired ones, then the rest)
        torch.index_select(self.parameters, 0, rows, out=values)
        examples = batches[torch.from_numpy(order)].to(ctx.x_train.device)
        grads = self._grads[:m]
        losses, _ = ctx.peers.gradients(
            ctx.x_train[examples], ctx.y_train[examples], values[:m], block_rows=m, out=grads
        )
        # caller i's row is values[i], its callee's values[m + i]; on a CPU a few pairs per
        # call, so that the rule's passes over them stay in cache
        per_call = _PAIRS_PER_CALL if values.device.type == "cpu" else max(p, 1)
        for first in range(0, p, per_call):
            last = min(first + per_call, p)
            self.exchange.exchange_rows(
                values[first:last], values[m + first : m + last], self.generator
            )
        self.optimizer.step(rows[:m], values[:m], grads)
        with torch.no_grad():
            if values.device.type == "cpu":  # row by row beats index_copy_ for long rows
                for position, row in enumerate(np.concatenate([callers, callees]).tolist()):
                    self.parameters[row].copy_(values[position])
            else:  # one kernel
                self.parameters.index_copy_(0, rows, values)
        in_order = torch.empty_like(losses)
        in_order[torch.from_numpy(order).to(losses.device)] = losses
        return in_order

    def _charge(
        self, ctx: Context, peers: np.ndarray, partners: np.ndarray, sent: np.ndarray
    ) -> None:
        """Each side of each exchange sends one envelope (the caller's message, the callee's
        answer) whose header carries the sender's step counter at that event: its count at
        the round's start plus its steps earlier in the round (an AD-PSGD peer's round and
        step counters both count its exchanges so far)."""
        paired = partners >= 0
        if not bool(paired.any()):
            return
        callers, callees = peers[paired], partners[paired]
        caller_turn = _earlier_turns(peers, peers)[paired]
        callee_turn = _earlier_turns(peers, partners)[paired]
        turns = int(max(caller_turn.max(), callee_turn.max())) + 1
        bodies = np.stack(
            [
                launch_envelope_bytes(
                    self.message_bytes,
                    round=ctx.step_count + turn,
                    steps=ctx.step_count + turn,
                    codec=self.exchange.compressor.codec,
                )
                for turn in range(turns)
            ]
        )
        np.add.at(sent, callers, bodies[caller_turn, callers])
        np.add.at(sent, callees, bodies[callee_turn, callees])

    def models(self, ctx: Context) -> Tensor:
        return self.parameters
