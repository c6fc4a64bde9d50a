"""Experiments as a TOML file or a dataclass, validated at construction.

Every field is checked when the dataclass is built; an error names the field (``section.key``)
and the allowed values. :func:`load_experiment` reads TOML (``tomllib``), rejects unknown
keys, and :func:`build` turns a config into the algorithm, the simulation context and the
evaluation, using ``workloads`` (data, partition, model), ``topologies`` (graph, mixing
weights, schedule), ``gossip`` (algorithms, compressors) and ``consensus`` (rules, attacks).

A complete file (every key optional except where noted)::

    name = "ring-dpsgd"
    seed = 0
    rounds = 100
    eval_every = 10
    device = "cpu"                 # "auto" (the GPU if there is one), "cuda", "cuda:1"

    [workload]
    dataset = "mnist1d"            # workloads spec, e.g. "synthetic:num_samples=2000"
    partition = "iid"              # "dirichlet:alpha=0.1", "shards:shards_per_peer=2"
    model = "mlp"                  # "mlp:hidden=64", "cnn1d", "logistic", "mlp-100k"
    peers = 16
    batch_size = 32
    init = "same"                  # or "independent"
    cache_dir = "~/.cache/gossipnet"  # generated data sets (default: $GOSSIPNET_CACHE or this)

    [optimizer]
    name = "sgd"                   # or "adam"
    lr = 0.1
    momentum = 0.0
    weight_decay = 0.0
    nesterov = false

    [algorithm]
    name = "dpsgd"                 # see ALGORITHMS
    topology = "ring"              # topologies.build name (gossip algorithms)
    topology_params = {}           # e.g. {degree = 4, seed = 1}
    weights = "metropolis"         # mixing weights (default: metropolis, uniform if directed)
    schedule = "static"            # "one-peer-exponential", "random-matching", "random-k-out"
    order = "combine-then-adapt"
    local_steps = 1
    aggregator = "mean"            # consensus rule spec
    compressor = "none"            # gossip compressor spec

    [network]
    latency = 1e-4                 # seconds per message (alpha); or one value per peer [..]
    bandwidth = 1.25e9             # bytes per second (10 Gb/s); or one value per peer [..]
    links = [{source = 0, target = 1, latency = 1e-2, bandwidth = 1e7}]   # per-link overrides
    server_bandwidth = 1.25e9
    step_time = 0.01               # seconds per local step
    compute_distribution = "constant"
    compute_spread = 0.0
    stragglers = {3 = 10.0}        # peer -> k times slower (TOML keys as strings: {"3" = 10.0})
    message_loss = 0.0
    crashes = [{peer = 2, at = 1.0, rejoin = 2.0}]

    [byzantine]
    count = 0
    attack = "sign-flip"           # consensus attack spec

    [output]
    jsonl = "run.jsonl"
    csv = "run.csv"
    plot = "run.png"
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from sim.algorithms import (
    EASGD,
    Algorithm,
    AsynchronousParameterServer,
    Centralized,
    Context,
    FedAvg,
    OptimizerConfig,
    ParameterServer,
    RingAllReduce,
)
from sim.engine import BatchedPeers
from sim.metrics import Evaluation
from sim.network import COMPUTE_DISTRIBUTIONS, ComputeModel, Crash, Failures, Links
from workloads.device import DEVICE_CHOICES, DEVICE_PATTERN, resolve_device

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: algorithm name -> what it is (and the [algorithm] keys it reads)
ALGORITHMS: dict[str, str] = {
    "centralized": "one model on all data, the peers' combined batch (accuracy ceiling)",
    "allreduce": "synchronous SGD, exact gradient average by ring all-reduce",
    "parameter-server": "synchronous parameter server (shards)",
    "async-parameter-server": "asynchronous parameter server, stale gradients",
    "easgd": "elastic averaging SGD (alpha, period)",
    "fedavg": "federated averaging (local_steps, fraction)",
    "dpsgd": "D-PSGD (order, local_steps, aggregator, compressor, topology, schedule)",
    "local-sgd": "decentralized local SGD (local_steps, aggregator, compressor, topology)",
    "push-sum": "stochastic gradient push (order, local_steps, compressor, schedule)",
    "choco": "CHOCO-SGD (compressor, consensus_step, local_steps, topology)",
    "ad-psgd": "asynchronous pairwise gossip AD-PSGD (topology)",
}
GOSSIP_ALGORITHMS = ("dpsgd", "local-sgd", "push-sum", "choco", "ad-psgd")
SCHEDULES = ("static", "one-peer-exponential", "random-matching", "random-k-out")
ORDERS = ("combine-then-adapt", "adapt-then-combine")
OPTIMIZERS = ("sgd", "adam")
INITS = ("same", "independent")


class ConfigError(ValueError):
    """A bad experiment: the message names the field and the allowed values."""


def _fail(field_name: str, message: str) -> ConfigError:
    return ConfigError(f"{field_name}: {message}")


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(name, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _float(
    name: str, value: Any, low: float, high: float = math.inf, *, open_low: bool = False
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(name, f"must be a finite number, got {value!r}")
    if value < low or value > high or (open_low and value == low):
        bracket = "(" if open_low else "["
        raise _fail(name, f"must be in {bracket}{low:g}, {high:g}], got {value!r}")
    return float(value)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _fail(name, f"must be one of {', '.join(choices)}; got {value!r}")
    return str(value)


def default_cache_dir() -> Path:
    """Where generated data sets are kept: ``$GOSSIPNET_CACHE`` if set, else
    ``$XDG_CACHE_HOME/gossipnet`` (``~/.cache/gossipnet``)."""
    explicit = os.environ.get("GOSSIPNET_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "gossipnet"


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


def _spec(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(name, f"must be a non-empty spec string like 'name:key=value', got {value!r}")
    return value


@dataclass(frozen=True)
class WorkloadConfig:
    dataset: str = "mnist1d"
    partition: str = "iid"
    model: str = "mlp"
    peers: int = 16
    batch_size: int = 32
    init: str = "same"
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            _spec("workload.cache_dir", self.cache_dir)
        _spec("workload.dataset", self.dataset)
        _spec("workload.partition", self.partition)
        _spec("workload.model", self.model)
        _int("workload.peers", self.peers, 1)
        _int("workload.batch_size", self.batch_size, 1)
        _choice("workload.init", self.init, INITS)


@dataclass(frozen=True)
class AlgorithmConfig:
    name: str = "dpsgd"
    topology: str = "ring"
    topology_params: Mapping[str, Any] = field(default_factory=dict)
    weights: str | None = None
    schedule: str = "static"
    order: str = "combine-then-adapt"
    local_steps: int = 1
    aggregator: str = "mean"
    compressor: str = "none"
    consensus_step: float = 0.5
    shards: int = 1
    alpha: float = 0.05
    period: int = 1
    fraction: float = 1.0

    def __post_init__(self) -> None:
        _choice("algorithm.name", self.name, tuple(ALGORITHMS))
        _spec("algorithm.topology", self.topology)
        if not isinstance(self.topology_params, Mapping):
            raise _fail("algorithm.topology_params", "must be a table of builder parameters")
        if self.weights is not None:
            _spec("algorithm.weights", self.weights)
        _spec("algorithm.schedule", self.schedule)
        if self.schedule.partition(":")[0] not in SCHEDULES:
            raise _fail(
                "algorithm.schedule",
                f"must be one of {', '.join(SCHEDULES)}; got {self.schedule!r}",
            )
        _choice("algorithm.order", self.order, ORDERS)
        minimum_steps = 0 if self.name in ("dpsgd", "push-sum", "choco") else 1
        _int("algorithm.local_steps", self.local_steps, minimum_steps)
        _spec("algorithm.aggregator", self.aggregator)
        _spec("algorithm.compressor", self.compressor)
        _float("algorithm.consensus_step", self.consensus_step, 0.0, 1.0, open_low=True)
        _int("algorithm.shards", self.shards, 1)
        _float("algorithm.alpha", self.alpha, 0.0, 1.0, open_low=True)
        _int("algorithm.period", self.period, 1)
        _float("algorithm.fraction", self.fraction, 0.0, 1.0, open_low=True)


@dataclass(frozen=True)
class NetworkConfig:
    latency: float | tuple[float, ...] = 1e-4
    bandwidth: float | tuple[float, ...] = 1.25e9
    links: tuple[Mapping[str, Any], ...] = ()
    server_bandwidth: float | None = None
    step_time: float = 0.01
    compute_distribution: str = "constant"
    compute_spread: float = 0.0
    stragglers: Mapping[int, float] = field(default_factory=dict)
    message_loss: float = 0.0
    crashes: tuple[Crash, ...] = ()

    def __post_init__(self) -> None:
        for key, low_open in (("latency", False), ("bandwidth", True)):
            value = getattr(self, key)
            if isinstance(value, list | tuple):
                checked = tuple(
                    _float(f"network.{key}[{i}]", v, 0.0, open_low=low_open)
                    for i, v in enumerate(value)
                )
                object.__setattr__(self, key, checked)
            else:
                _float(f"network.{key}", value, 0.0, open_low=low_open)
        links = []
        for position, link in enumerate(self.links):
            where = f"network.links[{position}]"
            if not isinstance(link, Mapping) or set(link) != {
                "source",
                "target",
                "latency",
                "bandwidth",
            }:
                raise _fail(where, "needs exactly the keys source, target, latency, bandwidth")
            links.append(
                {
                    "source": _int(f"{where}.source", link["source"], 0),
                    "target": _int(f"{where}.target", link["target"], 0),
                    "latency": _float(f"{where}.latency", link["latency"], 0.0),
                    "bandwidth": _float(
                        f"{where}.bandwidth", link["bandwidth"], 0.0, open_low=True
                    ),
                }
            )
        object.__setattr__(self, "links", tuple(links))
        if self.server_bandwidth is not None:
            _float("network.server_bandwidth", self.server_bandwidth, 0.0, open_low=True)
        _float("network.step_time", self.step_time, 0.0, open_low=True)
        _choice("network.compute_distribution", self.compute_distribution, COMPUTE_DISTRIBUTIONS)
        _float("network.compute_spread", self.compute_spread, 0.0)
        stragglers: dict[int, float] = {}
        for peer, factor in dict(self.stragglers).items():
            try:
                index = int(peer)
            except (TypeError, ValueError):
                raise _fail(
                    "network.stragglers", f"keys must be peer numbers, got {peer!r}"
                ) from None
            stragglers[index] = _float(f"network.stragglers[{peer}]", factor, 0.0, open_low=True)
        object.__setattr__(self, "stragglers", stragglers)
        _float("network.message_loss", self.message_loss, 0.0, 0.999999)
        crashes = []
        for position, crash in enumerate(self.crashes):
            if isinstance(crash, Mapping):
                unknown = set(crash) - {"peer", "at", "rejoin"}
                if unknown or "peer" not in crash or "at" not in crash:
                    raise _fail(
                        f"network.crashes[{position}]",
                        "needs keys peer, at and optionally rejoin; got " + ", ".join(crash),
                    )
                crash = Crash(
                    _int(f"network.crashes[{position}].peer", crash["peer"], 0),
                    _float(f"network.crashes[{position}].at", crash["at"], 0.0),
                    None
                    if crash.get("rejoin") is None
                    else _float(f"network.crashes[{position}].rejoin", crash["rejoin"], 0.0),
                )
            if not isinstance(crash, Crash):
                raise _fail(f"network.crashes[{position}]", f"must be a table, got {crash!r}")
            crashes.append(crash)
        object.__setattr__(self, "crashes", tuple(crashes))


@dataclass(frozen=True)
class ByzantineConfig:
    count: int = 0
    attack: str = "sign-flip"

    def __post_init__(self) -> None:
        _int("byzantine.count", self.count, 0)
        _spec("byzantine.attack", self.attack)


@dataclass(frozen=True)
class OutputConfig:
    jsonl: str | None = None
    csv: str | None = None
    plot: str | None = None


@dataclass(frozen=True)
class ExperimentConfig:
    """One simulated experiment; see the module docstring for the TOML form."""

    name: str = "experiment"
    seed: int = 0
    rounds: int = 100
    eval_every: int = 10
    device: str = "cpu"
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    byzantine: ByzantineConfig = field(default_factory=ByzantineConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        _int("seed", self.seed, 0)
        _int("rounds", self.rounds, 0)
        _int("eval_every", self.eval_every, 1)
        if not isinstance(self.device, str) or DEVICE_PATTERN.fullmatch(self.device) is None:
            raise _fail("device", f"must be {DEVICE_CHOICES}; got {self.device!r}")
        _choice("optimizer.name", self.optimizer.name, OPTIMIZERS)
        _float("optimizer.lr", self.optimizer.lr, 0.0, open_low=True)
        _float("optimizer.momentum", self.optimizer.momentum, 0.0, 0.999999)
        _float("optimizer.weight_decay", self.optimizer.weight_decay, 0.0)
        if self.byzantine.count >= self.workload.peers:
            raise _fail(
                "byzantine.count",
                f"must be < workload.peers = {self.workload.peers}, got {self.byzantine.count}",
            )
        if self.byzantine.count and self.algorithm.name not in (
            "dpsgd",
            "local-sgd",
            "push-sum",
            "choco",
        ):
            raise _fail(
                "byzantine.count",
                "Byzantine peers are simulated for synchronous gossip algorithms "
                f"(dpsgd, local-sgd, push-sum, choco), not {self.algorithm.name!r}",
            )
        for key in ("latency", "bandwidth"):
            value = getattr(self.network, key)
            if isinstance(value, tuple) and len(value) != self.workload.peers:
                raise _fail(
                    f"network.{key}",
                    f"needs one value per peer ({self.workload.peers}), got {len(value)}",
                )
        for link in self.network.links:
            if max(link["source"], link["target"]) >= self.workload.peers:
                raise _fail(
                    "network.links",
                    f"link {link['source']} -> {link['target']} is outside peers "
                    f"0..{self.workload.peers - 1}",
                )
        for peer in self.network.stragglers:
            if not 0 <= peer < self.workload.peers:
                raise _fail(
                    "network.stragglers", f"peer {peer} is outside 0..{self.workload.peers - 1}"
                )
        for crash in self.network.crashes:
            if crash.peer >= self.workload.peers:
                raise _fail(
                    "network.crashes", f"peer {crash.peer} is outside 0..{self.workload.peers - 1}"
                )

    def with_algorithm(self, name: str) -> ExperimentConfig:
        """The same experiment run by another algorithm (``sim compare``)."""
        return dataclasses.replace(
            self, name=name, algorithm=dataclasses.replace(self.algorithm, name=name)
        )


_SECTIONS: dict[str, type] = {
    "workload": WorkloadConfig,
    "optimizer": OptimizerConfig,
    "algorithm": AlgorithmConfig,
    "network": NetworkConfig,
    "byzantine": ByzantineConfig,
    "output": OutputConfig,
}


def _known(where: str, table: Mapping[str, Any], cls: type) -> dict[str, Any]:
    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise _fail(
            f"{where}{unknown[0]}" if where else unknown[0],
            f"unknown key; allowed keys{' in [' + where.rstrip('.') + ']' if where else ''}: "
            + ", ".join(allowed),
        )
    return dict(table)


def experiment_from_dict(data: Mapping[str, Any]) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from nested tables (TOML, JSON)."""
    top = _known("", data, ExperimentConfig)
    for section, cls in _SECTIONS.items():
        if section in top:
            table = top[section]
            if not isinstance(table, Mapping):
                raise _fail(section, f"must be a table [{section}], got {table!r}")
            values = _known(f"{section}.", table, cls)
            if section == "network":
                for key in ("crashes", "links"):
                    if key in values:
                        values[key] = tuple(values[key])
            try:
                top[section] = cls(**values)
            except TypeError as error:
                raise _fail(section, str(error)) from None
            except ValueError as error:
                if isinstance(error, ConfigError):
                    raise
                raise _fail(section, str(error)) from None
    return ExperimentConfig(**top)


