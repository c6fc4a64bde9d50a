"""Build a simulated run from an :class:`~sim.config.ExperimentConfig`: data, model, network,
topology and algorithm, all seeded by the experiment's ``seed`` (torch's global generator
included: :func:`build` seeds it).

Everything that cannot work is refused here, before any data is generated or any round
runs: the gossip settings were checked by ``gossip.GossipConfig`` when the config was made,
and :func:`build` asks the same object whether its robust rule can run on the smallest
neighbourhood of an honest receiver (:func:`honest_neighbourhood`). Byzantine peers never
aggregate (what they send is the attack's), so their neighbourhoods do not count: in the
malicious ring of He, Karimireddy & Jaggi 2022 every Byzantine peer has one neighbour, yet
``trimmed-mean:b=2`` runs at every honest node, which has five.

Which peers are Byzantine (:func:`byzantine_mask`): the ones the file chooses
(``byzantine.peers``, ``byzantine.groups``) or ``byzantine.count`` drawn at random from the
seed. A ``[graph]`` runs as ``topologies.Static`` of its mixing matrix under
``algorithm.weights``; the per-group metrics (:mod:`sim.group_metrics`) come with the
evaluation whenever the file names groups.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import topologies
from gossip.configuration import ConfigurationError
from gossip.configuration import build_algorithm as build_gossip
from sim.algorithms import (
    EASGD,
    Algorithm,
    AsynchronousParameterServer,
    Centralized,
    Context,
    FedAvg,
    ParameterServer,
    RingAllReduce,
)
from sim.batched import BatchedPeers
from sim.config import USER_GRAPH, ConfigError, ExperimentConfig, WorkloadConfig
from sim.group_metrics import GroupMetrics
from sim.groups import group_classes
from sim.metrics import Evaluation
from sim.network import ComputeModel, Failures, Links
from topologies.edgelist import graph_from_edges
from workloads.cache import default_cache_dir
from workloads.device import resolve_device
from workloads.task import REGRESSION

__all__ = [
    "build",
    "build_algorithm",
    "build_schedule",
    "byzantine_mask",
    "honest_neighbourhood",
]


def _fail(field_name: str, message: str) -> ConfigError:
    return ConfigError(f"{field_name}: {message}")


def dataset_spec(workload: WorkloadConfig) -> str:
    """The workload's data set spec with a cache folder for data sets that take one (MNIST-1D
    is generated once per argument set, and every runner reads that one): ``cache_dir`` from
    the workload, else :func:`workloads.cache.default_cache_dir`; one written in the spec
    wins. ``gossipnet launch EXPERIMENT.toml`` hands the same spec to its peers."""
    from workloads import DATASETS

    name, _, rest = workload.dataset.partition(":")
    entry = DATASETS.get(name.strip())
    given = {item.partition("=")[0].strip() for item in rest.split(",") if item.strip()}
    if entry is None or "cache_dir" not in entry.params or "cache_dir" in given:
        return str(workload.dataset)
    folder = (
        Path(workload.cache_dir).expanduser()
        if workload.cache_dir is not None
        else default_cache_dir()
    )
    return f"{workload.dataset}{',' if rest else ':'}cache_dir={folder}"


def load_workload_dataset(workload: WorkloadConfig) -> Any:
    """``workloads.load_dataset`` of :func:`dataset_spec`."""
    from workloads import load_dataset

    return load_dataset(dataset_spec(workload))


def byzantine_mask(config: ExperimentConfig) -> np.ndarray:
    """``[n]`` bool, True for the Byzantine peers: the chosen ones (``byzantine.peers`` and
    ``byzantine.groups``), or ``byzantine.count`` peers drawn by a generator seeded with the
    experiment's ``seed`` (the same draw whatever the device)."""
    n = config.workload.peers
    mask = np.zeros(n, dtype=bool)
    chosen = config.byzantine_peers()
    if chosen is not None:
        mask[list(chosen)] = True
    elif config.byzantine.count:
        generator = torch.Generator().manual_seed(config.seed)
        draw = torch.randperm(n, generator=generator, device="cpu")[: config.byzantine.count]
        mask[draw.numpy()] = True
    return mask


