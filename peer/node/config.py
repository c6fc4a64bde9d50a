"""``PeerConfig``: every knob of a networked peer, validated at construction.

An error is a :class:`~gossip.settings.ConfigurationError` that carries the field it is about
(``error.field``) and says what is allowed; ``str(error)`` reads ``PeerConfig.FIELD: ...``.
The CLI maps its flags 1:1 onto these fields (``--round-deadline-s`` -> ``round_deadline_s``)
and names a refused field by its flag.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

import consensus
import topologies
from gossip.configuration import ConfigurationError, GossipConfig
from gossip.settings import SETTING_NAMES, setting_fields
from peer.node.membership import check_address
from peer.protocol.wire import SENDER_ID_PATTERN
from peer.transport.admission import DEFAULT_SERVING_SHARE
from peer.transport.shaping import LINK_FIELDS, LinkError, LinkSettings
from workloads.device import DEVICE_CHOICES, DEVICE_PATTERN
from workloads.device import resolve_device as resolve_device  # re-exported for peer.*

Mode = Literal["async", "sync"]
MODES: tuple[Mode, ...] = ("async", "sync")
ALGORITHMS: dict[str, Mode] = {
    "ad-psgd": "async",
    "dpsgd": "sync",
    "local-sgd": "sync",
    "push-sum": "sync",
    "choco": "sync",
    "diloco": "sync",
    "noloco": "sync",
    "sparseloco": "sync",
}
"""Algorithms a networked peer runs (the simulator's names) and the exchange mode of each."""
CLIENT_ONLY_FANOUT = 2
"""An async client-only peer's default ``fanout``: AD-PSGD averages a peer when it calls
and when it is called, and a listening peer is called about once a round; a peer nobody can
call makes up for it with a second call. With one call a round it ended 0.05-0.09 below the
others' test accuracy in 4-peer launches; with two, level with them (docs/peer.md)."""


def _error(name: str, reason: str, *mentions: str) -> ConfigurationError:
    """The error about field ``name``; ``reason`` refers to each other field in
    ``mentions`` as ``{field}``."""
    return ConfigurationError(name, reason, mentions=mentions, owner="PeerConfig")


def _int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _error(name, f"must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise _error(name, f"must be an integer <= {maximum}, got {value!r}")


def _positive(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise _error(name, f"must be a finite number > 0, got {value!r}")


def _address(name: str, address: object, what: str = "the address") -> None:
    try:
        check_address(address, field=what)
    except ValueError as error:
        raise _error(name, str(error)) from None


@dataclass(frozen=True)
@setting_fields
class PeerConfig:
    """Configuration of one peer.

    Identity and network:
        peer_id: unique id in the swarm, 1-64 chars of [A-Za-z0-9._:-].
        host, port: where to listen (port 0 = an ephemeral port).
        advertise: ``HOST:PORT`` others should call (default: ``host:bound port``).
        client_only: never listen; take part only through our own calls (push-pull).
        join: ``HOST:PORT`` of live peers to bootstrap from (any one suffices).
        join_timeout_s: how long to keep retrying ``join`` (with backoff) while none of
            those peers answers yet, so that machines may be started in any order.
        fetch_state: when joining, start from a live peer's model (``GET /v1/state``).

    Algorithm:
        algorithm: ``ad-psgd``, ``dpsgd``, ``local-sgd``, ``push-sum`` or ``choco`` (the
            simulator's names); sets ``mode`` (ad-psgd: async; the others: sync rounds).
            ``None``: from ``mode`` (async: ad-psgd; sync: dpsgd). push-sum and choco need
            a ``topology`` (their weights come from a known graph).
        mode: ``"async"`` (AD-PSGD: average with ``fanout`` random neighbours, one
            pair at a time, Lian et al. ICML 2018) or ``"sync"`` (D-PSGD rounds: mix
            with every neighbour, those missing the deadline masked out, Lian et al.
            NeurIPS 2017). ``None``: from ``algorithm`` (a contradiction is an error).
        order, local_steps, aggregator, compressor, consensus_step, ...: the algorithm's
            settings, one keyword field per setting of ``gossip.settings.SETTINGS`` (the
            table is docs/settings.md), validated by ``gossip.GossipConfig`` exactly as the
            simulator validates its ``[algorithm]`` table (same names). ``None`` takes the
            algorithm's default; a setting the algorithm does not read is an error. After
            construction they hold the resolved values (:attr:`gossip` has them all). On a
            peer ``local_steps`` is >= 1 (its run counts optimizer steps).
        fanout: async mode: neighbours averaged with per round. ``None``: 1, or
            :data:`CLIENT_ONLY_FANOUT` for a ``client_only`` peer (nobody calls it, so it
            averages only through its own calls; a listening peer is also called about as
            often as it calls). After construction an async peer's holds the number; in
            sync mode it must be left ``None`` (an error otherwise).
        round_deadline_s: sync mode: how long a round waits for neighbours.
        seed: seeds neighbour choice (with the peer id), data order and dropout masks.
        topology: neighbours from a ``topologies`` graph or schedule over ``peer_list``
            (``ring``, ``exponential``, ``random-regular:degree=4``,
            ``one-peer-exponential``...); ``None`` = random neighbours from the view.
        topology_weights: mixing weights for the graph (``metropolis``, ``max-degree``,
            ``lazy``, ``uniform``); ``None`` = Metropolis-Hastings (undirected) or
            uniform (directed).
        peer_list: every peer's ``HOST:PORT`` (rank r = entry r), with ``topology``.
        rank: this peer's entry in ``peer_list``.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:I`` (checked when the peer is built).
        max_concurrent_exchanges: ``/v1/exchange`` requests served at once; more get
            ``409 busy`` before their body is read (bounds incoming model buffers).
        max_serving_share: while the peer trains, the most of its time that serving
            neighbours' exchanges may take, in (0, 1] (``1``: no limit); past it an exchange
            gets ``409 busy`` (``peer.transport.admission.ServingShare``).

    Evaluation:
        byzantine: a ``consensus.build_attack`` spec (``sign-flip``, ``gaussian:sigma=1``,
            ``alie``...): this peer is a Byzantine member for experiments. It trains and
            mixes as usual, but every message it sends is the attack's (synchronous
            algorithms only, as in the simulator). It says so loudly: a warning at start,
            ``byzantine`` in its status and ``gossipnet_byzantine 1`` in its metrics.

    Robustness and safety:
        request_timeout_s: total timeout of every outgoing call.
        suspect_after, evict_after: consecutive failed calls before a neighbour is
            suspected / evicted.
        secret: swarm secret (>= 16 bytes); else ``secret_file`` or ``GOSSIPNET_SECRET``;
            with none of them the swarm is open and the peer warns.
        clock_window_s: accepted clock skew for signed requests.
        tls_cert, tls_key, tls_ca: serve (and call) over TLS; ``tls_ca`` verifies peers.
        max_body_factor: body cap = factor * model bytes + 64 KiB.

    Checkpoints:
        checkpoint_dir, checkpoint_every (steps, 0 = off), keep_checkpoints, resume.

    Emulated link (``peer.transport.shaping``; the simulator's ``[network]`` names and
    units; all unset: nothing is shaped):
        latency: one-way delay of every message this peer sends, seconds.
        bandwidth: this peer's uplink, bytes per second (``None``: not limited).
        jitter: each message's delay is uniform in ``latency ± jitter`` seconds.
        message_loss: probability that a message this peer sends is lost.

    Emulated straggler (the simulator's ``[network] stragglers = {peer = k}``):
        slowdown: each local step takes this factor times its compute time, >= 1: after a
            gradient or optimizer step of measured duration ``d`` the peer waits
            ``(slowdown - 1) * d`` on its event loop (serving meanwhile, the model lock
            free); 1 (the default): no wait. :meth:`peer.node.peer.Peer.run` only.

    Model and records:
        average_buffers: ship and mix the model's floating-point buffers (BatchNorm running
            statistics) with its parameters, as one flat vector. ``False`` keeps each
            peer's buffers its own, and the peer warns at start when the model has any.
            Integer buffers (counters) and buffers holding ``-inf`` or NaN (causal masks)
            are always the peer's own (``gossip.flat.averageable``), whatever this says.
        log_dir: write the peer's training record here: TensorBoard event files and
            ``metrics.csv`` (step, loss, accuracy, bytes, exchanges), and MLflow where it
            is installed and ``MLFLOW_TRACKING_URI`` is set.
    """

    peer_id: str
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None
    client_only: bool = False
    join: Sequence[str] = ()
    join_timeout_s: float = 60.0
    fetch_state: bool = True
    mode: Mode | None = None
    byzantine: str | None = None
    fanout: int | None = None
    round_deadline_s: float = 5.0
    seed: int = 0
    algorithm: str | None = None
    topology: str | None = None
    topology_weights: str | None = None
    peer_list: tuple[str, ...] = ()
    rank: int | None = None
    device: str = "cpu"
    max_concurrent_exchanges: int = 8
    max_serving_share: float = DEFAULT_SERVING_SHARE
    request_timeout_s: float = 10.0
    suspect_after: int = 1
    evict_after: int = 3
    secret: bytes | None = field(default=None, repr=False)
    secret_file: str | None = None
    clock_window_s: int = 60
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    max_body_factor: float = 2.0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    resume: bool = False
    average_buffers: bool = True
    log_dir: str | None = None
    latency: float = 0.0
    bandwidth: float | None = None
    jitter: float = 0.0
    message_loss: float = 0.0
    slowdown: float = 1.0

    if TYPE_CHECKING:  # the settings' fields (gossip.settings.setting_fields)

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self) -> None:
        if not isinstance(self.peer_id, str) or SENDER_ID_PATTERN.fullmatch(self.peer_id) is None:
            raise _error(
                "peer_id",
                "must be 1-64 chars of [A-Za-z0-9._:-] starting with a letter or digit, got "
                f"{self.peer_id!r}",
            )
        if not isinstance(self.host, str) or not self.host:
            raise _error("host", f"must be a non-empty host name, got {self.host!r}")
        _int("port", self.port, 0, 65535)
        if self.advertise is not None:
            _address("advertise", self.advertise)
        if isinstance(self.join, str) or not isinstance(self.join, tuple | list):
            raise _error("join", f"must be a list or tuple of HOST:PORT strings, got {self.join!r}")
        object.__setattr__(self, "join", tuple(self.join))
        for address in self.join:
            _address("join", address, "an entry")
        _positive("join_timeout_s", self.join_timeout_s)
        self._check_algorithm()
        if not isinstance(self.device, str) or DEVICE_PATTERN.fullmatch(self.device) is None:
            raise _error(
                "device",
                f"got {self.device!r}; allowed: " + DEVICE_CHOICES.replace(" or ", ", "),
            )
        _int("max_concurrent_exchanges", self.max_concurrent_exchanges, 1)
        share = self.max_serving_share
        if (
            isinstance(share, bool)
            or not isinstance(share, int | float)
            or not (math.isfinite(share) and 0 < share <= 1)
        ):
            raise _error("max_serving_share", f"must be in (0, 1]; got {share!r}")
        object.__setattr__(self, "max_serving_share", float(share))
        self._check_topology()
        self._check_fanout()
        _positive("round_deadline_s", self.round_deadline_s)
        _positive("request_timeout_s", self.request_timeout_s)
        _int("seed", self.seed, 0)
        _int("suspect_after", self.suspect_after, 1)
        _int("evict_after", self.evict_after, self.suspect_after)
        if self.secret is not None and (
            not isinstance(self.secret, bytes) or len(self.secret) < 16
        ):
            raise _error("secret", "must be bytes of length >= 16")
        _int("clock_window_s", self.clock_window_s, 1)
        if (self.tls_cert is None) != (self.tls_key is None):
            given = "tls_cert" if self.tls_key is None else "tls_key"
            other = "tls_key" if given == "tls_cert" else "tls_cert"
            raise _error(given, f"must be given together with {{{other}}}", other)
        if (
            isinstance(self.max_body_factor, bool)
            or not isinstance(self.max_body_factor, int | float)
            or not (1.0 <= self.max_body_factor <= 64.0)
        ):
            raise _error(
                "max_body_factor", f"must be a number in [1, 64], got {self.max_body_factor!r}"
            )
        _int("checkpoint_every", self.checkpoint_every, 0)
        _int("keep_checkpoints", self.keep_checkpoints, 1)
        if (self.checkpoint_every or self.resume) and self.checkpoint_dir is None:
            raise _error(
                "checkpoint_dir",
                "is required with {checkpoint_every} > 0 or {resume}",
                "checkpoint_every",
                "resume",
            )
        if not isinstance(self.average_buffers, bool):
            raise _error("average_buffers", f"must be True or False, got {self.average_buffers!r}")
        if self.log_dir is not None and (not isinstance(self.log_dir, str) or not self.log_dir):
            raise _error("log_dir", f"must be a non-empty directory path, got {self.log_dir!r}")
        if self.client_only and self.join == ():
            raise _error(
                "join", "must name at least one peer when {client_only} is set", "client_only"
            )
        if (
            isinstance(self.slowdown, bool)
            or not isinstance(self.slowdown, int | float)
            or not (math.isfinite(self.slowdown) and self.slowdown >= 1)
        ):
            raise _error("slowdown", f"must be a finite number >= 1, got {self.slowdown!r}")
        object.__setattr__(self, "slowdown", float(self.slowdown))
        try:
            self.link  # noqa: B018  (checked here, built where used)
        except LinkError as error:
            raise _error(error.field, error.reason) from None

    @property
    def link(self) -> LinkSettings:
        """The emulated uplink's settings (``peer.transport.shaping``)."""
        return LinkSettings(**{name: getattr(self, name) for name in LINK_FIELDS})

    def _check_fanout(self) -> None:
        """``fanout`` and ``max_serving_share`` are async settings: an error in sync mode
        (``max_serving_share`` other than its default)."""
        if self.mode == "sync":
            if self.fanout is not None:
                raise _error(
                    "fanout",
                    f"async mode only ({self.algorithm} rounds exchange with every neighbour, "
                    f"or the topology's); got {self.fanout!r}, leave it unset",
                )
            if self.max_serving_share != DEFAULT_SERVING_SHARE:
                raise _error(
                    "max_serving_share",
                    f"async mode only ({self.algorithm} rounds serve each neighbour once a "
                    f"round); got {self.max_serving_share!r}, leave it unset",
                )
            return
        if self.fanout is None:
            object.__setattr__(self, "fanout", CLIENT_ONLY_FANOUT if self.client_only else 1)
        _int("fanout", self.fanout, 1)

    def _check_algorithm(self) -> None:
        """Resolve algorithm and mode, then the one shared validation of the settings."""
        if self.mode is not None and self.mode not in MODES:
            raise _error("mode", f"must be one of {list(MODES)}, got {self.mode!r}")
        algorithm = self.algorithm
        if algorithm is None:
            algorithm = "dpsgd" if self.mode == "sync" else "ad-psgd"
        elif algorithm not in ALGORITHMS:
            raise _error(
                "algorithm",
                f"unknown algorithm {algorithm!r}; allowed: " + ", ".join(ALGORITHMS),
            )
        if self.mode is not None and self.mode != ALGORITHMS[algorithm]:
            raise _error(
                "mode",
                f"{self.mode!r} contradicts {{algorithm}} {algorithm!r} (which runs "
                f"{ALGORITHMS[algorithm]!r}); give one of them",
                "algorithm",
            )
        if self.local_steps is not None:
            _int("local_steps", self.local_steps, 1)  # a peer's run counts optimizer steps
        try:
            settings = GossipConfig(
                algorithm, **{name: getattr(self, name) for name in SETTING_NAMES}
            )
        except ConfigurationError as error:
            raise _error(error.field, error.reason, *error.mentions) from None
        if self.byzantine is not None:
            self._check_byzantine(algorithm)
        if settings.secure_sum:
            self._check_secure_sum()
        if settings.needs_topology and self.topology is None:
            raise _error(
                "topology",
                f"is required for {algorithm}: its mixing weights must come from a known "
                "graph over {peer_list} (e.g. topology="
                + ("'random-matching')" if algorithm == "noloco" else "'ring')"),
                "peer_list",
            )
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "mode", ALGORITHMS[algorithm])
        for name in SETTING_NAMES:
            object.__setattr__(self, name, getattr(settings, name))
        self.__dict__["_gossip"] = settings

    def _check_secure_sum(self) -> None:
        """Secure sums (``gossip.secure_sum``) need a known graph, so that a sender knows its
        receivers' weights and in-neighbours; a peer that sends attacks or serves its model
        in the clear would defeat them. A secure peer never fetches a model at join (its
        neighbours serve none): every rank starts from the seed's model."""
        if self.topology is None:
            raise _error(
                "secure_sum",
                "needs {topology}: a sender must know each receiver's weights and in-neighbours "
                "from a known graph (e.g. topology='ring')",
                "topology",
            )
        if self.byzantine is not None:
            raise _error(
                "secure_sum", "cannot run with {byzantine}: an attack needs the models", "byzantine"
            )
        object.__setattr__(self, "fetch_state", False)

    def _check_byzantine(self, algorithm: str) -> None:
        if not isinstance(self.byzantine, str) or not self.byzantine.strip():
            raise _error(
                "byzantine", f"must be an attack spec (e.g. 'sign-flip'), got {self.byzantine!r}"
            )
        if ALGORITHMS[algorithm] != "sync":
            raise _error(
                "byzantine",
                "needs a synchronous algorithm ("
                + ", ".join(name for name, mode in ALGORITHMS.items() if mode == "sync")
                + f"), not "
                f"{algorithm}: Byzantine peers are evaluated in rounds, as in the simulator",
            )
        try:
            consensus.build_attack(self.byzantine)
        except ValueError as error:
            raise _error("byzantine", str(error)) from None

    @property
    def gossip(self) -> GossipConfig:
        """The validated algorithm settings, as the simulator would hold them."""
        return cast(GossipConfig, self.__dict__["_gossip"])

    def _check_topology(self) -> None:
        if not isinstance(self.peer_list, tuple):
            raise _error("peer_list", f"must be a tuple of HOST:PORT, got {self.peer_list!r}")
        for address in self.peer_list:
            _address("peer_list", address, "an entry")
        if self.topology is None:
            if self.peer_list or self.rank is not None or self.topology_weights is not None:
                raise _error(
                    "topology",
                    "is required with {peer_list}, {rank} or {topology_weights}",
                    "peer_list",
                    "rank",
                    "topology_weights",
                )
            return
        if not isinstance(self.topology, str) or not self.topology:
            raise _error("topology", f"must be a topology spec, got {self.topology!r}")
        if len(self.peer_list) < 2:
            raise _error(
                "peer_list",
                f"must list at least 2 HOST:PORT with a topology, got {len(self.peer_list)}",
            )
        if len(set(self.peer_list)) != len(self.peer_list):
            raise _error("peer_list", "must not list an address twice")
        if self.rank is None:
            raise _error("rank", "is required with a topology")
        _int("rank", self.rank, 0, len(self.peer_list) - 1)
        if self.client_only:
            raise _error(
                "client_only",
                "cannot be combined with a topology: every rank listens at its {peer_list} address",
                "peer_list",
            )
        try:
            schedule = topologies.build_schedule(
                self.topology, len(self.peer_list), weights=self.topology_weights, seed=self.seed
            )
        except (ValueError, TypeError) as error:
            field = (
                "topology_weights" if getattr(error, "parameter", "") == "weights" else "topology"
            )
            raise _error(field, str(error)) from None
        try:
            self.gossip.check_neighbourhood(
                topologies.smallest_neighbourhood(schedule),
                where=f"topology {self.topology!r} on {len(self.peer_list)} peers",
            )
        except ConfigurationError as error:
            raise _error(error.field, error.reason, *error.mentions) from None
