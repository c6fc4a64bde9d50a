"""Build a simulated run from an :class:`~sim.config.ExperimentConfig`: data, model, network,
topology and algorithm, all seeded by the experiment's ``seed``.

Everything that cannot work is refused here, before any data is generated or any round
runs: the gossip settings were checked by ``gossip.GossipConfig`` when the config was made,
and :func:`build` asks the same object whether its robust rule can run on the topology's
smallest neighbourhood, exactly as a networked peer's launcher does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
from sim.config import ConfigError, ExperimentConfig, WorkloadConfig
from sim.metrics import Evaluation
from sim.network import ComputeModel, Failures, Links
from workloads.cache import default_cache_dir
from workloads.device import resolve_device

__all__ = ["build", "build_algorithm", "build_schedule"]


def _fail(field_name: str, message: str) -> ConfigError:
    return ConfigError(f"{field_name}: {message}")


def _load_dataset(workload: WorkloadConfig) -> Any:
    """``workloads.load_dataset`` with a cache folder for data sets that take one (MNIST-1D is
    generated once per argument set); a ``cache_dir`` written in the spec wins."""
    from workloads import DATASETS, load_dataset

    name, _, rest = workload.dataset.partition(":")
    entry = DATASETS.get(name.strip())
    given = {item.partition("=")[0].strip() for item in rest.split(",")}
    if entry is None or "cache_dir" not in entry.params or "cache_dir" in given:
        return load_dataset(workload.dataset)
    folder = (
        Path(workload.cache_dir).expanduser()
        if workload.cache_dir is not None
        else default_cache_dir()
    )
    return load_dataset(workload.dataset, cache_dir=str(folder))


def build_schedule(config: ExperimentConfig) -> topologies.Schedule:
    """The run's topology (``algorithm.topology``, one ``topologies.build_schedule`` spec) on
    ``workload.peers`` nodes, checked against the gossip settings' robust rule."""
    algorithm, n = config.algorithm, config.workload.peers
    try:
        schedule = topologies.build_schedule(
            algorithm.topology or "ring",
            n,
            weights=algorithm.weights,
            params=algorithm.topology_params,
            seed=config.seed,
        )
    except (ValueError, TypeError) as error:
        weights = getattr(error, "parameter", None) == "weights"
        raise _fail("algorithm.weights" if weights else "algorithm.topology", str(error)) from None
    try:
        algorithm.gossip.check_neighbourhood(
            topologies.smallest_neighbourhood(schedule),
            where=f"topology {algorithm.topology or 'ring'!r} on {n} peers",
        )
    except ConfigurationError as error:
        raise _fail(f"algorithm.{error.field}", error.reason) from None
    return schedule


def build_algorithm(config: ExperimentConfig) -> Algorithm:
    """The algorithm object the config names."""
    a = config.algorithm
    name = a.name
    if name == "centralized":
        return Centralized()
    if name == "allreduce":
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
    if config.byzantine.count:
        try:
            attack = consensus.build_attack(config.byzantine.attack)
        except ValueError as error:
            raise _fail("byzantine.attack", str(error)) from None
    return SynchronousGossip(build_gossip(a.gossip), schedule, attack=attack, name=name)


def build(config: ExperimentConfig) -> tuple[Algorithm, Context, Evaluation]:
    """Data, partition, model, network and algorithm for one run (all seeded by ``seed``)."""
    from workloads import StackedBatchSampler, build_model, partition

    w, net = config.workload, config.network
    try:
        device = resolve_device(config.device)
    except ValueError as error:
        raise _fail("device", str(error)) from None
    algorithm = build_algorithm(config)  # refuses what cannot work before any data is made
    try:
        data = _load_dataset(w)
    except (ValueError, ImportError) as error:
        raise _fail("workload.dataset", str(error)) from None
    try:
        parts = partition(w.partition, data.y_train, w.peers, seed=config.seed)
    except ValueError as error:
        raise _fail("workload.partition", str(error)) from None
    try:
        build_model(w.model, data.input_shape, data.num_classes, seed=config.seed)
    except ValueError as error:
        raise _fail("workload.model", str(error)) from None

    def factory() -> torch.nn.Module:
        return build_model(w.model, data.input_shape, data.num_classes, seed=config.seed)

    peers = BatchedPeers(factory, w.peers, init=w.init, seed=config.seed, device=device)
    data = data.to(device)
    byzantine = torch.zeros(w.peers, dtype=torch.bool)
    if config.byzantine.count:
        generator = torch.Generator().manual_seed(config.seed)
        byzantine[torch.randperm(w.peers, generator=generator)[: config.byzantine.count]] = True
    byzantine = byzantine.to(device)
    ctx = Context(
        peers=peers,
        sampler=StackedBatchSampler(parts, w.batch_size, seed=config.seed),
        x_train=data.x_train,
        y_train=data.y_train,
        optimizer=config.optimizer,
        links=Links.uniform(
            w.peers,
            latency=net.latency,
            bandwidth=net.bandwidth,
            overrides={
                (link["source"], link["target"]): (link["latency"], link["bandwidth"])
                for link in net.links
            },
        ),
        compute=ComputeModel(
            w.peers,
            step_time=net.step_time,
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
    evaluation = Evaluation(data.x_test, data.y_test, seed=config.seed)
    return algorithm, ctx, evaluation