def honest_neighbourhood(schedule: topologies.Schedule, honest: np.ndarray, t: int = 0) -> int:
    """min over honest receivers i of (1 + |in-neighbours of i in round t|): the fewest
    vectors an honest node aggregates, which is what a robust rule's size check must meet
    (``topologies.smallest_neighbourhood`` over the honest rows only)."""
    table = schedule.neighbour_table(t)
    degrees = table.degree[np.asarray(honest, dtype=bool)]
    if degrees.size == 0:
        raise ValueError("no honest peer: a neighbourhood check needs at least one")
    return 1 + int(degrees.min())


def _user_schedule(config: ExperimentConfig) -> topologies.Schedule:
    """``Static`` of the [graph]'s mixing matrix under ``algorithm.weights``; a directed graph
    under an algorithm other than push-sum must give row-stochastic weights."""
    graph_config, algorithm = config.graph, config.algorithm
    if graph_config is None:
        raise _fail("algorithm.topology", f'"{USER_GRAPH}" needs a [graph] table')
    graph = graph_from_edges(
        config.workload.peers, graph_config.edge_array(), directed=graph_config.directed
    )
    try:
        matrix = topologies.mixing_matrix(graph, weights=algorithm.weights)
    except topologies.TopologyError as error:
        raise _fail("algorithm.weights", error.message) from None
    if graph.is_directed() and algorithm.name != "push-sum":
        try:
            topologies.validate_mixing(matrix, row_stochastic=True)
        except topologies.MixingMatrixError as error:
            raise _fail(
                "graph.directed",
                f"{algorithm.name} averages with row-stochastic weights, and this directed "
                f"graph's uniform push weights are not ({error}); run push-sum, or give a "
                "graph whose nodes all have equal in- and out-degree",
            ) from None
    return topologies.Static(matrix)


def build_schedule(config: ExperimentConfig) -> topologies.Schedule:
    """The run's topology on ``workload.peers`` nodes: one ``topologies.build_schedule`` spec
    (``algorithm.topology``), or the [graph] (``topology = "graph"``), checked against the
    gossip settings' robust rule at the honest receivers."""
    algorithm, n = config.algorithm, config.workload.peers
    topology = config.topology
    if topology == USER_GRAPH:
        schedule = _user_schedule(config)
    else:
        try:
            schedule = topologies.build_schedule(
                topology,
                n,
                weights=algorithm.weights,
                params=algorithm.topology_params,
                seed=config.seed,
            )
        except (ValueError, TypeError) as error:
            weights = getattr(error, "parameter", None) == "weights"
            raise _fail(
                "algorithm.weights" if weights else "algorithm.topology", str(error)
            ) from None
    honest = ~byzantine_mask(config)
    where = f"topology {topology!r} on {n} peers"
    if not honest.all():
        where += f" ({int((~honest).sum())} Byzantine, whose neighbourhoods do not count)"
    try:
        algorithm.gossip.check_neighbourhood(honest_neighbourhood(schedule, honest), where=where)
    except ConfigurationError as error:
        raise _fail(f"algorithm.{error.field}", error.reason) from None
    caveat = algorithm.gossip.topology_caveat(topology)
    if caveat is not None:
        warnings.warn(caveat, UserWarning, stacklevel=2)
    return schedule


def optimizer_steps_per_round(config: ExperimentConfig) -> int:
    """How many times a round steps each local optimizer: the server's n pushes (the
    asynchronous parameter server), EASGD's ``period``, else ``local_steps`` (1 where the
    algorithm reads none); a cosine schedule without ``decay_steps`` decays over the run's."""
    a = config.algorithm
    if a.name == "async-parameter-server":
        return config.workload.peers
    if a.name == "easgd":
        return int(a.setting("period"))
    return int(a.setting("local_steps"))


