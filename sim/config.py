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
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from gossip.configuration import (
    ALGORITHM_FIELDS,
    GOSSIP_ALGORITHMS,
    GOSSIP_SETTINGS,
    ConfigurationError,
    GossipConfig,
)
from sim.algorithms import (
    OptimizerConfig,
)
from sim.network import COMPUTE_DISTRIBUTIONS, Crash
from workloads.device import DEVICE_CHOICES, DEVICE_PATTERN

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TOPOLOGY_FIELDS = ("topology", "topology_params", "weights")
"""The ``[algorithm]`` keys that say who talks to whom (gossip algorithms only)."""
BASELINES: dict[str, str] = {
    "centralized": "one model on all data, the peers' combined batch (accuracy ceiling)",
    "allreduce": "synchronous SGD, exact gradient average by ring all-reduce",
    "parameter-server": "synchronous parameter server (shards)",
    "async-parameter-server": "asynchronous parameter server, stale gradients",
    "easgd": "elastic averaging SGD (alpha, period)",
    "fedavg": "federated averaging (local_steps, fraction)",
}
"""The baselines, which only the simulator runs (they need a server or all-reduce)."""
ALGORITHMS: dict[str, str] = {
    **BASELINES,
    **{
        name: f"{summary} ({', '.join(ALGORITHM_FIELDS[name] + TOPOLOGY_FIELDS[:1])})"
        for name, summary in GOSSIP_ALGORITHMS.items()
    },
}
"""Every algorithm name with what it is and the ``[algorithm]`` keys it reads."""
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


BASELINE_FIELDS: dict[str, tuple[str, ...]] = {
    "centralized": (),
    "allreduce": (),
    "parameter-server": ("shards",),
    "async-parameter-server": (),
    "easgd": ("alpha", "period"),
    "fedavg": ("local_steps", "fraction"),
}
"""The ``[algorithm]`` keys each baseline reads (gossip algorithms: ``gossip.ALGORITHM_FIELDS``
plus the topology keys)."""
_BASELINE_DEFAULTS: dict[str, Any] = {
    "shards": 1,
    "alpha": 0.05,
    "period": 1,
    "fraction": 1.0,
    "local_steps": 1,
}


@dataclass(frozen=True)
class AlgorithmConfig:
    """The ``[algorithm]`` table: the algorithm's name and the settings it reads.

    A key left out (``None``) takes the algorithm's default; a key the algorithm does not read
    is an error that names it. Gossip algorithms are validated by ``gossip.GossipConfig``, the
    same check a networked peer runs (:attr:`gossip`); ``topology`` is one
    ``topologies.build_schedule`` spec, a graph (``ring``, ``random-regular:degree=4``) or a
    time-varying schedule (``one-peer-exponential``, ``random-k-out:k=2``), default ``ring``.
    """

    name: str = "dpsgd"
    topology: str | None = None
    topology_params: Mapping[str, Any] | None = None
    weights: str | None = None
    order: str | None = None
    local_steps: int | None = None
    aggregator: str | None = None
    compressor: str | None = None
    consensus_step: float | None = None
    shards: int | None = None
    alpha: float | None = None
    period: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        _choice("algorithm.name", self.name, tuple(ALGORITHMS))
        reads = self.reads()
        # gossip settings are judged by gossip.GossipConfig, as on a peer
        judged = ("name", *GOSSIP_SETTINGS) if self.name in GOSSIP_ALGORITHMS else ("name",)
        for item in fields(self):
            given = item.name not in judged and getattr(self, item.name) is not None
            if given and item.name not in reads:
                raise _fail(
                    f"algorithm.{item.name}",
                    f"is not used by {self.name} (it reads "
                    f"{', '.join(reads) or 'no other key'}); remove it",
                )
        if self.name in GOSSIP_ALGORITHMS:
            try:
                object.__setattr__(self, "_gossip", GossipConfig(**self._gossip_fields()))
            except ConfigurationError as error:
                raise _fail(f"algorithm.{error.field}", error.reason) from None
            _spec("algorithm.topology", self.topology or "ring")
            if self.topology_params is not None and not isinstance(self.topology_params, Mapping):
                raise _fail("algorithm.topology_params", "must be a table of builder parameters")
            if self.weights is not None:
                _spec("algorithm.weights", self.weights)
            return
        if self.shards is not None:
            _int("algorithm.shards", self.shards, 1)
        if self.alpha is not None:
            _float("algorithm.alpha", self.alpha, 0.0, 1.0, open_low=True)
        if self.period is not None:
            _int("algorithm.period", self.period, 1)
        if self.fraction is not None:
            _float("algorithm.fraction", self.fraction, 0.0, 1.0, open_low=True)
        if self.local_steps is not None:
            _int("algorithm.local_steps", self.local_steps, 1)

    def reads(self) -> tuple[str, ...]:
        """The keys this algorithm reads (besides ``name``)."""
        if self.name in GOSSIP_ALGORITHMS:
            return TOPOLOGY_FIELDS + ALGORITHM_FIELDS[self.name]
        return BASELINE_FIELDS[self.name]

    def _gossip_fields(self) -> dict[str, Any]:
        return {
            "algorithm": self.name,
            "order": self.order,
            "local_steps": self.local_steps,
            "aggregator": self.aggregator,
            "compressor": self.compressor,
            "consensus_step": self.consensus_step,
        }

    @property
    def gossip(self) -> GossipConfig:
        """The validated gossip settings, defaults filled (gossip algorithms only)."""
        if self.name not in GOSSIP_ALGORITHMS:
            raise ValueError(f"{self.name} is not a gossip algorithm")
        return cast(GossipConfig, self.__dict__["_gossip"])

    def setting(self, key: str) -> Any:
        """A baseline's setting, its default where the file leaves it out."""
        value = getattr(self, key)
        return _BASELINE_DEFAULTS[key] if value is None else value

    def for_algorithm(self, name: str) -> AlgorithmConfig:
        """This table for another algorithm, keeping only the keys that one reads
        (``sim compare`` runs one experiment file under several algorithms)."""
        kept = AlgorithmConfig(name=name).reads()
        values = {key: getattr(self, key) for key in kept if getattr(self, key) is not None}
        return AlgorithmConfig(name=name, **values)


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
            set(GOSSIP_ALGORITHMS) - {"ad-psgd"}
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
        return dataclasses.replace(self, name=name, algorithm=self.algorithm.for_algorithm(name))


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
    if cls is AlgorithmConfig and "schedule" in unknown:
        raise _fail(
            "algorithm.schedule",
            "a time-varying schedule is a topology now: write it as algorithm.topology "
            '(for example topology = "one-peer-exponential")',
        )
    if unknown:
        raise _fail(
            f"{where}{unknown[0]}" if where else unknown[0],
            f"unknown key; allowed keys{' in [' + where.rstrip('.') + ']' if where else ''}: "
            + ", ".join(allowed),
        )
    return dict(table)


def experiment_from_dict(
    data: Mapping[str, Any], *, base_dir: str | Path | None = None
) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from nested tables (TOML, JSON).

    ``base_dir``: where relative file paths in the tables (a user graph's edge list, say)
    are resolved from; :func:`load_experiment` passes the experiment file's folder
    (default: the working directory).
    """
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
    return experiment_from_dict(load_experiment_data(path), base_dir=Path(path).parent)


def load_experiment_data(path: str | Path) -> dict[str, Any]:
    """The nested tables of an experiment TOML file, not yet validated (sweeps edit them)."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"experiment: no such file {str(file)!r}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"experiment: {file} is not valid TOML ({error})") from None
    return data
