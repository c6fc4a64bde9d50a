"""Parity harness: one small problem run by the simulator and by N real peers on loopback.

gossipnet's promise (docs/architecture.md, "One rule, two runners"): the simulator
(``sim.gossip_runner.SynchronousGossip`` over ``sim.batched.BatchedPeers``) and N networked
``peer.Peer`` objects hold the same parameters after R rounds, given the same mixing matrix
W, seed, data batches and initial model. This module builds both sides of that comparison:

* :class:`Problem` -- the shared problem: a ``workloads`` model and synthetic data set, n
  peers, a static ``topologies`` graph with its default mixing matrix, plain SGD.
* :func:`run_simulator` -- builds a simulator :class:`sim.algorithms.Context` directly
  (as ``sim.config.build`` does), records every batch the simulator draws
  (:class:`RecordingContext`) and runs R rounds of ``SynchronousGossip``.
* :func:`run_peers` -- starts n ``Peer`` objects in sync mode on 127.0.0.1 with the same
  topology over a peer list, gives peer i exactly the batches the simulator gave row i, in
  order, and runs them concurrently in this event loop.

Both return the ``[n, d]`` parameters before and after, row i = peer i.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

import consensus
import topologies
from gossip.algorithms import GossipAlgorithm
from gossip.compression import launch_peer_id
from peer.app.swarm import free_ports
from peer.node.config import PeerConfig
from peer.node.peer import Peer
from sim.algorithms import Context, OptimizerConfig
from sim.batched import BatchedPeers
from sim.gossip_runner import SynchronousGossip
from sim.network import ComputeModel, Failures, Links
from workloads import Dataset, StackedBatchSampler, build_model, load_dataset, partition

Batch = tuple[Tensor, Tensor]
SECRET = b"0" * 32
"""The swarm secret every parity peer signs with (>= 16 bytes)."""


@dataclass(frozen=True)
class Problem:
    """The small problem both runners solve.

    Args:
        n: number of peers.
        topology: a static ``topologies.build`` name (``ring``, ``exponential``, ...); its
            mixing matrix is ``topologies.mixing_matrix``'s default for the graph
            (Metropolis-Hastings when undirected, uniform when directed), which is also the
            peer's default (:class:`peer.node.topology.TopologyNeighbours`).
        model: a ``workloads.build_model`` spec.
        dataset: a ``workloads.load_dataset`` spec (synthetic: generated, no download).
        batch_size: samples per peer per local step.
        lr: the fixed learning rate (no momentum, no weight decay).
        seed: seeds the initial model, the partition and the batch stream.
        optimizer: the local (inner) optimizer, ``sgd`` or ``adamw`` (no weight decay).
    """

    n: int = 4
    topology: str = "ring"
    model: str = "mlp:hidden=8,depth=1"
    dataset: str = "synthetic:num_samples=80,num_features=6,num_classes=3,seed=0"
    batch_size: int = 4
    lr: float = 0.1
    seed: int = 0
    optimizer_name: str = "sgd"

    def data(self) -> Dataset:
        return load_dataset(self.dataset)

    def build_model(self) -> nn.Module:
        """The initial model, built from ``seed`` (the same weights at every call)."""
        data = self.data()
        return build_model(self.model, data.input_shape, data.num_classes, seed=self.seed)

    def schedule(self) -> topologies.Schedule:
        """The schedule a peer builds from the same spec (``PeerConfig.topology``)."""
        return topologies.build_schedule(self.topology, self.n, seed=self.seed)

    def optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """A peer's optimizer factory: the simulator's ``OptimizerConfig(name, lr=lr)`` for one
        node."""
        if self.optimizer_name == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, weight_decay=0.0)
        return torch.optim.SGD(params, lr=self.lr)


@dataclass
class RecordingContext(Context):
    """A simulator :class:`~sim.algorithms.Context` that keeps a copy of every batch it hands
    out: ``drawn[t] = (x [n, B, ...], y [n, B])`` for the t-th call of :meth:`batch`."""

    drawn: list[Batch] = field(default_factory=list)

    def batch(self) -> tuple[Tensor, Tensor]:
        x, y = super().batch()
        self.drawn.append((x.clone(), y.clone()))
        return x, y

    def peer_batches(self, row: int) -> list[Batch]:
        """Row ``row``'s batches in the order the simulator used them."""
        return [(x[row], y[row]) for x, y in self.drawn]


@dataclass(frozen=True)
class RunResult:
    """Parameters ``[n, d]`` (row i = peer i) before the first round and after the last;
    ``batches[i]`` is what peer i trained on, in order."""

    initial: Tensor
    final: Tensor
    batches: list[list[Batch]]


