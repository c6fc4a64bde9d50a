"""Training algorithms run by the simulator, each one round at a time over all peers at once.

The baselines live here (they have no peer-to-peer runner): centralized SGD, ring
all-reduce, parameter server (synchronous, optionally sharded, and asynchronous), EASGD and
FedAvg. Gossip algorithms come from ``gossip/`` and mix through a ``consensus`` rule, see
``sim.gossip_runner``. Every algorithm owns its state tensors and reports, per round, how much
simulated time passed and how many bytes each peer sent; :mod:`sim.runner` does the rest.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from torch import Tensor

from sim.batched import BatchedPeers
from sim.network import (
    ComputeModel,
    Failures,
    Links,
    parameter_server_time,
    ring_allreduce_time,
    synchronous_round_time,
)
from sim.optimizers import RowOptimizer, build_optimizer, masked_step
from workloads.batching import StackedBatchSampler
from workloads.optimizers import LocalOptimizer, attach_schedule

if TYPE_CHECKING:
    from sim.audit import SimAudit
    from sim.privacy import SimPrivacy

BYTES_PER_FLOAT32 = 4


@dataclass(frozen=True)
class OptimizerConfig(LocalOptimizer):
    """The ``[optimizer]`` table: the local optimizer every peer runs, with its schedule and
    clipping (:class:`workloads.optimizers.LocalOptimizer`: the keys, their checks, the
    learning rate at step t), built over all peers' stacked ``[n, d]`` parameters."""

    def build(self, params: Tensor, *, start: int = 0) -> torch.optim.Optimizer:
        """One torch optimizer over the stacked leaf ``params [n, d]`` (n per-peer ones:
        :func:`sim.optimizers.build_optimizer`), clipping each row's gradient and setting
        the learning rate of its ``t``-th step, counted from ``start``
        (:func:`workloads.optimizers.attach_schedule`). Like Adam's step count, ``t`` is
        the optimizer's: a crashed or busy peer's schedule advances with the others'."""
        optimizer = build_optimizer(
            params,
            self.name,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            nesterov=self.nesterov,
            betas=self.betas,
            eps=self.eps,
        )
        return attach_schedule(optimizer, self, rows=True, start=start)

    def build_rows(self, params: Tensor) -> RowOptimizer:
        """The same optimizer for each row of ``params [n, d]``, stepping chosen rows only
        (:class:`sim.optimizers.RowOptimizer`; Adam and the schedule count each row's own
        steps)."""
        return RowOptimizer(
            (int(params.shape[0]), int(params.shape[1])),
            self.name,
            lr=self.lr,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            nesterov=self.nesterov,
            betas=self.betas,
            eps=self.eps,
            dtype=params.dtype,
            device=params.device,
            schedule=self,
        )


