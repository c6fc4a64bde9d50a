"""Experiments as a TOML file or a dataclass, validated at construction.

Every field is checked when the dataclass is built; an error names the field (``section.key``)
and the allowed values. :func:`load_experiment` reads TOML (``tomllib``), rejects unknown
keys, and :func:`build` turns a config into the algorithm, the simulation context and the
evaluation, using ``workloads`` (data, partition, model), ``topologies`` (graph, mixing
weights, schedule), ``gossip`` (algorithms, compressors) and ``consensus`` (rules, attacks).
Every input path in the file (the ``[graph]`` file, a ``FILE.py:FACTORY`` model or data set,
``.npz`` data, data and cache folders) is relative to the file's own folder (``base_dir``,
:mod:`sim.paths`); ``[output]`` paths are relative to the working directory. A ``[graph]``
file is read and checked against ``workload.peers`` when the experiment is made; the labels of a ``label-sets``
partition are checked against the data set's classes when the run is built.

A complete file (every key optional except where noted)::

    name = "ring-dpsgd"
    seed = 0
    rounds = 100
    eval_every = 10
    device = "cpu"                 # "auto" (the GPU if there is one), "cuda", "cuda:1"

    [groups]                       # named groups of peers (ids and ranges), used below
    clique1 = [0, 1, 2, 3, 4]      # a list of ids and ranges: [0, "2-4"]
    clique2 = "5-9"                # or one string: "5-9", "0-2+7"

    [workload]
    dataset = "mnist1d"            # workloads spec, e.g. "synthetic:num_samples=2000"
    partition = "iid"              # "contiguous", "dirichlet:alpha=0.1", "shards:shards_per_peer=2",
                                   # "label-sets" (with label_sets), "label-sets:sets=0-4|5-9"
    label_sets = {clique1 = "0-4", clique2 = "5-9"}   # group or peer id -> its classes
    model = "mlp"                  # "mlp:hidden=64", "cnn1d", "logistic", "mlp-100k",
                                   # "mymodel.py:Net" (relative to this file)
    peers = 16
    batch_size = 32
    init = "same"                  # or "independent"
    cache_dir = "~/.cache/gossipnet"  # generated data sets (default: $GOSSIPNET_CACHE or this)

    [optimizer]                    # workloads.optimizers.LocalOptimizer; a key the optimizer
                                   # or schedule does not read is an error
    name = "sgd"                   # or "adam", "adamw"
    lr = 0.1
    momentum = 0.0                 # sgd
    nesterov = false               # sgd
    betas = [0.9, 0.999]           # adam, adamw
    eps = 1e-8                     # adam, adamw
    weight_decay = 0.0             # adamw: decoupled
    schedule = "constant"          # or "cosine", "step" (after warmup_steps of linear warm-up)
    warmup_steps = 0
    min_lr = 0.0                   # cosine
    decay_steps = 1000             # cosine (default: the run's steps less the warm-up)
    gamma = 0.1                    # step: lr x gamma every step_size steps
    step_size = 100                # step
    clip_norm = 1.0                # each peer's gradient clipped to this L2 norm

    [algorithm]
    name = "dpsgd"                 # see ALGORITHMS
    topology = "ring"              # topologies.build name (gossip algorithms); "graph": [graph]
    topology_params = {}           # e.g. {degree = 4, seed = 1}
    weights = "metropolis"         # mixing weights (default: metropolis, uniform if directed);
                                   # "max-degree", "lazy-metropolis" ((I + W_metropolis) / 2)
    schedule = "static"            # "one-peer-exponential", "random-matching", "random-k-out"
    order = "combine-then-adapt"   # the algorithm settings: docs/settings.md
    local_steps = 1
    aggregator = "mean"            # consensus rule spec
    compressor = "none"            # gossip compressor spec
    consensus_step = 0.5           # choco (noloco: its pull gamma)
    outer_optimizer = "sgd:lr=0.7,momentum=0.9,nesterov=true"  # diloco, noloco, sparseloco;
                                   # allreduce with it: DiLoCo over an exact all-reduce
    error_feedback = 0.95          # sparseloco

    [network]
    latency = 1e-4                 # seconds per message (alpha); or one value per peer [..]
    bandwidth = 1.25e9             # bytes per second (10 Gb/s); or one value per peer [..]
    links = [{source = 0, target = 1, latency = 1e-2, bandwidth = 1e7}]   # per-link overrides
    server_bandwidth = 1.25e9
    step_time = 0.01               # seconds per local step
    compute_distribution = "constant"
    compute_spread = 0.0
    stragglers = {3 = 10.0}        # peer -> k times slower (TOML keys as strings: {"3" = 10.0});
                                   # a key may be a range of peers, as in [groups]: {"0-5" = 4.0}
    message_loss = 0.0
    crashes = [{peer = 2, at = 1.0, rejoin = 2.0}]
    stack_latency = 0.0            # the software stack's seconds per message, added to latency
    stack_bandwidth = 3e8          # its bytes per second, in series with bandwidth (default:
                                   # none); both measured by `gossipnet sim calibrate`
    host_cores = 2                 # all peers on one host of that many cores (a local swarm):
                                   # the CPU terms (step_time, the stack's) stretch by
                                   # peers / host_cores when larger than 1 (default: none,
                                   # each peer its own machine); docs/time-model.md

    [graph]                        # a user graph, run by topology = "graph"
    file = "ring.edges"            # edge list, one "u v" per line, relative to this file
    edges = [[0, 1], [1, 2]]       # or inline pairs (exactly one of file and edges)
    directed = false               # true: "u v" means u sends to v
    nodes = 16                     # optional; must equal workload.peers

    [byzantine]
    count = 0                      # that many peers drawn at random (seeded), or choose them:
    peers = [5, "10-14"]           # ... by id and range
    groups = ["clique2"]           # ... and/or by group (the union; not with count)
    attack = "sign-flip"           # consensus attack spec

    [privacy]                      # DP-SGD per peer (docs/privacy.md); needs gossipnet[privacy]
    noise = 1.0                    # sigma, the noise multiplier; or leave it out and give:
    epsilon = 8.0                  # target epsilon: picks sigma for the run; with noise: a budget
    clip = 1.0                     # C, the per-sample gradient norm bound (required)
    delta = 1e-5
    sampling = "poisson"           # or "fixed" (the run's batches; Poisson analysis then loose)
    accountant = "rdp"             # or "prv"

    [audit]                        # privacy audits after the last round (docs/privacy.md)
    membership = true              # loss-threshold membership inference, per honest peer
    members = 100                  # members (and non-members) per peer; default: smallest shard
    reconstruction = true          # input recovered from a one-step delta of a batch of one

    [output]
    jsonl = "run.jsonl"
    csv = "run.csv"
    plot = "run.png"
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from gossip.configuration import (
    ALGORITHM_FIELDS,
    GOSSIP_ALGORITHMS,
    ConfigurationError,
    GossipConfig,
)
from gossip.outer import check_outer_optimizer
from gossip.settings import SETTING_NAMES, setting_fields
from sim.algorithms import (
    OptimizerConfig,
)
from sim.audit import AuditConfig
from sim.groups import members_of, parse_groups, peer_label_sets
from sim.network import COMPUTE_DISTRIBUTIONS, Crash
from sim.paths import resolve_experiment_paths
from topologies.edgelist import graph_from_edges, read_edge_list
from topologies.errors import TopologyError
from topologies.spec_grammar import SpecError, parse_spec
from workloads.device import DEVICE_CHOICES, DEVICE_PATTERN
from workloads.partition import label_sets_from_spec, parse_id_set
from workloads.privacy import PrivacyConfig

TOPOLOGY_FIELDS = ("topology", "topology_params", "weights")
"""The ``[algorithm]`` keys that say who talks to whom (gossip algorithms only)."""
USER_GRAPH = "graph"
"""``algorithm.topology`` that runs the experiment's ``[graph]`` table (a user's graph)."""
BASELINES: dict[str, str] = {
    "centralized": "one model on all data, the peers' combined batch (accuracy ceiling)",
    "allreduce": "synchronous SGD, exact gradient average by ring all-reduce; with "
    "outer_optimizer: DiLoCo (H local steps, exact mean pseudo-gradient, outer step)",
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
        raise _fail(name, f"got {value!r}; allowed: {', '.join(choices)}")
    return str(value)


def _spec(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(name, f"must be a non-empty spec string like 'name:key=value', got {value!r}")
    return value


LABEL_SETS = "label-sets"
"""The partition whose label sets ``workload.label_sets`` gives by group or peer."""


def _partition_name(spec: str) -> tuple[str, dict[str, str]]:
    """(name, parameters) of a partition spec string (:func:`topologies.spec_grammar.parse_spec`)."""
    try:
        return parse_spec(spec, "partition")
    except SpecError as error:
        raise _fail("workload.partition", str(error)) from None


@dataclass(frozen=True)
class WorkloadConfig:
    """The ``[workload]`` table: data set, partition, model, peers, batch size.

    ``label_sets`` (with ``partition = "label-sets"``) gives each group of ``[groups]``, or
    each peer id, the classes it holds: ``{clique1 = "0-4", clique2 = "5-9"}``
    (``workloads.partition.label_sets``; every peer must be covered once).
    """

    dataset: str = "mnist1d"
    partition: str = "iid"
    model: str = "mlp"
    peers: int = 16
    batch_size: int = 32
    init: str = "same"
    cache_dir: str | None = None
    label_sets: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            _spec("workload.cache_dir", self.cache_dir)
        _spec("workload.dataset", self.dataset)
        _spec("workload.partition", self.partition)
        _spec("workload.model", self.model)
        _int("workload.peers", self.peers, 1)
        _int("workload.batch_size", self.batch_size, 1)
        _choice("workload.init", self.init, INITS)
        name, params = _partition_name(self.partition)
        if self.label_sets is not None:
            if not isinstance(self.label_sets, Mapping) or not self.label_sets:
                raise _fail(
                    "workload.label_sets",
                    "must be a non-empty table of group name (or peer id) = labels, e.g. "
                    '{clique1 = "0-4", clique2 = "5-9"}',
                )
            if name != LABEL_SETS or params:
                raise _fail(
                    "workload.label_sets",
                    f'is read by partition = "{LABEL_SETS}" (no parameters); '
                    f"workload.partition is {self.partition!r}",
                )
            object.__setattr__(self, "label_sets", dict(self.label_sets))
        elif name == LABEL_SETS and not params:
            raise _fail(
                "workload.partition",
                f'"{LABEL_SETS}" needs the label sets: a workload.label_sets table '
                '({clique1 = "0-4", clique2 = "5-9"}) or the spec form '
                '"label-sets:sets=0-4|5-9"',
            )


BASELINE_FIELDS: dict[str, tuple[str, ...]] = {
    "centralized": (),
    "allreduce": ("local_steps", "outer_optimizer"),
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
    "outer_optimizer": None,
}


@dataclass(frozen=True)
@setting_fields
class AlgorithmConfig:
    """The ``[algorithm]`` table: the algorithm's name and the settings it reads.

    A key left out (``None``) takes the algorithm's default; a key the algorithm does not read
    is an error that names it. The gossip settings (every name of
    ``gossip.settings.SETTINGS``, docs/settings.md) are fields too and are validated by
    ``gossip.GossipConfig``, the same check a networked peer runs (:attr:`gossip`); fedavg
    reads ``local_steps`` as its local steps per round. ``topology`` is one
    ``topologies.build_schedule`` spec, a graph (``ring``, ``random-regular:degree=4``) or a
    time-varying schedule (``one-peer-exponential``, ``random-k-out:k=2``), default ``ring``.
    """

    name: str = "dpsgd"
    topology: str | None = None
    topology_params: Mapping[str, Any] | None = None
    weights: str | None = None
    shards: int | None = None
    alpha: float | None = None
    period: int | None = None
    fraction: float | None = None

    if TYPE_CHECKING:

        def __init__(
            self,
            name: str = "dpsgd",
            topology: str | None = None,
            topology_params: Mapping[str, Any] | None = None,
            weights: str | None = None,
            shards: int | None = None,
            alpha: float | None = None,
            period: int | None = None,
            fraction: float | None = None,
            **settings: Any,
        ) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        _choice("algorithm.name", self.name, tuple(ALGORITHMS))
        reads = self.reads()
        # gossip settings are judged by gossip.GossipConfig, as on a peer
        judged = ("name", *SETTING_NAMES) if self.name in GOSSIP_ALGORITHMS else ("name",)
        for item in fields(self):
            given = item.name not in judged and getattr(self, item.name) is not None
            if given and item.name not in reads:
                raise _fail(
                    f"algorithm.{item.name}",
                    f"is not used by {self.name}, remove it; allowed: "
                    f"{', '.join(reads) or 'no other key'}",
                )
        if self.name in GOSSIP_ALGORITHMS:
            try:
                object.__setattr__(self, "_gossip", GossipConfig(**self._gossip_fields()))
            except ConfigurationError as error:
                raise _fail(
                    f"algorithm.{error.field}", error.reason_with(lambda key: f"algorithm.{key}")
                ) from None
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
        if self.outer_optimizer is not None:
            try:
                check_outer_optimizer(self.outer_optimizer)
            except ValueError as error:
                raise _fail("algorithm.outer_optimizer", str(error)) from None
        elif self.name == "allreduce" and self.local_steps not in (None, 1):
            raise _fail(
                "algorithm.local_steps",
                "allreduce averages gradients every step; with local steps it needs "
                "algorithm.outer_optimizer (DiLoCo: 'sgd:lr=0.7,momentum=0.9,nesterov=true'; "
                "plain periodic averaging: 'sgd:lr=1')",
            )

    def reads(self) -> tuple[str, ...]:
        """The keys this algorithm reads (besides ``name``)."""
        if self.name in GOSSIP_ALGORITHMS:
            return TOPOLOGY_FIELDS + ALGORITHM_FIELDS[self.name]
        return BASELINE_FIELDS[self.name]

    def _gossip_fields(self) -> dict[str, Any]:
        return {"algorithm": self.name, **{key: getattr(self, key) for key in SETTING_NAMES}}

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
    stack_latency: float = 0.0
    stack_bandwidth: float | None = None
    host_cores: int | None = None

    def __post_init__(self) -> None:
        _float("network.stack_latency", self.stack_latency, 0.0)
        if self.host_cores is not None:
            _int("network.host_cores", self.host_cores, 1)
        if self.stack_bandwidth is not None:
            _float("network.stack_bandwidth", self.stack_bandwidth, 0.0, open_low=True)
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
            try:  # a peer, or peers in the id-set grammar of [groups]: "0-5", "1, 3-4"
                indices = (int(peer),) if isinstance(peer, int) else parse_id_set(str(peer), "")
            except (TypeError, ValueError):
                raise _fail(
                    "network.stragglers",
                    f"keys must be peer numbers or ranges ('3', '0-5', '1, 3-4'), got {peer!r}",
                ) from None
            slower = _float(f"network.stragglers[{peer}]", factor, 0.0, open_low=True)
            for index in indices:
                if index in stragglers:
                    raise _fail("network.stragglers", f"peer {index} is given twice; give it once")
                stragglers[index] = slower
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
    """The ``[byzantine]`` table: which peers are Byzantine and what they send.

    Either ``count`` peers drawn at random (seeded by the experiment's seed), or chosen
    ones: ``peers`` (ids and ranges, ``[5, "10-14"]``) and/or ``groups`` (names of
    ``[groups]``), their union. Giving ``count`` and a choice is an error.
    """

    count: int = 0
    attack: str = "sign-flip"
    peers: tuple[int, ...] | None = None
    groups: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _int("byzantine.count", self.count, 0)
        _spec("byzantine.attack", self.attack)
        if self.peers is not None:
            try:
                object.__setattr__(self, "peers", parse_id_set(self.peers, "byzantine.peers"))
            except ValueError as error:
                raise ConfigError(str(error)) from None
        if self.groups is not None:
            if isinstance(self.groups, str) or not isinstance(self.groups, Sequence):
                raise _fail(
                    "byzantine.groups", f"must be a list of group names, got {self.groups!r}"
                )
            if not self.groups:
                raise _fail("byzantine.groups", "is empty; name at least one group of [groups]")
            object.__setattr__(self, "groups", tuple(self.groups))
        if self.count and (self.peers is not None or self.groups is not None):
            raise _fail(
                "byzantine.count",
                "give either count (that many peers drawn at random) or byzantine.peers / "
                "byzantine.groups (the peers chosen), not both",
            )

    @property
    def chosen(self) -> bool:
        """Whether the Byzantine peers are chosen (``peers``/``groups``), not drawn."""
        return self.peers is not None or self.groups is not None


@dataclass(frozen=True)
class GraphConfig:
    """The ``[graph]`` table: a user's graph, run with ``algorithm.topology = "graph"``.

    Exactly one of ``file`` (an edge-list file, one ``u v`` pair per line, ``#`` comments;
    a relative path is read from the experiment file's folder) or ``edges`` (inline pairs,
    ``[[0, 1], [1, 2]]``). ``directed``: an edge ``u v`` means "u sends to v" (default: an
    undirected edge). ``nodes``, when given, must equal ``workload.peers``. Node ids are
    ``0 .. peers-1``; self-loops, repeated edges and a graph that is not connected (strongly
    connected when directed) are refused (``topologies.edgelist.graph_from_edges``).
    """

    file: str | None = None
    edges: tuple[tuple[int, int], ...] | None = None
    nodes: int | None = None
    directed: bool = False

    def __post_init__(self) -> None:
        if (self.file is None) == (self.edges is None):
            raise _fail(
                "graph",
                "give exactly one of graph.file (an edge-list file) or graph.edges "
                "(inline pairs [[0, 1], [1, 2], ...])",
            )
        if not isinstance(self.directed, bool):
            raise _fail("graph.directed", f"must be true or false, got {self.directed!r}")
        if self.nodes is not None:
            _int("graph.nodes", self.nodes, 2)
        try:
            if self.file is not None:
                _spec("graph.file", self.file)
                array = read_edge_list(self.file)
            else:
                if isinstance(self.edges, str) or not isinstance(self.edges, Sequence):
                    raise _fail(
                        "graph.edges", f"must be a list of pairs [[0, 1], ...], got {self.edges!r}"
                    )
                array = _edge_pairs(self.edges)
        except TopologyError as error:
            raise _fail(f"graph.{self.source}", error.message) from None
        if self.edges is not None:
            object.__setattr__(self, "edges", tuple(map(tuple, array.tolist())))
        # a file's edges are kept aside, so that the fields still say where they came from
        # (dataclasses.replace and asdict give a table that builds the same graph again)
        array.setflags(write=False)
        object.__setattr__(self, "_edges", array)

    @property
    def source(self) -> str:
        """The key the edges came from: ``file`` or ``edges`` (for error messages)."""
        return "file" if self.file is not None else "edges"

    def edge_array(self) -> np.ndarray:
        """The edges (inline, or read from the file) as a read-only ``[m, 2]`` int64 array."""
        return cast(np.ndarray, self.__dict__["_edges"])


def _edge_pairs(edges: Sequence[Any]) -> np.ndarray:
    """Inline edges as an ``[m, 2]`` array, checked pair by pair (TopologyError)."""
    rows = []
    for position, pair in enumerate(edges):
        ok = isinstance(pair, list | tuple) and len(pair) == 2
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pair)
        if not ok:
            raise TopologyError(
                "edges",
                f"edge {position} must be a pair of non-negative node ids [u, v], got {pair!r}",
            )
        rows.append(pair)
    if not rows:
        raise TopologyError("edges", "the graph has no edges")
    return np.asarray(rows, dtype=np.int64)


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
    graph: GraphConfig | None = None
    groups: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    privacy: PrivacyConfig | None = None
    audit: AuditConfig | None = None

    def __post_init__(self) -> None:
        _int("seed", self.seed, 0)
        _int("rounds", self.rounds, 0)
        _int("eval_every", self.eval_every, 1)
        if not isinstance(self.device, str) or DEVICE_PATTERN.fullmatch(self.device) is None:
            allowed = DEVICE_CHOICES.replace(" or ", ", ")
            raise _fail("device", f"got {self.device!r}; allowed: {allowed}")
        if not isinstance(self.optimizer, OptimizerConfig):  # its own keys: checked when made
            raise _fail("optimizer", f"must be an OptimizerConfig, got {self.optimizer!r}")
        n = self.workload.peers
        try:
            object.__setattr__(self, "groups", parse_groups(self.groups, n))
        except ValueError as error:
            raise ConfigError(str(error)) from None
        self._check_byzantine()
        self._check_privacy()
        self._check_label_sets()
        self._check_graph()
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

    def _check_byzantine(self) -> None:
        n, byzantine = self.workload.peers, self.byzantine
        chosen: tuple[int, ...] = ()
        if byzantine.chosen:
            members: set[int] = set()
            if byzantine.peers is not None:
                outside = [peer for peer in byzantine.peers if peer >= n]
                if outside:
                    raise _fail(
                        "byzantine.peers",
                        f"peer {outside[0]} is outside 0..{n - 1} (workload.peers)",
                    )
                members.update(byzantine.peers)
            if byzantine.groups is not None:
                try:
                    members.update(members_of(byzantine.groups, self.groups, "byzantine.groups"))
                except ValueError as error:
                    raise ConfigError(str(error)) from None
            chosen = tuple(sorted(members))
        object.__setattr__(self, "_byzantine_peers", chosen)
        field_name = "byzantine.peers" if byzantine.chosen else "byzantine.count"
        count = len(chosen) if byzantine.chosen else byzantine.count
        if count >= n:
            raise _fail(
                field_name,
                f"must be < workload.peers = {n} (at least one honest peer), got {count}",
            )
        if count and self.algorithm.name not in (set(GOSSIP_ALGORITHMS) - {"ad-psgd"}):
            raise _fail(
                field_name,
                "Byzantine peers are simulated for synchronous gossip algorithms "
                f"(dpsgd, local-sgd, push-sum, choco), not {self.algorithm.name!r}",
            )

    def _check_privacy(self) -> None:
        if self.privacy is None:
            return
        runs = sorted(set(GOSSIP_ALGORITHMS) - {"ad-psgd"})
        if self.algorithm.name not in runs:
            raise _fail(
                "privacy",
                f"DP-SGD runs in the synchronous gossip algorithms ({', '.join(runs)}), not "
                f"{self.algorithm.name!r}; remove [privacy]",
            )
        if self.privacy.pair is not None:
            self._check_pair(self.privacy.pair)

    def _check_pair(self, pair: tuple[int, int]) -> None:
        """``[privacy] pair``: nodes of the run, and a run whose update is linear in the
        noisy steps (what :mod:`workloads.network_privacy` models)."""
        peers = self.workload.peers
        if max(pair) >= peers:
            raise _fail("privacy.pair", f"nodes are 0..{peers - 1}; got {list(pair)}")
        gossip = self.algorithm.gossip
        linear = (
            self.algorithm.name == "dpsgd"
            and gossip.aggregator == "mean"
            and gossip.compressor == "none"
        )
        if not linear:
            raise _fail(
                "privacy.pair",
                "the pairwise account models D-PSGD with the mean and no compressor "
                "(algorithm dpsgd); remove pair",
            )
        b = self.byzantine
        if self.network.message_loss or self.network.crashes or b.count or b.chosen:
            raise _fail(
                "privacy.pair",
                "the pairwise account assumes every message arrives from an honest peer "
                "(no message_loss, crashes or Byzantine peers); remove pair",
            )
        o = self.optimizer
        if o.name != "sgd" or o.schedule != "constant" or o.weight_decay or o.clip_norm:
            raise _fail(
                "privacy.pair",
                "the pairwise account models SGD (momentum allowed) with a constant learning "
                "rate, no weight decay and no clip_norm; remove pair",
            )

    def _check_label_sets(self) -> None:
        workload = self.workload
        labels: list[tuple[int, ...]] | None = None
        try:
            if workload.label_sets is not None:
                labels = peer_label_sets(workload.label_sets, self.groups, workload.peers)
            else:
                name, params = _partition_name(workload.partition)
                if name == LABEL_SETS and "sets" in params:
                    labels = label_sets_from_spec(params["sets"], workload.peers)
        except ValueError as error:
            message = str(error)
            raise (
                ConfigError(message)
                if message.startswith("workload.")
                else _fail("workload.partition", message)
            ) from None
        object.__setattr__(self, "_peer_labels", labels)

    def _check_graph(self) -> None:
        topology, graph, n = self.algorithm.topology, self.graph, self.workload.peers
        if graph is None:
            if topology == USER_GRAPH:
                raise _fail(
                    "algorithm.topology",
                    f'"{USER_GRAPH}" runs the [graph] table, which this experiment lacks: '
                    "add [graph] with file = ... or edges = [...]",
                )
            return
        if self.algorithm.name not in GOSSIP_ALGORITHMS:
            raise _fail(
                "graph",
                f"a user graph is run by gossip algorithms ({', '.join(GOSSIP_ALGORITHMS)}), "
                f"not {self.algorithm.name!r}; remove [graph]",
            )
        if topology not in (None, USER_GRAPH):
            raise _fail(
                "algorithm.topology",
                f'the experiment has a [graph]: write topology = "{USER_GRAPH}" (or leave it '
                f"out), or remove [graph] to run {topology!r}",
            )
        if self.algorithm.topology_params is not None:
            raise _fail(
                "algorithm.topology_params",
                "a [graph] takes no builder parameters; remove topology_params",
            )
        if graph.nodes is not None and graph.nodes != n:
            raise _fail("graph.nodes", f"must equal workload.peers = {n}, got {graph.nodes}")
        try:
            graph_from_edges(n, graph.edge_array(), directed=graph.directed)
        except TopologyError as error:
            where = f" ({graph.file})" if graph.file is not None else ""
            raise _fail(f"graph.{graph.source}", f"{error.message}{where}") from None

    @property
    def topology(self) -> str:
        """The topology that runs: ``algorithm.topology``, ``"graph"`` for a [graph],
        ``"ring"`` by default (gossip algorithms)."""
        if self.algorithm.topology is not None:
            return self.algorithm.topology
        return USER_GRAPH if self.graph is not None else "ring"

    def byzantine_peers(self) -> tuple[int, ...] | None:
        """The chosen Byzantine peers (``byzantine.peers`` and ``byzantine.groups``, their
        union, ascending); ``None`` when ``byzantine.count`` draws them at random."""
        if not self.byzantine.chosen:
            return None
        return cast(tuple[int, ...], self.__dict__["_byzantine_peers"])

    def peer_labels(self) -> list[tuple[int, ...]] | None:
        """Each peer's label set under the ``label-sets`` partition (by ``workload.label_sets``
        or the spec's ``sets=``); ``None`` for every other partition."""
        labels = self.__dict__["_peer_labels"]
        return None if labels is None else list(labels)

    def with_algorithm(self, name: str) -> ExperimentConfig:
        """The same experiment run by another algorithm (``sim compare``). A baseline runs
        without the [graph], which only gossip algorithms read."""
        graph = self.graph if name in GOSSIP_ALGORITHMS else None
        return dataclasses.replace(
            self, name=name, algorithm=self.algorithm.for_algorithm(name), graph=graph
        )


_SECTIONS: dict[str, type] = {
    "workload": WorkloadConfig,
    "optimizer": OptimizerConfig,
    "algorithm": AlgorithmConfig,
    "network": NetworkConfig,
    "byzantine": ByzantineConfig,
    "output": OutputConfig,
    "graph": GraphConfig,
    "privacy": PrivacyConfig,
    "audit": AuditConfig,
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
            f"unknown key{' in [' + where.rstrip('.') + ']' if where else ''}; allowed: "
            + ", ".join(allowed),
        )
    return dict(table)


NAMED_RUNS = "compare"
"""The top-level table of named runs ``sim compare`` runs side by side (:func:`named_runs`)."""


def named_runs(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The file's ``[compare]`` table: ``{label: {section: table or key: value}}``, checked
    (empty when the file has none). Each named run replaces the file's tables it gives,
    whole (an ``algorithm`` table says everything that run's algorithm reads), and the
    top-level values it gives (``rounds``, ``eval_every``)::

        [compare."data parallel"]
        algorithm = { name = "allreduce" }
        [compare.NoLoCo]
        algorithm = { name = "noloco", topology = "random-matching", local_steps = 20 }
    """
    runs = data.get(NAMED_RUNS, {})
    if not isinstance(runs, Mapping):
        raise _fail(NAMED_RUNS, f"must be a table of named runs [compare.NAME]; got {runs!r}")
    checked: dict[str, dict[str, Any]] = {}
    for label, tables in runs.items():
        where = f"{NAMED_RUNS}.{label}"
        if not isinstance(tables, Mapping) or not tables:
            raise _fail(where, "must be a table of the sections it replaces, e.g. algorithm")
        scalars = [f.name for f in fields(ExperimentConfig) if f.name not in _SECTIONS]
        for section, table in tables.items():
            if section in _SECTIONS and isinstance(table, Mapping):
                continue
            if section in scalars and not isinstance(table, Mapping):
                continue
            raise _fail(
                f"{where}.{section}",
                "a named run replaces whole sections or top-level values; allowed: "
                + ", ".join([*(f"[{name}]" for name in _SECTIONS), *scalars]),
            )
        checked[str(label)] = {
            key: dict(value) if isinstance(value, Mapping) else value
            for key, value in tables.items()
        }
    return checked


def _same(value: Any, default: Any) -> bool:
    """Whether a table's value is the field's default (a TOML or JSON list for a tuple)."""
    if isinstance(value, list):
        value = tuple(value)
    return bool(value == default) and type(value) is type(default)


def experiment_from_dict(
    data: Mapping[str, Any], *, base_dir: str | Path | None = None
) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from nested tables (TOML, JSON).

    ``base_dir``: where relative paths in the tables are resolved from (the ``[graph]``
    file, a ``FILE.py:FACTORY`` model or data set, ``.npz`` data, data folders and the
    cache folder: :mod:`sim.paths`); :func:`load_experiment` passes the experiment file's
    folder (default: the working directory).
    """
    named_runs(data)  # checked here; ``sim compare`` runs them (``sim run``: the file as it is)
    top = _known("", {k: v for k, v in data.items() if k != NAMED_RUNS}, ExperimentConfig)
    top = resolve_experiment_paths(top, Path(".") if base_dir is None else Path(base_dir))
    for section, cls in _SECTIONS.items():
        if section in ("privacy", "audit") and top.get(section, {}) is None:
            continue  # no DP-SGD, no audit, as ``dataclasses.asdict`` writes them
        if section in top:
            table = top[section]
            if not isinstance(table, Mapping):
                raise _fail(section, f"must be a table [{section}], got {table!r}")
            values = _known(f"{section}.", table, cls)
            if section == "network":
                for key in ("crashes", "links"):
                    if key in values:
                        values[key] = tuple(values[key])
            if section == "optimizer":  # a key the optimizer or schedule does not read: refused
                # unless it holds its default (a whole table, as ``dataclasses.asdict`` writes
                # it, reads back as the same optimizer)
                defaults = {f.name: f.default for f in dataclasses.fields(OptimizerConfig)}
                values = {
                    key: value
                    for key, value in values.items()
                    if not (
                        key in defaults
                        and _same(value, defaults[key])
                        and key not in ("name", "lr", "schedule")
                    )
                }
                try:
                    top[section] = OptimizerConfig.from_keys(values)
                except ValueError as error:
                    key, _, reason = str(error).partition(": ")
                    raise _fail(f"optimizer.{key}", reason) from None
                continue
            try:
                top[section] = cls(**values)
            except TypeError as error:
                raise _fail(section, str(error)) from None
            except ValueError as error:
                if isinstance(error, ConfigError):
                    raise
                if section in ("privacy", "audit"):  # "noise: ..." -> "privacy.noise: ..."
                    raise ConfigError(f"{section}.{error}") from None
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
