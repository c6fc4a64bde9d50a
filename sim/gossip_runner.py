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
Events are processed in time order, in waves of disjoint pairs (one vmap per wave).
"""

from __future__ import annotations

import dataclasses
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
from sim.algorithms import Context, RoundReport, _mean_loss
from sim.mixing import gather_mix, gather_rows, keeps_state, rows_for_budget
from sim.network import Event, asynchronous_gossip_events
from sim.optimizers import BlockedOptimizer, masked_step
from topologies.schedules import Schedule


@dataclass(frozen=True)
class _Hood:
    """One exchange's neighbour table as :func:`sim.engine.gather_mix` reads it."""

    index: Tensor
    weight: Tensor
    mask: Tensor
    self_weight: Tensor


def _row_tensors(state: Any, n: int) -> list[Tensor]:
    """The per-node tensors ``[n, ...]`` of an algorithm's state dataclass."""
    values = [getattr(state, f.name) for f in dataclasses.fields(state)]
    unique: dict[int, Tensor] = {}
    for value in values:
        if isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == n:
            unique.setdefault(id(value), value)
    return list(unique.values())


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
        if not bool(self._enough(full).all()):
            smallest = int(full.sum(dim=1).min()) + 1
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
        local_steps = 0
        exchanges = 0
        sent_bytes = np.zeros(ctx.n)
        phases = self.algorithm.plan.phases()
        for position, phase in enumerate(phases):
            if phase == "gradient":
                x, y = ctx.batch()
                if position + 1 < len(phases) and phases[position + 1] == "step":
                    losses = self.trainer.step(x, y, alive)  # the step phase is done here
                else:  # kept for a later step phase, in the trainer's reused buffer
                    losses, grads = ctx.peers.gradients(
                        x, y, self.parameters, out=self.trainer.grads
                    )
            elif phase == "step":
                if position > 0 and phases[position - 1] == "gradient":
                    local_steps += 1
                    continue
                if grads is None:
                    raise RuntimeError(f"plan {phases}: a step phase needs a gradient phase first")
                self.trainer.step_with(grads, alive)
                local_steps += 1
            else:  # the senders' step counters, as their envelopes carry them
                sent_bytes += self._exchange(ctx, table, alive, ctx.step_count + local_steps)
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

    def _exchange(self, ctx: Context, table: Any, alive: Tensor, steps: np.ndarray) -> np.ndarray:
        device = ctx.device
        index = torch.as_tensor(table.index, dtype=torch.long, device=device)
        listening = torch.as_tensor(table.mask, dtype=torch.bool, device=device)
        mask = listening & alive[index]
        delivered = ctx.failures.delivered(ctx.round, tuple(index.shape))
        mask &= torch.from_numpy(delivered).to(device)
        # a dead receiver, or one that heard from too few neighbours for the rule's bound,
        # keeps its state this exchange: mix it with the full table, then restore its rows
        frozen = ~alive | ~self._enough(mask)
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
            round=ctx.round,
            steps=steps,
            codec=self.algorithm.compressor.codec,
        )
        sent = compressed.values
        if self._streams(ctx, sent):
            # plain D-PSGD with a stateless rule: mix a cache-sized chunk of receivers at a
            # time into a reused buffer (no [n, k, d] gather), then restore frozen rows.
            # The same rule on the same rows as ``algorithm.combine``, so the same numbers.
            x = self.state.x
            assert isinstance(self.algorithm, DecentralizedSGD)  # checked by _streams
            if self._mixed is None or self._mixed.shape != x.shape:
                self._mixed = torch.empty_like(x)
            chunk = rows_for_budget(ctx.n, int(index.shape[1]), int(x.shape[1]))
            hood = _Hood(index, weights, mask, self_weight)
            mixed = gather_mix(
                x, hood, self.algorithm.aggregator, sent=sent, chunk_rows=chunk, out=self._mixed
            )
            rows = frozen.nonzero().squeeze(1)
            with torch.no_grad():
                mixed[rows] = x[rows]
                if x is self.parameters and mixed is self._mixed:
                    self._mixed = self.trainer.swap(mixed)  # no [n, d] copy back
                else:
                    x.copy_(mixed)
            return self._sent_bytes(ctx, index, listening, alive, self.message_bytes)
        received = gather_rows(sent, index)
        if self.attack is not None and bool(ctx.byzantine.any()):
            received = byzantine_messages(
                self.attack, sent, received, index, weights, mask, ctx.byzantine
            )
        rows = frozen.nonzero().squeeze(1)
        # messages lost in transit to a live receiver are not gone: the transport retries and
        # they arrive at the next exchange, where the rule's ``late`` decides what they do
        lost = listening & alive[index] & ~mask & ~frozen.unsqueeze(1)
        if bool(lost.any()):
            late = torch.where(lost, weights, 0.0).unsqueeze(-1) * received
            self._late = late.sum(dim=1)
        saved = [(t, t[rows].clone()) for t in _row_tensors(self.state, ctx.n)]
        self.algorithm.combine(self.state, sent, received, weights, mask, self_weight)
        with torch.no_grad():
            for tensor, value in saved:
                tensor[rows] = value
        return self._sent_bytes(ctx, index, listening, alive, self.message_bytes)

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
        """Whether this exchange can mix chunk by chunk (:func:`sim.engine.gather_mix`): plain
        D-PSGD state, a stateless rule, no Byzantine messages, a message of the model's dtype."""
        return (
            type(self.algorithm) is DecentralizedSGD
            and not keeps_state(self.algorithm.aggregator)
            and (self.attack is None or not bool(ctx.byzantine.any()))
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
        return self.parameters[ctx.honest]


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
        self.optimizer = ctx.optimizer.build(self.parameters)
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
        self.pending: Event | None = None

    def round(self, ctx: Context) -> RoundReport:
        start = ctx.time
        time = start
        sent = np.zeros(ctx.n)
        done = 0
        losses_seen: list[Tensor] = []
        while done < ctx.n:
            wave: list[Event] = []
            busy: set[int] = set()
            while done + len(wave) < ctx.n:
                event = self.pending if self.pending is not None else next(self.events)
                self.pending = None
                if event.peer in busy or event.partner in busy:
                    self.pending = event
                    break
                wave.append(event)
                busy.update({event.peer, event.partner} - {-1})
            done += len(wave)
            losses_seen.append(self._apply(ctx, wave, sent))
            time = max(time, wave[-1].time)
        loss = float(torch.cat(losses_seen).mean()) if losses_seen else float("nan")
        return RoundReport(max(time - start, 0.0), sent, steps=done, train_loss=loss)

    def _apply(self, ctx: Context, wave: list[Event], sent: np.ndarray) -> Tensor:
        peers = torch.tensor([e.peer for e in wave], device=ctx.device)
        x, y = ctx.batch()
        losses, grads = ctx.peers.gradients(x[peers], y[peers], self.parameters[peers])
        pairs = torch.tensor(
            [[e.peer, e.partner] for e in wave if e.partner >= 0], device=ctx.device
        ).reshape(-1, 2)
        self.exchange.exchange(self.parameters, pairs, self.generator)
        full = torch.zeros_like(self.parameters)
        full[peers] = grads
        self.parameters.grad = full
        active = torch.zeros(ctx.n, dtype=torch.bool, device=ctx.device)
        active[peers] = True
        masked_step(self.optimizer, self.parameters, active)
        # what peer-i's envelope weighs now: an AD-PSGD peer's round and step counters both
        # count its exchanges so far (gradient, exchange, step), as its envelope carries them
        bodies = launch_envelope_bytes(
            self.message_bytes,
            round=ctx.step_count,
            steps=ctx.step_count,
            codec=self.exchange.compressor.codec,
        )
        for e in wave:
            if e.partner >= 0:
                sent[e.peer] += bodies[e.peer]  # the caller's envelope
                sent[e.partner] += bodies[e.partner]  # the callee's answer
        np.add.at(ctx.step_count, peers.cpu().numpy(), 1)
        return losses

    def models(self, ctx: Context) -> Tensor:
        return self.parameters