@dataclass
class Context:
    """Everything an algorithm reads: the batched model, the data, the network and the clock."""

    peers: BatchedPeers
    sampler: StackedBatchSampler
    x_train: Tensor
    y_train: Tensor
    optimizer: OptimizerConfig
    links: Links
    compute: ComputeModel
    failures: Failures
    byzantine: Tensor  # [n] bool
    seed: int = 0
    time: float = 0.0
    round: int = 0
    batches_drawn: int = 0
    step_count: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    privacy: SimPrivacy | None = None
    """DP-SGD (an experiment's ``[privacy]``): it draws the batches (Poisson sampling) and
    :class:`~sim.batched.BatchedPeers` takes their private gradients."""
    audit: SimAudit | None = None
    """Privacy audits (an experiment's ``[audit]``, :mod:`sim.audit`), run on the models the
    last round leaves; :func:`sim.runner.run` puts their results in the last record."""

    def __post_init__(self) -> None:
        if self.step_count.shape != (self.n,):
            self.step_count = np.zeros(self.n, dtype=np.int64)

    @property
    def n(self) -> int:
        return self.peers.n

    @property
    def device(self) -> torch.device:
        """Where the peers' parameters live; every per-round tensor is made there."""
        return self.peers.params.device

    @property
    def honest(self) -> Tensor:
        return ~self.byzantine

    @property
    def model_bytes(self) -> int:
        """M, one full-precision model (or gradient) in bytes."""
        return self.peers.dim * BYTES_PER_FLOAT32

    def batch(self, rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Every peer's next minibatch from its own partition: ``x [n, B, ...]``, ``y [n, B]``;
        with ``rows [m]`` (sorted peer indices) only those peers' rows of it, ``[m, B, ...]``."""
        if self.privacy is not None:  # all peers at once (the config refuses the others)
            if rows is not None:
                raise ValueError("privacy: DP-SGD draws every peer's batch at once")
            self.batches_drawn += 1
            return self.privacy.batch(
                self.sampler, self.batches_drawn - 1, self.x_train, self.y_train
            )
        index = self.sampler.indices(self.batches_drawn)
        self.batches_drawn += 1
        if rows is not None:
            index = index[rows.cpu()]
        index = index.to(self.x_train.device)
        return self.x_train[index], self.y_train[index]

    def batch_indices(self, peers: np.ndarray, steps: np.ndarray) -> Tensor:
        """``[m, B]`` training-set indices (on the CPU) of the batch that peer ``peers[i]``
        draws at its own local step ``steps[i]``: row ``peers[i]`` of the sampler's step
        ``steps[i]``, the batch a networked peer takes for that step (asynchronous peers are
        at different steps). One sampler draw per distinct step."""
        peers = np.asarray(peers, dtype=np.int64)
        steps = np.asarray(steps, dtype=np.int64)
        index = torch.empty(
            (peers.shape[0], self.sampler.batch_size), dtype=torch.int64, device="cpu"
        )
        for step in np.unique(steps).tolist():
            where = np.flatnonzero(steps == step)
            drawn = self.sampler.indices(int(step))
            index[torch.from_numpy(where)] = drawn[torch.from_numpy(peers[where])]
        return index

    def alive(self) -> Tensor:
        return torch.from_numpy(self.failures.alive(self.time)).to(self.device)


@dataclass(frozen=True)
class RoundReport:
    """What one round cost: simulated seconds, bytes each peer sent, bytes the servers sent,
    local steps made and the mean training loss of the steps."""

    time: float
    bytes_sent: np.ndarray
    server_bytes: float = 0.0
    servers: int = 0
    steps: int = 0
    train_loss: float = float("nan")


class Algorithm(Protocol):
    """One training algorithm over all peers; ``models()`` are the honest peers' models."""

    name: str

    def setup(self, ctx: Context) -> None: ...

    def round(self, ctx: Context) -> RoundReport: ...

    def models(self, ctx: Context) -> Tensor: ...


def _mean_loss(losses: Tensor, rows: Tensor) -> float:
    return float(losses[rows].mean()) if bool(rows.any()) else float("nan")


def _server_round(
    ctx: Context, members: np.ndarray, compute: np.ndarray, steps: int, train_loss: float
) -> RoundReport:
    """Charge one exchange of ``members`` with a single (unsharded) server after ``steps``
    local steps each: their slowest compute, then the server's incast."""
    ctx.step_count[members] += steps
    communication = parameter_server_time(
        ctx.links,
        ctx.model_bytes,
        server_bandwidth=float(ctx.links.bandwidth.max()),
        workers=members,
    )
    sent = np.zeros(ctx.n)
    sent[members] = ctx.model_bytes
    return RoundReport(
        synchronous_round_time(compute[members], communication),
        sent,
        server_bytes=len(members) * ctx.model_bytes,
        servers=1,
        steps=len(members) * steps,
        train_loss=train_loss,
    )


class Centralized:
    """One model trained on all data with the peers' combined batch, ``x <- x − η ∇f(x; ∪_i B_i)``:
    the accuracy ceiling. Its clock charges the n peers' batches to one machine (n·t_step)."""

    name = "centralized"

    def setup(self, ctx: Context) -> None:
        self.model = ctx.peers.params[:1].clone()
        self.optimizer = ctx.optimizer.build(self.model)

    def round(self, ctx: Context) -> RoundReport:
        x, y = ctx.batch()
        x = x.reshape(1, -1, *x.shape[2:])
        y = y.reshape(1, -1)
        losses, self.model.grad = ctx.peers.gradients(x, y, self.model)
        self.optimizer.step()
        time = float(ctx.compute.sample(ctx.round).sum())
        return RoundReport(time, np.zeros(ctx.n), steps=1, train_loss=float(losses[0]))

    def models(self, ctx: Context) -> Tensor:
        return self.model


class _Synchronous:
    """Shared body of ring all-reduce and the synchronous parameter server: every live peer
    computes ``g_i`` at the common model, the model steps on ``(1/p) Σ_i g_i``."""

    name = "synchronous"

    def setup(self, ctx: Context) -> None:
        self.model = ctx.peers.params[:1].clone()
        self.optimizer = ctx.optimizer.build(self.model)

    def _gradient_step(self, ctx: Context) -> tuple[Tensor, float]:
        alive = ctx.alive()
        x, y = ctx.batch()
        losses, grads = ctx.peers.gradients(x, y, self.model.expand(ctx.n, -1))
        rows = alive.nonzero().squeeze(1)
        if rows.numel():
            self.model.grad = grads[rows].mean(dim=0, keepdim=True)
            self.optimizer.step()
        ctx.step_count[alive.cpu().numpy()] += 1
        return alive, _mean_loss(losses, alive)

    def models(self, ctx: Context) -> Tensor:
        return self.model


class RingAllReduce(_Synchronous):
    """Synchronous data-parallel SGD with an exact average of gradients each step (ring
    all-reduce, Patarasuk and Yuan 2009): ``x <- x − η (1/p) Σ_i ∇f_i(x)``."""

    name = "allreduce"

    def round(self, ctx: Context) -> RoundReport:
        alive, loss = self._gradient_step(ctx)
        members = alive.nonzero().squeeze(1).cpu().numpy()
        p = len(members)
        compute = ctx.compute.sample(ctx.round, members)
        time = synchronous_round_time(
            compute, ring_allreduce_time(ctx.links, ctx.model_bytes, members)
        )
        sent = np.zeros(ctx.n)
        if p > 1:
            sent[members] = 2 * (p - 1) / p * ctx.model_bytes
        return RoundReport(time, sent, steps=p, train_loss=loss)


@dataclass
class ParameterServer(_Synchronous):
    """Synchronous parameter server (Li et al., OSDI 2014), the model split over ``shards``
    servers: workers push ``g_i``, the servers step on ``(1/p) Σ_i g_i``, workers pull ``x``."""

    shards: int = 1
    server_bandwidth: float | None = None
    name: str = "parameter-server"

    def __post_init__(self) -> None:
        if not isinstance(self.shards, int) or self.shards < 1:
            raise ValueError(f"shards: must be an integer >= 1, got {self.shards!r}")

    def _server_bandwidth(self, ctx: Context) -> float:
        return self.server_bandwidth or float(ctx.links.bandwidth.max())

    def round(self, ctx: Context) -> RoundReport:
        alive, loss = self._gradient_step(ctx)
        members = alive.nonzero().squeeze(1).cpu().numpy()
        compute = ctx.compute.sample(ctx.round, members)
        communication = parameter_server_time(
            ctx.links,
            ctx.model_bytes,
            server_bandwidth=self._server_bandwidth(ctx),
            shards=self.shards,
            workers=members,
        )
        sent = np.zeros(ctx.n)
        sent[members] = ctx.model_bytes
        return RoundReport(
            synchronous_round_time(compute, communication),
            sent,
            server_bytes=len(members) * ctx.model_bytes,
            servers=self.shards,
            steps=len(members),
            train_loss=loss,
        )


@dataclass
class AsynchronousParameterServer:
    """Asynchronous parameter server (Dean et al., NeurIPS 2012, Downpour SGD): each worker
    loops *pull x -> compute g_i(x) -> push*, the server steps at once on every stale gradient,
    ``x <- x − η ∇f_i(x_{τ(i)})``. A discrete-event simulation orders the pushes by simulated
    time; one round is n pushes. Gradients of a round's distinct workers come from one vmap
    (each at the model that worker pulled), the server then applies them in time order."""

    server_bandwidth: float | None = None
    name: str = "async-parameter-server"

    def setup(self, ctx: Context) -> None:
        self.model = ctx.peers.params[:1].clone()
        self.optimizer = ctx.optimizer.build(self.model)
        self.pulled = ctx.peers.params.clone()  # the model each worker is computing on
        bandwidth = self.server_bandwidth or float(ctx.links.bandwidth.max())
        # a push and a pull each cost α + M/B over the worker's link, server link shared by p
        latency = ctx.links.latency
        worker = ctx.model_bytes / np.minimum(ctx.links.bandwidth, bandwidth)
        self.exchange = 2 * (latency + worker)
        self.local_step = np.zeros(ctx.n, dtype=np.int64)
        first = ctx.compute.sample(0)
        self.queue: list[tuple[float, int]] = sorted(
            (float(first[i] + self.exchange[i] / 2), i) for i in range(ctx.n)
        )
        heapq.heapify(self.queue)

    def round(self, ctx: Context) -> RoundReport:
        order: list[int] = []
        start = ctx.time
        time = start
        while len(order) < ctx.n and self.queue:
            time, worker = heapq.heappop(self.queue)
            if not ctx.failures.alive(time)[worker]:
                later = [
                    c.rejoin
                    for c in ctx.failures.crashes
                    if c.peer == worker and c.rejoin is not None and c.rejoin > time
                ]
                if later:
                    heapq.heappush(self.queue, (min(later), worker))
                continue
            order.append(worker)
            self.local_step[worker] += 1
            step = int(self.local_step[worker])
            next_time = (
                time + self.exchange[worker] + ctx.compute.sample(step, np.array([worker]))[0]
            )
            heapq.heappush(self.queue, (float(next_time), worker))
        sent = np.zeros(ctx.n)
        losses_seen: list[Tensor] = []
        # distinct workers of this wave: one vmap at each one's pulled (stale) model
        remaining = order
        while remaining:
            wave: list[int] = []
            rest: list[int] = []
            seen: set[int] = set()
            for w in remaining:
                (rest if w in seen else wave).append(w)
                seen.add(w)
            rows = torch.tensor(wave, device=ctx.device)
            x, y = ctx.batch()
            losses, grads = ctx.peers.gradients(x[rows], y[rows], self.pulled[rows])
            losses_seen.append(losses)
            for position, worker in enumerate(wave):
                self.model.grad = grads[position : position + 1]
                self.optimizer.step()
                self.pulled[worker] = self.model[0]
                sent[worker] += ctx.model_bytes
            remaining = rest
        np.add.at(ctx.step_count, np.asarray(order, dtype=np.int64), 1)
        loss = float(torch.cat(losses_seen).mean()) if losses_seen else float("nan")
        return RoundReport(
            max(time - start, 0.0),
            sent,
            server_bytes=float(sent.sum()),
            servers=1,
            steps=len(order),
            train_loss=loss,
        )

    def models(self, ctx: Context) -> Tensor:
        return self.model


@dataclass
class EASGD:
    """Elastic averaging SGD (Zhang, Choromanska and LeCun, NeurIPS 2015), synchronous:
    ``x_i <- x_i − η ∇f_i(x_i) − α (x_i − x̃)`` and ``x̃ <- x̃ + α Σ_i (x_i − x̃)``, the
    elastic exchange every ``period`` local steps with a centre variable on a server."""

    alpha: float = 0.05
    period: int = 1
    name: str = "easgd"

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha: elastic moving rate must be in (0, 1), got {self.alpha}")
        if not isinstance(self.period, int) or self.period < 1:
            raise ValueError(f"period: must be an integer >= 1, got {self.period!r}")

    def setup(self, ctx: Context) -> None:
        self.workers = ctx.peers.params.clone()
        self.optimizer = ctx.optimizer.build(self.workers)
        self.centre = ctx.peers.params[:1].clone()

    def round(self, ctx: Context) -> RoundReport:
        alive = ctx.alive()
        losses = torch.zeros(ctx.n, device=ctx.device)
        compute = np.zeros(ctx.n)
        for local in range(self.period):
            x, y = ctx.batch()
            losses, self.workers.grad = ctx.peers.gradients(x, y, self.workers)
            masked_step(self.optimizer, self.workers, alive)
            compute += ctx.compute.sample(ctx.round * self.period + local)
        members = alive.nonzero().squeeze(1)
        with torch.no_grad():
            difference = self.workers[members] - self.centre
            self.workers[members] -= self.alpha * difference
            self.centre += self.alpha * difference.sum(dim=0, keepdim=True)
        return _server_round(
            ctx, members.cpu().numpy(), compute, self.period, _mean_loss(losses, alive)
        )

    def models(self, ctx: Context) -> Tensor:
        return self.centre


@dataclass
class FedAvg:
    """Federated averaging (McMahan et al., AISTATS 2017): each round a seeded ``fraction`` of
    the clients start from the global model, run ``local_steps`` SGD steps on their own data,
    and the server sets ``x <- Σ_i (n_i / Σ n) x_i`` over those clients."""

    local_steps: int = 5
    fraction: float = 1.0
    name: str = "fedavg"

    def __post_init__(self) -> None:
        if not isinstance(self.local_steps, int) or self.local_steps < 1:
            raise ValueError(f"local_steps: must be an integer >= 1, got {self.local_steps!r}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction: clients per round must be in (0, 1], got {self.fraction}")

    def setup(self, ctx: Context) -> None:
        self.model = ctx.peers.params[:1].clone()
        self.sizes = ctx.sampler.sizes.to(self.model.device, self.model.dtype)

    def round(self, ctx: Context) -> RoundReport:
        """Only the round's m sampled live clients compute (O(m·d) per local step): each
        draws its own rows of the step's batch, as it would with all n clients computing."""
        alive = ctx.alive()
        count = max(1, round(self.fraction * ctx.n))
        generator = torch.Generator().manual_seed(ctx.seed * 1_000_003 + ctx.round)
        chosen = torch.zeros(ctx.n, dtype=torch.bool, device="cpu")
        chosen[torch.randperm(ctx.n, generator=generator, device="cpu")[:count]] = True
        chosen = chosen.to(ctx.device) & alive
        index = chosen.nonzero().squeeze(1)
        clients = self.model.expand(index.numel(), -1).clone()
        # fresh local optimizer state each round; the schedule goes on from the steps taken
        optimizer = ctx.optimizer.build(clients, start=ctx.round * self.local_steps)
        losses = torch.full((1,), float("nan"), device=ctx.device)
        compute = np.zeros(ctx.n)
        for local in range(self.local_steps):
            x, y = ctx.batch(index)  # the step's batch is drawn whoever computes
            if index.numel():
                losses, clients.grad = ctx.peers.gradients(x, y, clients)
                optimizer.step()
            compute += ctx.compute.sample(ctx.round * self.local_steps + local)
        if index.numel():
            weights = self.sizes[index] / self.sizes[index].sum()
            self.model = (weights.unsqueeze(1) * clients).sum(dim=0, keepdim=True)
        return _server_round(
            ctx, index.cpu().numpy(), compute, self.local_steps, float(losses.mean())
        )

    def models(self, ctx: Context) -> Tensor:
        return self.model
