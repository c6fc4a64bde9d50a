"""``gossipnet launch EXPERIMENT.toml``: the real peers of an experiment file.

One file, two runners: the simulator runs an experiment file (``gossipnet sim run``), and
this runs the same file as ``workload.peers`` real ``gossipnet peer`` processes on this
machine (:mod:`peer.app.launch`), with the same seed, data set and partition, model and
initial model (every peer builds it from the seed, as every simulated row is), optimizer and
schedule, algorithm and its settings, topology or time-varying schedule, Byzantine peers and
attack, compressor, DP-SGD, network regime (emulated links, :mod:`peer.transport.shaping`),
stragglers (``launch --stragglers``: each local step of a straggler takes k times its compute),
crashes (``launch --crashes``: the peer SIGKILLed at ``at`` seconds and restarted from its
checkpoint at ``rejoin``),
number of steps (``rounds`` x the local steps of a round) and evaluations (``eval_every``
rounds: each peer's timed curve, ``launch --eval-every``).

The file is read by the simulator's own parser (:func:`sim.config.load_experiment`: every key
checked as ``sim run`` checks it) and mapped onto ``launch``'s flags by :func:`launch_plan`;
``launch`` then checks them with the peers' own validation and an error names the file's key
(``workload.peers (--peers): ...``). This lives in the front door because it needs both
runners' vocabularies and ``sim`` and ``peer`` never import each other.

What only the simulator can do is refused before anything starts, one line naming the key,
exit code 2 (:func:`launch_plan`): the baselines (a server or an all-reduce), per-link
overrides (an emulated link is a peer's uplink), ``server_bandwidth``, random compute
(``compute_distribution`` other than ``constant``, ``compute_spread``),
``init = "independent"`` and a ``[graph]``. The time model's own keys (``step_time``, ``stack_latency``,
``stack_bandwidth``, ``host_cores``) describe this machine, which the real run measures: they are read by
``gossipnet sim predict``, not by the peers; ``[output]`` is the simulator's. A ``latency`` or
``bandwidth`` equal to the simulator's default (100 µs, 10 Gb/s: a fast local network) is not
emulated: loopback stands for it, and the peers send unshaped.

Flags after the file: only those that do not change the experiment (where the run's files go,
how progress shows, the grace, the centralized reference, the real stack's own knobs such as
``--round-deadline-s`` and ``--jitter``, which the simulator has no counterpart of); a flag
the file sets (``--peers``, ``--lr``...) is refused, naming the key to edit.
"""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FREE_FLAGS", "LaunchPlan", "NotOnPeers", "launch_plan", "main"]

FREE_FLAGS = (
    "--dir", "--progress", "--json", "--save-model", "--log-dir", "--grace",
    "--no-centralized", "--log-level", "--round-deadline-s", "--max-serving-share",
    "--jitter", "--checkpoint-every", "--resume", "--peer-args", "--peer-args-for",
)  # fmt: skip
"""``launch`` flags that may follow an experiment file: they say where and how the run is
watched and kept, or set a real peer's own knob; every other flag is the file's."""


class NotOnPeers(ValueError):
    """A key of the experiment file that only the simulator runs; the message starts with
    the key (``network.links: ...``)."""


@dataclass
class LaunchPlan:
    """``launch``'s command line for an experiment file: ``flags`` in order, and which key
    of the file each flag came from (``origins``, for error messages)."""

    flags: list[str] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)

    def add(self, flag: str, value: Any, key: str) -> None:
        self.flags += [flag] if value is None else [flag, _text(value)]
        self.origins.setdefault(flag, key)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(_text(item) for item in value)
    return str(value)


def steps_per_round(config: Any) -> int:
    """Each peer's optimizer steps in one simulated round of a gossip algorithm: its local
    steps H (the algorithm's default when the file leaves it out)."""
    return int(config.algorithm.gossip.local_steps or 1)


