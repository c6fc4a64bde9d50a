"""``PeerConfig``: every knob of a networked peer, validated at construction.

Errors name the field and the allowed values. The CLI maps its flags 1:1 onto
these fields (``--round-deadline-s`` -> ``round_deadline_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from peer.codecs import DENSE_CODECS
from peer.membership import check_address
from peer.wire import SENDER_ID_PATTERN

Mode = Literal["async", "sync"]
MODES: tuple[Mode, ...] = ("async", "sync")
ORDERS = ("combine-then-adapt", "adapt-then-combine")


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
        fetch_state: when joining, start from a live peer's model (``GET /v1/state``).

    Algorithm:
        mode: ``"async"`` (AD-PSGD: average with ``fanout`` random neighbours, one
            pair at a time, Lian et al. ICML 2018) or ``"sync"`` (D-PSGD rounds: mix
            with every neighbour, those missing the deadline masked out, Lian et al.
            NeurIPS 2017).
        order: ``"combine-then-adapt"`` or ``"adapt-then-combine"`` (gossip.RoundPlan).
        local_steps: optimizer steps per gossip round (>= 1).
        aggregator: a ``consensus.build`` spec (``mean``, ``trimmed-mean:b=1``, ...).
        codec: ``none``, ``fp16``, ``bf16`` or ``qsgd[:bits=B]`` (dense codecs only).
        fanout: async mode: neighbours averaged with per round.
        round_deadline_s: sync mode: how long a round waits for neighbours.
        seed: seeds neighbour choice (with the peer id) and data order.

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
    """

    peer_id: str
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str | None = None
    client_only: bool = False
    join: tuple[str, ...] = ()
    fetch_state: bool = True
    mode: Mode = "async"
    order: str = "combine-then-adapt"
    local_steps: int = 1
    aggregator: str = "mean"
    codec: str = "none"
    fanout: int = 1
    round_deadline_s: float = 5.0
    seed: int = 0
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
        if not isinstance(self.join, tuple):
            raise ValueError(f"PeerConfig.join must be a tuple of HOST:PORT, got {self.join!r}")
        for address in self.join:
            check_address(address, field="PeerConfig.join entry")
        if self.mode not in MODES:
            raise ValueError(f"PeerConfig.mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.order not in ORDERS:
            raise ValueError(f"PeerConfig.order must be one of {list(ORDERS)}, got {self.order!r}")
        _int("local_steps", self.local_steps, 1)
        if not isinstance(self.codec, str) or self.codec.partition(":")[0] not in DENSE_CODECS:
            raise ValueError(
                f"PeerConfig.codec must be one of {list(DENSE_CODECS)}, got {self.codec!r}"
            )
        if not isinstance(self.aggregator, str) or not self.aggregator:
            raise ValueError(
                f"PeerConfig.aggregator must be a consensus spec string, got {self.aggregator!r}"
            )
        _int("fanout", self.fanout, 1)
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
        if self.client_only and self.join == ():
            raise ValueError("PeerConfig.join must name at least one peer when client_only is set")