def simulator_context(problem: Problem, byzantine: Sequence[int] = ()) -> RecordingContext:
    """The simulator's pieces for ``problem``, assembled as ``sim.config.build`` does: data,
    IID partition, ``BatchedPeers(init="same")``, the batch sampler and an ideal network."""
    data = problem.data()
    parts = partition("iid", data.y_train, problem.n, seed=problem.seed)
    peers = BatchedPeers(problem.build_model, problem.n, init="same", seed=problem.seed)
    n = problem.n
    return RecordingContext(
        peers=peers,
        sampler=StackedBatchSampler(parts, problem.batch_size, seed=problem.seed),
        x_train=data.x_train,
        y_train=data.y_train,
        optimizer=OptimizerConfig(name=problem.optimizer_name, lr=problem.lr),
        links=Links.uniform(n),
        compute=ComputeModel(n, step_time=0.01),
        failures=Failures(n),
        byzantine=torch.isin(torch.arange(n), torch.tensor(list(byzantine), dtype=torch.long)),
        seed=problem.seed,
    )


def run_simulator(
    problem: Problem,
    algorithm: GossipAlgorithm,
    rounds: int,
    *,
    byzantine: Sequence[int] = (),
    attack: str | None = None,
) -> RunResult:
    """``rounds`` rounds of ``SynchronousGossip(algorithm, problem.schedule())``, with the
    peers ``byzantine`` sending ``attack`` (a ``consensus.build_attack`` spec)."""
    ctx = simulator_context(problem, byzantine)
    initial = ctx.peers.params.detach().clone()
    runner = SynchronousGossip(
        algorithm,
        problem.schedule(),
        attack=None if attack is None else consensus.build_attack(attack),
    )
    runner.setup(ctx)
    for _ in range(rounds):
        runner.round(ctx)
        ctx.round += 1
    final = ctx.peers.params.detach().clone()
    batches = [ctx.peer_batches(i) for i in range(problem.n)]
    return RunResult(initial, final, batches)


async def run_peers(
    problem: Problem,
    batches: Sequence[list[Batch]],
    steps: int,
    *,
    check_initial: Callable[[int, Tensor], None] | None = None,
    per_rank: Mapping[int, Mapping[str, Any]] | None = None,
    **config: Any,
) -> RunResult:
    """n sync-mode peers on 127.0.0.1 over ``problem.topology``, trained ``steps`` optimizer
    steps each on ``batches[i]`` (peer i, in order), all in this event loop.

    Args:
        problem: the shared problem (model, lr, topology, seed).
        batches: ``batches[i]``, the list of batches peer i trains on, in order.
        steps: optimizer steps per peer (``Peer.run(steps)``).
        check_initial: called as ``check_initial(rank, vector)`` with each peer's flat
            vector before any peer starts (e.g. to assert it equals the simulator's row).
        per_rank: more ``PeerConfig`` fields for single ranks (``{1: {"byzantine": ...}}``).
        config: more ``PeerConfig`` fields (``algorithm``, ``order``, ``local_steps``).
    """
    n = problem.n
    for rank, own in enumerate(batches):
        if len(own) != steps:
            raise ValueError(
                f"batches[{rank}]: must hold one batch per step ({steps}), got {len(own)}; "
                "a peer re-iterates its data, so a longer or shorter list would not replay "
                "the simulator's stream"
            )
    addresses = tuple(f"127.0.0.1:{port}" for port in free_ports(n))
    peers = []
    for rank, address in enumerate(addresses):
        settings = PeerConfig(
            peer_id=launch_peer_id(rank),  # the ids the simulator seeds node codecs by
            port=int(address.rsplit(":", 1)[1]),
            mode="sync",
            topology=problem.topology,
            peer_list=addresses,
            rank=rank,
            join=addresses[:1] if rank else (),  # rank 0 is up first; the others join it
            fetch_state=False,
            secret=SECRET,
            seed=problem.seed,
            round_deadline_s=10.0,
            request_timeout_s=10.0,
            **config,
            **(per_rank or {}).get(rank, {}),
        )
        peer = Peer(
            problem.build_model(),
            problem.optimizer,
            nn.functional.cross_entropy,
            list(batches[rank]),
            settings,
        )
        if check_initial is not None:
            check_initial(rank, peer.flat.vector.detach())
        peers.append(peer)
    initial = torch.stack([p.flat.vector.detach().clone() for p in peers])
    async with contextlib.AsyncExitStack() as stack:
        for peer in peers:
            await peer.start()
            stack.push_async_callback(peer.stop)
        for peer in peers:
            if not await peer.wait_for_members(n - 1, timeout_s=10):
                raise RuntimeError(f"{peer.peer_id} did not see the other {n - 1} peers in 10 s")
        await asyncio.gather(*(peer.run(steps) for peer in peers))
    final = torch.stack([p.flat.vector.detach().clone() for p in peers])
    return RunResult(initial, final, [list(b) for b in batches])


def max_abs_difference(a: Tensor, b: Tensor) -> float:
    """``max |a - b|`` over all entries (in float64)."""
    return float((a.double() - b.double()).abs().max())
