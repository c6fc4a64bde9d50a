"""``PeerConfig``: every knob of a networked peer, validated at construction.

Errors name the field and the allowed values. The CLI maps its flags 1:1 onto
these fields (``--round-deadline-s`` -> ``round_deadline_s``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, cast

import consensus
import topologies
from gossip.configuration import GOSSIP_ALGORITHMS, ConfigurationError, GossipConfig
from peer.node.membership import check_address
from peer.protocol.wire import SENDER_ID_PATTERN
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
}
"""Algorithms a networked peer runs (the simulator's names) and the exchange mode of each."""
SIMULATOR_ONLY = tuple(name for name in GOSSIP_ALGORITHMS if name not in ALGORITHMS)
"""gossip algorithms the simulator runs but a peer does not yet (docs/algorithms.md says why)."""
CLIENT_ONLY_FANOUT = 2
"""An async client-only peer's default ``fanout``: AD-PSGD averages a peer when it calls
and when it is called, and a listening peer is called about once a round; a peer nobody can
call makes up for it with a second call. With one call a round it ended 0.05-0.09 below the
others' test accuracy in 4-peer launches; with two, level with them (docs/peer.md)."""
GOSSIP_FIELDS = ("order", "local_steps", "aggregator", "compressor", "consensus_step")
"""PeerConfig fields that are ``gossip.GossipConfig`` fields of the same name."""


def _int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"PeerConfig.{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ValueError(f"PeerConfig.{name} must be an integer <= {maximum}, got {value!r}")


def _positive(name: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"PeerConfig.{name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
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
        order, local_steps, aggregator, compressor, consensus_step: the algorithm's settings,
            validated by ``gossip.GossipConfig`` exactly as the simulator validates its
            ``[algorithm]`` table (same names). ``None`` takes the algorithm's
            default; a setting the algorithm does not read is an error. After
            construction they hold the resolved values (:attr:`gossip` has them all).
            order: ``combine-then-adapt`` or ``adapt-then-combine`` (dpsgd);
            local_steps: optimizer steps per round (>= 1 on a peer; local-sgd >= 2);
            aggregator: a ``consensus.build`` spec (``mean``, ``trimmed-mean:b=1``; for
            ad-psgd one that can run on the pair's 2 models); compressor: ``none``,
            ``fp16``, ``bf16`` or ``qsgd[:bits=B]`` (choco: any compressor, ``topk`` and
            ``randk`` too); consensus_step: CHOCO's gamma.
        codec: the deprecated name of ``compressor`` (one release; a ``DeprecationWarning``).
            After construction it holds the same resolved spec as ``compressor``.
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

    Model and records:
        average_buffers: ship and mix the model's floating-point buffers (BatchNorm running
            statistics) with its parameters, as one flat vector. ``False`` keeps each
            peer's buffers its own, and the peer warns at start when the model has any.
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
    order: str | None = None
    local_steps: int | None = None
    aggregator: str | None = None
    compressor: str | None = None
    codec: str | None = field(default=None, repr=False, compare=False)
    consensus_step: float | None = None
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

    def __post_init__(self) -> None:
        if not isinstance(self.peer_id, str) or SENDER_ID_PATTERN.fullmatch(self.peer_id) is None:
            raise ValueError(
                f"PeerConfig.peer_id must be 1-64 chars of [A-Za-z0-9._:-] starting with a "
                f"letter or digit, got {self.peer_id!r}"
            )
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"PeerConfig.host must be a non-empty host name, got {self.host!r}")
        _int("port", self.port, 0, 65535)
        if self.advertise is not None:
            check_address(self.advertise, field="PeerConfig.advertise")
        if isinstance(self.join, str) or not isinstance(self.join, tuple | list):
            raise ValueError(
                f"PeerConfig.join must be a list or tuple of HOST:PORT strings, got {self.join!r}"
            )
        object.__setattr__(self, "join", tuple(self.join))
        for address in self.join:
            check_address(address, field="PeerConfig.join entry")
        _positive("join_timeout_s", self.join_timeout_s)
        self._check_algorithm()
        if not isinstance(self.device, str) or DEVICE_PATTERN.fullmatch(self.device) is None:
            raise ValueError(
                f"PeerConfig.device: got {self.device!r}; allowed: "
                + DEVICE_CHOICES.replace(" or ", ", ")
            )
        _int("max_concurrent_exchanges", self.max_concurrent_exchanges, 1)
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
            raise ValueError("PeerConfig.secret must be bytes of length >= 16")
        _int("clock_window_s", self.clock_window_s, 1)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("PeerConfig.tls_cert and PeerConfig.tls_key must be given together")
        if (
            isinstance(self.max_body_factor, bool)
            or not isinstance(self.max_body_factor, int | float)
            or not (1.0 <= self.max_body_factor <= 64.0)
        ):
            raise ValueError(
                f"PeerConfig.max_body_factor must be a number in [1, 64], got {self.max_body_factor!r}"
            )
        _int("checkpoint_every", self.checkpoint_every, 0)
        _int("keep_checkpoints", self.keep_checkpoints, 1)
        if (self.checkpoint_every or self.resume) and self.checkpoint_dir is None:
            raise ValueError(
                "PeerConfig.checkpoint_dir is required with checkpoint_every > 0 or resume"
            )
        if not isinstance(self.average_buffers, bool):
            raise ValueError(
                f"PeerConfig.average_buffers must be True or False, got {self.average_buffers!r}"
            )
        if self.log_dir is not None and (not isinstance(self.log_dir, str) or not self.log_dir):
            raise ValueError(
                f"PeerConfig.log_dir must be a non-empty directory path, got {self.log_dir!r}"
            )
        if self.client_only and self.join == ():
            raise ValueError("PeerConfig.join must name at least one peer when client_only is set")

    def _check_fanout(self) -> None:
        """``fanout`` is an async setting: resolved there, an error in sync mode."""
        if self.mode == "sync":
            if self.fanout is not None:
                raise ValueError(
                    f"PeerConfig.fanout: async mode only ({self.algorithm} rounds exchange with "
                    f"every neighbour, or the topology's); got {self.fanout!r}, leave it unset"
                )
            return
        if self.fanout is None:
            object.__setattr__(self, "fanout", CLIENT_ONLY_FANOUT if self.client_only else 1)
        _int("fanout", self.fanout, 1)

    def _check_algorithm(self) -> None:
        """Resolve algorithm and mode, then the one shared validation of the settings."""
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"PeerConfig.mode must be one of {list(MODES)}, got {self.mode!r}")
        algorithm = self.algorithm
        if algorithm is None:
            algorithm = "dpsgd" if self.mode == "sync" else "ad-psgd"
        elif algorithm in SIMULATOR_ONLY:
            raise ValueError(
                f"PeerConfig.algorithm {algorithm!r} runs only in the simulator (gossipnet "
                f"sim) so far; a peer runs one of {list(ALGORITHMS)}"
            )
        elif algorithm not in ALGORITHMS:
            raise ValueError(
                f"PeerConfig.algorithm: unknown algorithm {algorithm!r}; allowed: "
                + ", ".join(ALGORITHMS)
            )
        if self.mode is not None and self.mode != ALGORITHMS[algorithm]:
            raise ValueError(
                f"PeerConfig.mode {self.mode!r} contradicts PeerConfig.algorithm {algorithm!r} "
                f"(which runs {ALGORITHMS[algorithm]!r}); give one of them"
            )
        if self.local_steps is not None:
            _int("local_steps", self.local_steps, 1)  # a peer's run counts optimizer steps
        compressor, named = self._compressor()
        try:
            settings = GossipConfig(
                algorithm,
                order=self.order,
                local_steps=self.local_steps,
                aggregator=self.aggregator,
                compressor=compressor,
                consensus_step=self.consensus_step,
            )
        except ConfigurationError as error:
            field = named if error.field == "compressor" else error.field
            raise ValueError(f"PeerConfig.{field}: {error.reason}") from None
        if self.byzantine is not None:
            self._check_byzantine(algorithm)
        if settings.needs_topology and self.topology is None:
            raise ValueError(
                f"PeerConfig.topology is required for {algorithm}: its mixing weights must come "
                "from a known graph over PeerConfig.peer_list (e.g. topology='ring')"
            )
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "mode", ALGORITHMS[algorithm])
        for name in GOSSIP_FIELDS:
            object.__setattr__(self, name, getattr(settings, name))
        object.__setattr__(self, "codec", settings.compressor)
        self.__dict__["_gossip"] = settings

    def _compressor(self) -> tuple[str | None, str]:
        """The compressor spec given, and the field it was given as (``codec``, the old
        name, still works for one release)."""
        if self.codec is None:
            return self.compressor, "compressor"
        if self.compressor is not None and self.compressor != self.codec:
            raise ValueError(
                f"PeerConfig.codec is the deprecated name of PeerConfig.compressor; give only "
                f"compressor (got codec={self.codec!r}, compressor={self.compressor!r})"
            )
        if self.compressor is None:
            warnings.warn(
                "PeerConfig.codec is deprecated and goes away in the next release; use "
                "PeerConfig.compressor",
                DeprecationWarning,
                stacklevel=5,
            )
        return self.codec, "codec"

    def _check_byzantine(self, algorithm: str) -> None:
        if not isinstance(self.byzantine, str) or not self.byzantine.strip():
            raise ValueError(
                f"PeerConfig.byzantine must be an attack spec (e.g. 'sign-flip'), got "
                f"{self.byzantine!r}"
            )
        if ALGORITHMS[algorithm] != "sync":
            raise ValueError(
                f"PeerConfig.byzantine needs a synchronous algorithm (dpsgd, local-sgd, push-sum, "
                f"choco), not {algorithm}: Byzantine peers are evaluated in rounds, as in the "
                "simulator"
            )
        try:
            consensus.build_attack(self.byzantine)
        except ValueError as error:
            raise ValueError(f"PeerConfig.byzantine: {error}") from None

    @property
    def gossip(self) -> GossipConfig:
        """The validated algorithm settings, as the simulator would hold them."""
        return cast(GossipConfig, self.__dict__["_gossip"])

    def _check_topology(self) -> None:
        if not isinstance(self.peer_list, tuple):
            raise ValueError(
                f"PeerConfig.peer_list must be a tuple of HOST:PORT, got {self.peer_list!r}"
            )
        for address in self.peer_list:
            check_address(address, field="PeerConfig.peer_list entry")
        if self.topology is None:
            if self.peer_list or self.rank is not None or self.topology_weights is not None:
                raise ValueError(
                    "PeerConfig.topology is required with peer_list, rank or topology_weights"
                )
            return
        if not isinstance(self.topology, str) or not self.topology:
            raise ValueError(f"PeerConfig.topology must be a topology spec, got {self.topology!r}")
        if len(self.peer_list) < 2:
            raise ValueError(
                "PeerConfig.peer_list must list at least 2 HOST:PORT with a topology, "
                f"got {len(self.peer_list)}"
            )
        if len(set(self.peer_list)) != len(self.peer_list):
            raise ValueError("PeerConfig.peer_list must not list an address twice")
        if self.rank is None:
            raise ValueError("PeerConfig.rank is required with a topology")
        _int("rank", self.rank, 0, len(self.peer_list) - 1)
        if self.client_only:
            raise ValueError(
                "PeerConfig.client_only cannot be combined with a topology: every rank listens "
                "at its peer_list address"
            )
        try:
            schedule = topologies.build_schedule(
                self.topology, len(self.peer_list), weights=self.topology_weights, seed=self.seed
            )
        except (ValueError, TypeError) as error:
            field = (
                "topology_weights" if getattr(error, "parameter", "") == "weights" else "topology"
            )
            raise ValueError(f"PeerConfig.{field}: {error}") from None
        try:
            self.gossip.check_neighbourhood(
                topologies.smallest_neighbourhood(schedule),
                where=f"topology {self.topology!r} on {len(self.peer_list)} peers",
            )
        except ConfigurationError as error:
            raise ValueError(f"PeerConfig.{error.field}: {error.reason}") from None