def _refuse(config: Any) -> None:
    """Raise :class:`NotOnPeers` for the first key only the simulator runs."""
    from gossip.configuration import GOSSIP_ALGORITHMS
    from sim.config import BASELINES

    a, w, net = config.algorithm, config.workload, config.network
    if a.name in BASELINES:
        raise NotOnPeers(
            f"algorithm.name: {a.name!r} is a baseline only the simulator runs (a server or an "
            f"all-reduce); allowed on real peers: {', '.join(GOSSIP_ALGORITHMS)}"
        )
    refusals = (
        (net.links, "network.links", "per-link overrides are the simulator's; an emulated "
         "link is a peer's uplink: give latency and bandwidth one value per peer instead"),
        (net.server_bandwidth is not None, "network.server_bandwidth", "a server's link; "
         "real peers have no server"),
        (net.compute_distribution != "constant", "network.compute_distribution",
         f"{net.compute_distribution!r} draws simulated compute times; real peers take the "
         "time their steps take; allowed: constant"),
        (net.compute_spread, "network.compute_spread", "draws simulated compute times; "
         "allowed: 0"),
        (w.init != "same", "workload.init", "real peers start from one model built from the "
         "seed; allowed: same"),
        (config.graph is not None, "graph", "a real peer takes a topology by name or spec; "
         "use algorithm.topology"),
        (config.rounds < 1, "rounds", f"a real run takes at least one round, got "
         f"{config.rounds}"),
    )  # fmt: skip
    for refused, key, why in refusals:
        if refused:
            raise NotOnPeers(f"{key}: {why}")


def _partition(config: Any) -> str:
    """``workload.partition``; a ``label_sets`` table as the spec with one set per peer
    (``label-sets:sets=0+1|0+1|2+3|...``: the same ``workloads.partition.label_sets`` call)."""
    if config.workload.label_sets is None:
        return str(config.workload.partition)
    sets = "|".join("+".join(map(str, labels)) for labels in config.peer_labels())
    return f"label-sets:sets={sets}"


def _topology(config: Any) -> str:
    """``algorithm.topology`` with ``topology_params`` written into the spec."""
    spec = str(config.topology)
    params = config.algorithm.topology_params
    if not params:
        return spec
    extra = ",".join(f"{key}={_text(value)}" for key, value in params.items())
    return f"{spec}{',' if ':' in spec else ':'}{extra}"