def build_algorithm(config: ExperimentConfig) -> Algorithm:
    """The algorithm object the config names."""
    a = config.algorithm
    name = a.name
    if name == "centralized":
        return Centralized()
    if name == "allreduce":
        if a.outer_optimizer is not None:
            from gossip.outer import DiLoCo
            from sim.outer_allreduce import OuterAllReduce

            rule = DiLoCo(local_steps=a.setting("local_steps"), outer_optimizer=a.outer_optimizer)
            return OuterAllReduce(rule, config.workload.peers)
        return RingAllReduce()
    if name == "parameter-server":
        return ParameterServer(
            shards=a.setting("shards"), server_bandwidth=config.network.server_bandwidth
        )
    if name == "async-parameter-server":
        return AsynchronousParameterServer(server_bandwidth=config.network.server_bandwidth)
    if name == "easgd":
        return EASGD(alpha=a.setting("alpha"), period=a.setting("period"))
    if name == "fedavg":
        return FedAvg(local_steps=a.setting("local_steps"), fraction=a.setting("fraction"))

    import consensus
    from sim.gossip_runner import AsynchronousGossip, SynchronousGossip

    schedule = build_schedule(config)
    if name == "ad-psgd":
        return AsynchronousGossip(schedule, algorithm=build_gossip(a.gossip))
    attack = None
    if config.byzantine.count or config.byzantine.chosen:
        try:
            attack = consensus.build_attack(config.byzantine.attack)
        except ValueError as error:
            raise _fail("byzantine.attack", str(error)) from None
    secure = None
    if a.gossip.secure_sum:  # gossip.secure_sum; docs/privacy.md
        from gossip.secure_sum import SeededKeys

        if attack is not None:
            raise _fail(
                "algorithm.secure_sum",
                "cannot run with Byzantine peers: an attack needs the models",
            )
        secure = SeededKeys(config.seed, schedule.n)
    return SynchronousGossip(
        build_gossip(a.gossip), schedule, attack=attack, name=name, secure=secure
    )


def _privacy(config: ExperimentConfig, algorithm: Algorithm, parts: list[torch.Tensor]) -> Any:
    """The run's :class:`sim.privacy.SimPrivacy` (``[privacy]``), for its steps per peer:
    rounds times the gradients of a round."""
    from sim.privacy import SimPrivacy
    from workloads.accountant import OPACUS_MISSING

    assert config.privacy is not None
    plan = getattr(getattr(algorithm, "algorithm", None), "plan", None)
    per_round = 1 if plan is None else plan.phases().count("gradient")
    try:
        return SimPrivacy(
            config.privacy,
            parts,
            config.workload.batch_size,
            seed=config.seed,
            rounds=config.rounds,
            steps_per_round=per_round,
        )
    except ImportError:
        raise _fail("privacy", OPACUS_MISSING) from None
    except ValueError as error:
        raise ConfigError(f"privacy.{error}") from None


def _pair_privacy(config: ExperimentConfig, algorithm: Algorithm, noise: float) -> Any:
    """``[privacy] pair``'s account (:class:`sim.pair_privacy.PairPrivacy`), over the run's
    static mixing matrix (``sim.config`` checked the algorithm and the optimizer)."""
    from sim.pair_privacy import PairPrivacy
    from topologies.schedules import Static

    assert config.privacy is not None and config.privacy.pair is not None
    schedule = getattr(algorithm, "schedule", None)
    if not isinstance(schedule, Static):
        raise _fail("privacy.pair", "the pairwise account needs a static topology; remove pair")
    plan = algorithm.algorithm.plan  # type: ignore[attr-defined]
    return PairPrivacy(
        schedule.mixing(0).toarray(),
        config.privacy.pair,
        gossip_steps=plan.gossip_steps,
        local_steps=plan.local_steps,
        momentum=config.optimizer.momentum,
        nesterov=config.optimizer.nesterov,
        noise=noise,
        delta=config.privacy.delta,
    )


def host_share(peers: int, host_cores: int | None) -> float:
    """How much longer a peer's CPU work takes when ``peers`` share a host of ``host_cores``
    cores (``[network] host_cores``): ``max(1, peers / host_cores)``; 1 without a host.

    The time model's CPU terms (a local step's ``step_time``, the stack's per-message
    ``stack_latency`` and throughput ``stack_bandwidth``) are measured on one idle core
    (``gossipnet sim calibrate``); when n peers run on C < n cores at once (a local swarm,
    ``gossipnet launch``) each gets C/n of a core. The wire terms (``latency``,
    ``bandwidth``) take no CPU and are not stretched; a straggler's factor multiplies the
    stretched step (its emulated wait is K - 1 times its own measured compute)."""
    return 1.0 if host_cores is None else max(1.0, peers / host_cores)