def load_experiment(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment TOML file."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"experiment: no such file {str(file)!r}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"experiment: {file} is not valid TOML ({error})") from None
    return experiment_from_dict(data)


def _schedule(config: ExperimentConfig) -> Any:
    import topologies

    algorithm, n, seed = config.algorithm, config.workload.peers, config.seed
    kind, _, rest = algorithm.schedule.partition(":")
    if kind == "one-peer-exponential":
        return topologies.OnePeerExponential(n)
    if kind == "random-matching":
        return topologies.RandomMatching(n, seed=seed)
    if kind == "random-k-out":
        k = int(rest.partition("=")[2] or 1) if rest else 1
        return topologies.RandomKOut(n, k, seed=seed)
    try:
        graph = topologies.build(algorithm.topology, n, **dict(algorithm.topology_params))
        matrix = topologies.mixing_matrix(graph, weights=algorithm.weights)
    except (ValueError, TypeError) as error:
        raise _fail("algorithm.topology", str(error)) from None
    return topologies.Static(matrix)


def build_algorithm(config: ExperimentConfig) -> Algorithm:
    """The algorithm object the config names."""
    a = config.algorithm
    name = a.name
    if name == "centralized":
        return Centralized()
    if name == "allreduce":
        return RingAllReduce()
    if name == "parameter-server":
        return ParameterServer(shards=a.shards, server_bandwidth=config.network.server_bandwidth)
    if name == "async-parameter-server":
        return AsynchronousParameterServer(server_bandwidth=config.network.server_bandwidth)
    if name == "easgd":
        return EASGD(alpha=a.alpha, period=a.period)
    if name == "fedavg":
        return FedAvg(local_steps=a.local_steps, fraction=a.fraction)

    import consensus
    from gossip.algorithms import Choco, DecentralizedSGD, PushSum, local_sgd
    from gossip.compression import build_compressor
    from sim.gossip_runner import AsynchronousGossip, SynchronousGossip

    schedule = _schedule(config)
    if name == "ad-psgd":
        return AsynchronousGossip(schedule)
    try:
        aggregator = consensus.build(a.aggregator)
    except ValueError as error:
        raise _fail("algorithm.aggregator", str(error)) from None
    try:
        compressor = build_compressor(a.compressor)
    except ValueError as error:
        raise _fail("algorithm.compressor", str(error)) from None
    attack = None
    if config.byzantine.count:
        try:
            attack = consensus.build_attack(config.byzantine.attack)
        except ValueError as error:
            raise _fail("byzantine.attack", str(error)) from None
    gossip: Any
    if name == "dpsgd":
        gossip = DecentralizedSGD(
            order=a.order,  # type: ignore[arg-type]
            local_steps=a.local_steps,
            aggregator=aggregator,
            compressor=compressor,
        )
    elif name == "local-sgd":
        gossip = local_sgd(a.local_steps, aggregator=aggregator, compressor=compressor)
    elif name == "push-sum":
        gossip = PushSum(order=a.order, local_steps=a.local_steps, compressor=compressor)  # type: ignore[arg-type]
    else:
        gossip = Choco(compressor, consensus_step=a.consensus_step, local_steps=a.local_steps)
    return SynchronousGossip(gossip, schedule, attack=attack, name=name)


def build(config: ExperimentConfig) -> tuple[Algorithm, Context, Evaluation]:
    """Data, partition, model, network and algorithm for one run (all seeded by ``seed``)."""
    from workloads import StackedBatchSampler, build_model, partition

    w, net = config.workload, config.network
    try:
        device = resolve_device(config.device)
    except ValueError as error:
        raise _fail("device", str(error)) from None
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
    return build_algorithm(config), ctx, evaluation