def launch_plan(config: Any) -> LaunchPlan:
    """``launch``'s flags for ``config`` (a :class:`sim.config.ExperimentConfig`); raises
    :class:`NotOnPeers` for a key only the simulator runs."""
    from gossip.settings import SETTINGS
    from peer.transport.shaping import LINK_FIELDS, LinkSettings
    from sim.build import byzantine_mask, dataset_spec
    from sim.config import NetworkConfig
    from workloads.optimizers import OPTIMIZER_KEYS
    from workloads.privacy import PRIVACY_FIELDS

    _refuse(config)
    w, a, o, net = config.workload, config.algorithm, config.optimizer, config.network
    plan = LaunchPlan()
    plan.add("--peers", w.peers, "workload.peers")
    plan.add("--seed", config.seed, "seed")
    plan.add("--device", config.device, "device")
    plan.add("--dataset", dataset_spec(w), "workload.dataset")
    plan.add("--partition", _partition(config), "workload.partition")
    plan.add("--model", w.model, "workload.model")
    plan.add("--batch-size", w.batch_size, "workload.batch_size")
    per_round = steps_per_round(config)
    plan.add("--steps", config.rounds * per_round, "rounds")
    plan.add("--eval-every", config.eval_every * per_round, "eval_every")
    for item in OPTIMIZER_KEYS.values():  # every key the optimizer reads, defaults too: a
        if o.name in item.optimizers and o.schedule in item.schedules:  # peer's differ (SGD
            value = getattr(o, item.name)  # momentum 0.9), the file's are the simulator's
            if value is not None:
                plan.add(item.flag, value, f"optimizer.{item.name}")
    plan.add("--algorithm", a.name, "algorithm.name")
    for setting in SETTINGS:
        value = getattr(a, setting.name)
        if value is not None:
            plan.add(setting.flag, value, f"algorithm.{setting.name}")
    plan.add("--topology", _topology(config), "algorithm.topology")
    if a.weights is not None:
        plan.add("--topology-weights", a.weights, "algorithm.weights")
    churn = importlib.import_module("peer.app.churn")  # as the dispatcher reaches peer.app
    if net.stragglers:  # each local step of peer i takes k times its compute (--slowdown)
        plan.add("--stragglers", churn.stragglers_flag(net.stragglers), "network.stragglers")
    if net.crashes:  # SIGKILLed at AT, started again from its checkpoint at the rejoin
        plan.add("--crashes", churn.crashes_flag(net.crashes), "network.crashes")
    byzantine = [int(i) for i in byzantine_mask(config).nonzero()[0]]
    if byzantine:
        key = "byzantine.peers" if config.byzantine.chosen else "byzantine.count"
        plan.add("--byzantine", f"{len(byzantine)}:{config.byzantine.attack}", key)
        plan.add("--byzantine-peers", ",".join(map(str, byzantine)), key)
    if config.privacy is not None:
        for name in PRIVACY_FIELDS:
            value = getattr(config.privacy, name)
            if value is not None:
                plan.add(f"--dp-{name}", value, f"privacy.{name}")
        plan.add("--dp-seeded", None, "privacy")  # the simulator keys its noise by the seed
    loopback = NetworkConfig()  # the simulator's default network stands for loopback's
    table = {
        name: getattr(net, name)
        for name in LINK_FIELDS
        if hasattr(net, name) and getattr(net, name) != getattr(loopback, name, None)
    }
    links = [_link_flags(LinkSettings.for_peer(table, i)) for i in range(w.peers)]
    if all(link == links[0] for link in links):
        for flag, value, key in links[0]:
            plan.add(flag, value, key)
    else:  # one value per peer: each peer's own uplink
        for index, link in enumerate(links):
            own = [text for flag, value, _ in link for text in (flag, _text(value))]
            if own:
                plan.add("--peer-args-for", f"{index}={shlex.join(own)}", "network.latency")
    return plan


def _link_flags(link: Any) -> list[tuple[str, float, str]]:
    """The flags of one emulated uplink, with their keys (none for an unshaped link)."""
    flags = []
    if link.latency:
        flags.append(("--latency", link.latency, "network.latency"))
    if link.bandwidth is not None:
        flags.append(("--bandwidth", link.bandwidth, "network.bandwidth"))
    if link.message_loss:
        flags.append(("--message-loss", link.message_loss, "network.message_loss"))
    return flags


def experiment_flags(extra: Sequence[str], prog: str) -> None:
    """Refuse a flag after the file that the file sets (one line, exit code 2)."""
    from peer.app.usage import exit_with

    for token in extra:
        if not token.startswith("--"):
            continue
        flag = token.split("=", 1)[0]
        if flag in ("--help",) or flag in FREE_FLAGS:
            continue
        exit_with(
            prog,
            f"{flag}: the experiment file says what the run is (edit the file, or launch "
            f"without a file); allowed after EXPERIMENT.toml: {', '.join(FREE_FLAGS)}",
        )


def main(argv: Sequence[str], prog: str = "gossipnet launch") -> int:
    """``gossipnet launch EXPERIMENT.toml [FLAGS]``: read the file, map it onto ``launch``
    (:func:`launch_plan`) and run it; exit code 2 and one line for a key only the simulator
    runs, else ``launch``'s."""
    from peer.app.usage import exit_with
    from sim.config import ConfigError, load_experiment

    file, *extra = argv
    experiment_flags(extra, prog)
    try:
        config = load_experiment(file)
        plan = launch_plan(config)
    except (ConfigError, ValueError) as error:
        exit_with(prog, f"{file}: {error}")
    launch = importlib.import_module("peer.app.launch")  # as the dispatcher reaches peer
    code: int = launch.main([*plan.flags, *extra], prog, origins=plan.origins)
    return code
