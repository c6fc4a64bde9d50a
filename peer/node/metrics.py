"""Per-peer Prometheus metrics (one ``CollectorRegistry`` per peer, never the global one).

Several peers can live in one process (tests, notebooks, the embedding API), so
each owns its registry and ``GET /metrics`` renders only its own.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from peer.node.membership import STATUSES

EXCHANGE_PHASES = (
    ("caller", "round_trip"),
    ("caller", "adopt"),
    ("callee", "receive"),
    ("callee", "check"),
    ("callee", "answer"),
)
"""The ``(role, phase)`` labels of ``gossipnet_exchange_phase_seconds``, in exchange order."""
SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
"""Histogram buckets of the exchange timings (a loopback exchange of a small model to a
slow network's large one)."""


class PeerMetrics:
    """Counters and gauges of one peer, rendered by :meth:`render` as Prometheus text."""

    def __init__(self, peer_id: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"peer": peer_id}
        self.bytes = Counter(
            "gossipnet_bytes",
            "Body bytes exchanged with neighbours (calls served and calls made)",
            ["direction"],
            registry=self.registry,
        ).labels
        self.exchanges = Counter(
            "gossipnet_exchanges",
            "Exchanges by role (caller/callee) and outcome (ok, failed, busy, refused, unanswered)",
            ["role", "outcome"],
            registry=self.registry,
        ).labels
        self.errors = Counter(
            "gossipnet_request_errors",
            "Requests refused, by protocol error code",
            ["code"],
            registry=self.registry,
        ).labels
        self.exchange_seconds = Histogram(
            "gossipnet_exchange_seconds",
            "Wall time of one outgoing exchange (round trip, validation, mixing)",
            registry=self.registry,
            buckets=SECONDS_BUCKETS,
        )
        self.exchange_phase_seconds = Histogram(
            "gossipnet_exchange_phase_seconds",
            "Wall time of each phase of an exchange (POST /v1/exchange) that succeeded, by "
            "role: caller (async mode) 'round_trip' (from the call to the answer's last "
            "byte) and 'adopt' (decoding the answer and mixing it in); callee 'receive' "
            "(admission and the request's body), 'check' (decoding and validating it) and "
            "'answer' (averaging and writing the answer)",
            ["role", "phase"],
            registry=self.registry,
            buckets=SECONDS_BUCKETS,
        ).labels
        self.round = Gauge("gossipnet_round", "Current gossip round", registry=self.registry)
        self.byzantine = Gauge(
            "gossipnet_byzantine",
            "1 if this peer runs a Byzantine attack (PeerConfig.byzantine, evaluation only)",
            registry=self.registry,
        )
        self.step = Gauge("gossipnet_step", "Local optimizer steps taken", registry=self.registry)
        self.loss = Gauge("gossipnet_loss", "Last training loss", registry=self.registry)
        self.isolated = Gauge(
            "gossipnet_isolated",
            "1 while the peer had no successful exchange in each of its last rounds "
            "(peer.node.context.HEALTH_WINDOW_ROUNDS): it is training alone; else 0",
            registry=self.registry,
        )
        self.rounds_without_exchange = Gauge(
            "gossipnet_rounds_without_exchange",
            "Consecutive gossip rounds, up to the last, without a successful exchange",
            registry=self.registry,
        )
        self.members = Gauge(
            "gossipnet_members", "Known members by status", ["status"], registry=self.registry
        )
        self.info = Gauge(
            "gossipnet_peer_info",
            "Constant 1, labelled with the peer id",
            ["peer"],
            registry=self.registry,
        )
        self.info.labels(**labels).set(1)
        for status in STATUSES:
            self.members.labels(status=status).set(0)
        for direction in ("in", "out"):
            self.bytes(direction=direction)

    def track_privacy(self, epsilon: Callable[[], float]) -> None:
        """Export ``gossipnet_privacy_epsilon``, read from ``epsilon()`` at each scrape (a
        peer training with DP-SGD, :mod:`peer.node.privacy`)."""
        Gauge(
            "gossipnet_privacy_epsilon",
            "DP-SGD: epsilon at the run's delta spent by the steps taken so far (Opacus' "
            "accountant)",
            registry=self.registry,
        ).set_function(epsilon)

    def bytes_total(self, direction: str) -> int:
        value = self.registry.get_sample_value("gossipnet_bytes_total", {"direction": direction})
        return int(value or 0)

    def phase_totals(self) -> dict[tuple[str, str], tuple[float, int]]:
        """``{(role, phase): (seconds, exchanges)}`` summed over the exchanges observed so far
        (``gossipnet_exchange_phase_seconds``; benches difference two readings)."""
        name = "gossipnet_exchange_phase_seconds"
        out: dict[tuple[str, str], tuple[float, int]] = {}
        for role, phase in EXCHANGE_PHASES:
            labels = {"role": role, "phase": phase}
            total = self.registry.get_sample_value(f"{name}_sum", labels) or 0.0
            count = self.registry.get_sample_value(f"{name}_count", labels) or 0.0
            out[role, phase] = (total, int(count))
        return out

    def render(self) -> bytes:
        """The Prometheus text exposition of this peer's registry."""
        return generate_latest(self.registry)