def build(config: ExperimentConfig) -> tuple[Algorithm, Context, Evaluation]:
    """Data, partition, model, network and algorithm for one run (all seeded by ``seed``).

    Every part draws from a generator of its own, seeded from ``seed`` (dropout masks too:
    :class:`~sim.batched.BatchedPeers`); torch's global generator is seeded with ``seed`` as
    well, for whatever else a model draws (``AlphaDropout``, ``RReLU``, ``torch.rand`` in a
    user's ``forward``), so a run is the same in any process.
    """
    from workloads import StackedBatchSampler, build_model, partition
    from workloads.partition import label_sets

    torch.manual_seed(config.seed)

    w, net = config.workload, config.network
    try:
        device = resolve_device(config.device)
    except ValueError as error:
        raise _fail("device", str(error)) from None
    algorithm = build_algorithm(config)  # refuses what cannot work before any data is made
    try:
        data = load_workload_dataset(w)
    except (ValueError, ImportError) as error:
        raise _fail("workload.dataset", str(error)) from None
    if data.task == REGRESSION:  # records and figures are a classifier's or a language model's
        raise _fail(
            "workload.dataset",
            f"{w.dataset} is regression data; the simulator trains classification and "
            "language-model data, regression runs in gossipnet peer and launch",
        )
    peer_labels = config.peer_labels()
    try:
        if w.label_sets is not None and peer_labels is not None:
            parts = label_sets(data.y_train, w.peers, peer_labels, seed=config.seed)
        else:
            parts = partition(w.partition, data.y_train, w.peers, seed=config.seed)
    except ValueError as error:
        key = "workload.label_sets" if w.label_sets is not None else "workload.partition"
        raise _fail(key, str(error)) from None
    try:
        build_model(w.model, data.input_shape, data.num_classes, seed=config.seed)
    except ValueError as error:
        raise _fail("workload.model", str(error)) from None

    def factory() -> torch.nn.Module:
        return build_model(w.model, data.input_shape, data.num_classes, seed=config.seed)

    peers = BatchedPeers(factory, w.peers, init=w.init, seed=config.seed, device=device)
    share = host_share(w.peers, net.host_cores)
    data = data.to(device)
    byzantine = torch.from_numpy(byzantine_mask(config)).to(device)
    ctx = Context(
        peers=peers,
        sampler=StackedBatchSampler(parts, w.batch_size, seed=config.seed),
        x_train=data.x_train,
        y_train=data.y_train,
        optimizer=config.optimizer.for_run(config.rounds * optimizer_steps_per_round(config)),
        links=Links.uniform(
            w.peers,
            latency=net.latency,
            bandwidth=net.bandwidth,
            overrides={
                (link["source"], link["target"]): (link["latency"], link["bandwidth"])
                for link in net.links
            },
            stack_latency=net.stack_latency * share,
            stack_bandwidth=None if net.stack_bandwidth is None else net.stack_bandwidth / share,
        ),
        compute=ComputeModel(
            w.peers,
            step_time=net.step_time * share,
            distribution=net.compute_distribution,
            spread=net.compute_spread,
            stragglers=dict(net.stragglers),
            seed=config.seed,
        ),
        failures=Failures(
            w.peers, message_loss=net.message_loss, crashes=net.crashes, seed=config.seed
        ),
        byzantine=byzantine,
        seed=config.seed,
    )
    if config.privacy is not None:
        ctx.privacy = peers.privacy = _privacy(config, algorithm, parts)
        if config.privacy.pair is not None:
            ctx.privacy.pair = _pair_privacy(config, algorithm, ctx.privacy.noise_multiplier)
    groups = None
    if config.groups:
        groups = GroupMetrics(
            config.groups,
            classes=None if peer_labels is None else group_classes(config.groups, peer_labels),
            num_classes=data.num_classes,
            seed=config.seed,
        )
    evaluation = Evaluation(
        data.x_test, data.y_test, seed=config.seed, groups=groups, task=data.task
    )
    if config.audit is not None:
        from sim.audit import SimAudit

        try:
            ctx.audit = SimAudit(
                config.audit,
                parts,
                data.x_test,
                data.y_test,
                input_shape=data.input_shape,
                template=peers.template,
                seed=config.seed,
            )
        except ValueError as error:
            raise ConfigError(f"audit.{error}") from None
    return algorithm, ctx, evaluation
