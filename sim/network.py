"""The network and time model: links, compute speeds, failures and what a round costs.

Simulated time is computed, never measured, so every number here is deterministic.

Communication costs for a message of M bytes (α = latency in seconds, B = bandwidth in
bytes per second):

- ring all-reduce over p peers (Patarasuk and Yuan, 2009):
  ``T = 2(p−1)·α + 2(p−1)/p · M/B``, with α the largest and B the smallest ring link
  (the ring moves in lock-step, so the slowest link bounds every step);
- parameter server (Li et al., OSDI 2014), p workers push gradients to and pull weights from
  S server shards: all 2pM bytes pass the servers' links (incast),
  ``T = 2α + max(2pM / (S·B_server), 2M/B_worker)``;
- gossip (Lian et al., NeurIPS 2017): peer i sends its (compressed) message to each of its
  d neighbours in turn, ``T_i = Σ_{j ∈ N(i)} (α_ij + M/B_ij)`` = d·(α + M/B) on a uniform network.

A link's α and B may include the real software stack's own cost per message (HTTP, msgpack,
signing, averaging: ``gossipnet sim calibrate`` measures it): ``Links.stack_latency`` σ and
``Links.stack_bandwidth`` S add in series, ``α_ij + σ`` and ``1/(1/B_ij + 1/S)``, for every
point-to-point message (gossip, the ring); unset, a link is the wire alone, as before.

Synchronous algorithms end a round when its critical path ends (the slowest peer's compute
plus the communication); asynchronous ones run as a discrete-event simulation (``heapq``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

COMPUTE_DISTRIBUTIONS = ("constant", "exponential", "lognormal", "uniform")


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
    return float(value)


def _non_negative(name: str, value: float) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
    return float(value)


def _per_peer(name: str, value: float | Sequence[float], n: int, check: str) -> np.ndarray:
    array = (
        np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()
        if np.ndim(value) == 0
        else np.asarray(value, dtype=np.float64)
    )
    if array.shape != (n,):
        raise ValueError(f"{name}: needs one value per peer ({n}), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name}: values must be finite")
    if check == "positive" and not np.all(array > 0):
        raise ValueError(f"{name}: values must be > 0, got min {array.min()}")
    if check == "non-negative" and not np.all(array >= 0):
        raise ValueError(f"{name}: values must be >= 0, got min {array.min()}")
    return array


@dataclass(frozen=True)
class Links:
    """Latency α (seconds) and bandwidth B (bytes/second) of every link i -> j.

    Each peer has a network interface with its own latency and bandwidth (heterogeneous
    allowed); a link costs the worse of its two ends, ``α_ij = max(α_i, α_j)`` and
    ``B_ij = min(B_i, B_j)``, unless ``overrides[(i, j)] = (α, B)`` says otherwise. The
    software stack's per-message time ``stack_latency`` σ (seconds) and throughput
    ``stack_bandwidth`` S (bytes/second) add in series to every link:
    ``α_ij + σ`` and ``1/(1/B_ij + 1/S)`` (defaults 0 and ∞: the wire alone).
    """

    latency: np.ndarray
    bandwidth: np.ndarray
    overrides: Mapping[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    stack_latency: float = 0.0
    stack_bandwidth: float = math.inf

    @classmethod
    def uniform(
        cls,
        n: int,
        latency: float | Sequence[float] = 1e-4,
        bandwidth: float | Sequence[float] = 1.25e9,
        overrides: Mapping[tuple[int, int], tuple[float, float]] | None = None,
        *,
        stack_latency: float = 0.0,
        stack_bandwidth: float | None = None,
    ) -> Links:
        """Per-peer values (a scalar is the same for all); defaults 100 µs and 10 Gb/s; no
        stack cost unless ``stack_latency`` / ``stack_bandwidth`` are given."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n: number of peers must be an integer >= 1, got {n!r}")
        checked: dict[tuple[int, int], tuple[float, float]] = {}
        for (i, j), (alpha, beta) in (overrides or {}).items():
            if not (0 <= i < n and 0 <= j < n):
                raise ValueError(f"overrides: link ({i}, {j}) is outside peers 0..{n - 1}")
            checked[(i, j)] = (
                _non_negative(f"overrides[({i}, {j})] latency", alpha),
                _positive(f"overrides[({i}, {j})] bandwidth", beta),
            )
        return cls(
            _per_peer("latency", latency, n, "non-negative"),
            _per_peer("bandwidth", bandwidth, n, "positive"),
            checked,
            _non_negative("stack_latency", stack_latency),
            math.inf if stack_bandwidth is None else _positive("stack_bandwidth", stack_bandwidth),
        )

    @property
    def n(self) -> int:
        return int(self.latency.shape[0])

    def link(self, source: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Latency and bandwidth of links ``source[e] -> target[e]`` (arrays of any shape)."""
        source, target = np.asarray(source), np.asarray(target)
        alpha = np.maximum(self.latency[source], self.latency[target])
        beta = np.minimum(self.bandwidth[source], self.bandwidth[target])
        if self.overrides:
            alpha, beta = alpha.copy(), beta.copy()
            for (i, j), (a, b) in self.overrides.items():
                hit = (source == i) & (target == j)
                alpha[hit], beta[hit] = a, b
        if self.stack_latency or math.isfinite(self.stack_bandwidth):
            alpha = alpha + self.stack_latency
            beta = 1.0 / (1.0 / beta + 1.0 / self.stack_bandwidth)
        return alpha, beta

    def transfer_time(self, source: np.ndarray, target: np.ndarray, size: float) -> np.ndarray:
        """``α_ij + M/B_ij`` seconds to move ``size`` bytes over each link."""
        alpha, beta = self.link(source, target)
        return alpha + size / beta


@dataclass(frozen=True)
class ComputeModel:
    """How long one local step (forward, backward, update) takes on each peer.

    ``t_i = base_i · slowdown_i · ξ`` with ξ drawn per step from ``distribution``
    (``constant``: ξ = 1; ``exponential``: mean 1; ``lognormal``: median 1, σ = ``spread``;
    ``uniform``: ξ ∈ [1 − spread, 1 + spread]). ``stragglers = {peer: k}`` makes a peer k times
    slower. Step t of peer i is reproducible on its own: the generator is seeded by (seed, t).
    """

    n: int
    step_time: float | Sequence[float] = 0.01
    distribution: str = "constant"
    spread: float = 0.0
    stragglers: Mapping[int, float] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n: number of peers must be an integer >= 1, got {self.n!r}")
        _per_peer("step_time", self.step_time, self.n, "positive")
        if self.distribution not in COMPUTE_DISTRIBUTIONS:
            raise ValueError(
                f"distribution: got {self.distribution!r}; "
                f"allowed: {', '.join(COMPUTE_DISTRIBUTIONS)}"
            )
        _non_negative("spread", self.spread)
        if self.distribution == "uniform" and self.spread >= 1:
            raise ValueError(f"spread: must be in [0, 1) for uniform, got {self.spread}")
        for peer, factor in self.stragglers.items():
            if not (isinstance(peer, int) and 0 <= peer < self.n):
                raise ValueError(f"stragglers: peer {peer!r} is outside 0..{self.n - 1}")
            _positive(f"stragglers[{peer}]", factor)

    @property
    def mean(self) -> np.ndarray:
        """Expected step time per peer, ``[n]`` (ξ has mean 1 except lognormal: e^{σ²/2})."""
        base = _per_peer("step_time", self.step_time, self.n, "positive").copy()
        for peer, factor in self.stragglers.items():
            base[peer] *= factor
        if self.distribution == "lognormal":
            base *= math.exp(self.spread**2 / 2)
        return base

    def sample(self, step: int, peers: np.ndarray | None = None) -> np.ndarray:
        """Step times ``[n]`` (or for ``peers``) of local step number ``step``."""
        base = self.mean
        if self.distribution == "lognormal":
            base = base / math.exp(self.spread**2 / 2)
        rng = np.random.default_rng((self.seed, step))
        if self.distribution == "constant":
            noise = np.ones(self.n)
        elif self.distribution == "exponential":
            noise = rng.exponential(1.0, self.n)
        elif self.distribution == "lognormal":
            noise = rng.lognormal(0.0, self.spread, self.n)
        else:
            noise = rng.uniform(1 - self.spread, 1 + self.spread, self.n)
        times = base * noise
        return times if peers is None else times[peers]


@dataclass(frozen=True)
class Crash:
    """Peer ``peer`` is down from ``at`` (simulated seconds) until ``rejoin`` (None: forever)."""

    peer: int
    at: float
    rejoin: float | None = None


@dataclass(frozen=True)
class Failures:
    """Message loss (each message dropped independently with probability ``message_loss``)
    and peer crashes with optional rejoin."""

    n: int
    message_loss: float = 0.0
    crashes: tuple[Crash, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.message_loss < 1:
            raise ValueError(f"message_loss: must be in [0, 1), got {self.message_loss}")
        for crash in self.crashes:
            if not 0 <= crash.peer < self.n:
                raise ValueError(f"crashes: peer {crash.peer} is outside 0..{self.n - 1}")
            _non_negative("crashes.at", crash.at)
            if crash.rejoin is not None and crash.rejoin <= crash.at:
                raise ValueError(
                    f"crashes.rejoin: must be after at={crash.at} for peer {crash.peer}, "
                    f"got {crash.rejoin}"
                )

    def alive(self, time: float) -> np.ndarray:
        """``[n]`` bool: which peers are up at simulated ``time``."""
        up = np.ones(self.n, dtype=bool)
        for crash in self.crashes:
            if crash.at <= time and (crash.rejoin is None or time < crash.rejoin):
                up[crash.peer] = False
        return up

    def delivered(self, round_index: int, shape: tuple[int, ...]) -> np.ndarray:
        """Bool array of ``shape``: which messages of round ``round_index`` arrive."""
        if self.message_loss == 0:
            return np.ones(shape, dtype=bool)
        rng = np.random.default_rng((self.seed, round_index, 1))
        return rng.random(shape) >= self.message_loss


def ring_allreduce_time(links: Links, size: float, peers: np.ndarray | None = None) -> float:
    """``2(p−1)·α + 2(p−1)/p · M/B`` over the ring ``peers`` (default 0..n−1), α the largest
    and B the smallest latency and bandwidth on the ring."""
    order = np.arange(links.n) if peers is None else np.asarray(peers)
    p = int(order.shape[0])
    if p <= 1:
        return 0.0
    alpha, beta = links.link(order, np.roll(order, -1))
    return 2 * (p - 1) * float(alpha.max()) + 2 * (p - 1) / p * size / float(beta.min())


def parameter_server_time(
    links: Links,
    size: float,
    *,
    server_bandwidth: float,
    server_latency: float = 0.0,
    shards: int = 1,
    workers: np.ndarray | None = None,
) -> float:
    """``2α + max(2pM / (S·B_server), 2M/B_worker)``: every worker pushes M bytes and pulls
    M bytes; the S server shards share the incast of all 2pM bytes."""
    if not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards: must be an integer >= 1, got {shards!r}")
    _positive("server_bandwidth", server_bandwidth)
    group = np.arange(links.n) if workers is None else np.asarray(workers)
    p = int(group.shape[0])
    if p == 0:
        return 0.0
    alpha = max(float(links.latency[group].max()), server_latency)
    incast = 2 * p * size / (shards * server_bandwidth)
    worker_link = 2 * size / float(links.bandwidth[group].min())
    return 2 * alpha + max(incast, worker_link)


def synchronous_round_time(compute: np.ndarray, communication: float | np.ndarray) -> float:
    """The critical path of a synchronous round: ``max_i (compute_i + comm_i)`` for per-peer
    communication, ``max_i compute_i + comm`` for a collective (all-reduce, server)."""
    compute = np.asarray(compute, dtype=np.float64)
    if compute.size == 0:
        return 0.0
    if np.ndim(communication) == 0:
        return float(compute.max()) + float(communication)
    return float((compute + np.asarray(communication)).max())


@dataclass(frozen=True, order=True)
class Event:
    """One finished local step of ``peer`` at simulated ``time``; ``partner`` is the neighbour
    it then exchanged with (−1 if none) and ``step`` its local step count."""

    time: float
    peer: int
    step: int
    partner: int


def asynchronous_gossip_events(
    compute: ComputeModel,
    links: Links,
    index: np.ndarray,
    mask: np.ndarray,
    size: float,
    *,
    total_steps: int,
    failures: Failures | None = None,
    seed: int = 0,
) -> Iterator[Event]:
    """Discrete-event simulation of asynchronous pairwise gossip (AD-PSGD, Lian et al., ICML
    2018): each peer loops *compute a step -> exchange with one random neighbour*, never
    waiting for anybody else. Events come out in time order until ``total_steps`` steps.

    A peer's loop time is ``t_compute + 2(α_ij + M/B_ij)`` (send its model, get the
    neighbour's back). A crashed peer makes no steps until it rejoins; a neighbour that is
    down at exchange time is skipped (the step still counts).
    """
    if total_steps < 0:
        raise ValueError(f"total_steps: must be >= 0, got {total_steps}")
    n = compute.n
    rng = np.random.default_rng((seed, 2))
    index, mask = np.asarray(index), np.asarray(mask, dtype=bool)
    # per peer, its candidates and the round trip to each, computed once (the same
    # elementwise arithmetic as one link at a time): an event costs O(1), not O(n)
    rows = np.broadcast_to(np.arange(n)[:, None], index.shape)
    round_trip = 2 * links.transfer_time(rows, index, size)
    slots = [np.flatnonzero(mask[i]) for i in range(n)]
    candidates = [index[i][slots[i]].tolist() for i in range(n)]
    trips = [round_trip[i][slots[i]].tolist() for i in range(n)]
    crashes = failures is not None and bool(failures.crashes)
    step_times = _StepTimes(compute)
    first = step_times.get(0)
    queue: list[tuple[float, int, int]] = [(float(first[i]), i, 0) for i in range(n)]
    heapq.heapify(queue)
    emitted = 0
    while emitted < total_steps and queue:
        time, peer, step = heapq.heappop(queue)
        if crashes and failures is not None and not failures.alive(time)[peer]:
            rejoin = [c.rejoin for c in failures.crashes if c.peer == peer and c.rejoin is not None]
            later = [r for r in rejoin if r > time]
            if later:
                heapq.heappush(queue, (min(later), peer, step))
            continue
        choices = candidates[peer]
        partner = -1
        exchange = 0.0
        if choices:
            slot = int(rng.integers(len(choices)))
            candidate = choices[slot]
            if not crashes or failures is None or failures.alive(time)[candidate]:
                partner = candidate
                exchange = trips[peer][slot]
        yield Event(time, peer, step, partner)
        emitted += 1
        next_compute = float(step_times.get(step + 1)[peer])
        heapq.heappush(queue, (time + exchange + next_compute, peer, step + 1))


class _StepTimes:
    """``compute.sample(step)`` for all peers, kept for the last few steps asked for: the
    peers of an asynchronous run are at nearby steps, and one draw of ``[n]`` per step
    replaces one per event (the values are the same: step t's draw is seeded by (seed, t))."""

    def __init__(self, compute: ComputeModel, keep: int = 64) -> None:
        self.compute = compute
        self.keep = keep
        self.cache: dict[int, np.ndarray] = {}

    def get(self, step: int) -> np.ndarray:
        times = self.cache.get(step)
        if times is None:
            times = self.compute.sample(step)
            self.cache[step] = times
            if len(self.cache) > self.keep:
                del self.cache[min(self.cache)]
        return times
