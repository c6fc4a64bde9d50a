"""What the server serves and keeps: the :class:`Service` it calls, the metrics it records,
the state of one app's admission, and the request keys its layers share."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from aiohttp import web

from peer.protocol.codecs import Codec
from peer.protocol.signatures import RequestVerifier
from peer.protocol.wire import Envelope, ModelSpec
from peer.transport.admission import (
    DEFAULT_BODY_TIMEOUT_S,
    ByteBudget,
    ServerLimits,
    ServingShare,
    Slots,
)

__all__ = [
    "ANSWERED",
    "BODY_DEADLINE_S",
    "DIRECT_READ",
    "OPEN_PATHS",
    "SERVER_STATE",
    "ServerMetrics",
    "ServerState",
    "Service",
    "server_log",
]

server_log = logging.getLogger("peer.transport.server")
"""The server's log, whichever of its modules writes (one line per refusal)."""

OPEN_PATHS = frozenset({"/v1/status", "/metrics"})
"""Read-only endpoints that carry no model and answer without a signature (not wrapped)."""
BODY_DEADLINE_S = DEFAULT_BODY_TIMEOUT_S
"""Default for the time a request body may take to arrive (``Service.body_timeout_s``)."""


class _Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class _Histogram(Protocol):
    def observe(self, amount: float) -> None: ...


class ServerMetrics(Protocol):
    """The counters the server records (``peer.node.metrics.PeerMetrics`` has them): label
    functions, as prometheus-client's ``Counter(...).labels`` and ``Histogram(...).labels``
    (``bytes(direction=)``, ``exchanges(role=, outcome=)``, ``errors(code=)``,
    ``exchange_phase_seconds(role=, phase=)``)."""

    @property
    def bytes(self) -> Callable[..., _Counter]: ...

    @property
    def exchanges(self) -> Callable[..., _Counter]: ...

    @property
    def errors(self) -> Callable[..., _Counter]: ...

    @property
    def exchange_phase_seconds(self) -> Callable[..., _Histogram]: ...


class Service(Protocol):
    """What the server needs from a peer (``peer.node.handlers.ServerHandlers`` implements
    it; ``peer.node.peer.Peer`` too, by delegation). Every member is read; a limit that is
    ``None`` takes the server's default (:meth:`peer.transport.admission.ServerLimits.of`).
    """

    peer_id: str
    spec: ModelSpec
    message_spec: ModelSpec
    max_body_bytes: int
    max_concurrent_exchanges: int
    codecs: dict[str, Codec]
    verifier: RequestVerifier | None
    secret: bytes | None

    @property
    def body_timeout_s(self) -> float | None:
        """How long a request body may take to arrive."""
        ...

    @property
    def max_connections(self) -> int | None:
        """Connections served at once."""
        ...

    @property
    def max_unauthenticated_bytes(self) -> int | None:
        """Bytes read before their signature can be checked, all requests together."""
        ...

    @property
    def idle_timeout_s(self) -> float | None:
        """How long an idle or half-sent head may hold its connection."""
        ...

    @property
    def retains_messages(self) -> bool:
        """Received messages outlive their request (no reused receive buffers)."""
        ...

    @property
    def pin_buffers(self) -> bool:
        """Receive buffers are page-locked (a peer training on a GPU)."""
        ...

    @property
    def serving_share(self) -> ServingShare | None:
        """The share of its time a training peer serves; ``None``: no bound."""
        ...

    @property
    def metrics(self) -> ServerMetrics: ...

    async def on_exchange(self, envelope: Envelope, vector: torch.Tensor) -> Envelope: ...

    def on_join(self, peer_id: str, address: str | None) -> list[dict[str, Any]]: ...

    def on_leave(self, peer_id: str) -> list[dict[str, Any]]: ...

    def peers_view(self) -> list[dict[str, Any]]: ...

    async def state_envelope(self) -> Envelope: ...

    def public_key(self) -> str | None:
        """This peer's X25519 public key for secure sums (64 hex digits), or None."""
        ...

    def status(self) -> dict[str, Any]: ...

    def render_metrics(self) -> bytes: ...


@dataclass
class ServerState:
    """What one app's admission holds right now (``app[SERVER_STATE]``; tests and benches)."""

    limits: ServerLimits
    slots: Slots
    budget: ByteBudget
    direct_reads: bool = False
    """Whether large bodies are read straight from the socket (``peer.transport.socket_reads``)."""


SERVER_STATE = web.AppKey("gossipnet_server_state", ServerState)
ANSWERED = web.RequestKey("gossipnet_answered", str)
"""``request[ANSWERED]``: how an envelope answer ended when it did not reach the caller whole
(``unanswered``: not taken in time or the connection broke; ``failed``: the answer's worker
failed), for the callee's ``gossipnet_exchanges_total`` outcome; absent when it was written."""
DIRECT_READ = web.RequestKey("gossipnet_direct_read", bool)
"""``request[DIRECT_READ]`` is true while a request's body read straight from its socket
(``peer.transport.receive``) left aiohttp's parser of the connection out of step: the answer then
closes the connection (``Connection: close``). A body read whole on a connection whose
parser could be renewed (``peer.transport.connection``) keeps the connection."""
