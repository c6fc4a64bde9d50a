"""Emulated links: a peer's uplink with latency, bandwidth, jitter and loss, over loopback.

The kernel's netem needs root; this emulates a link inside the peer, on the bodies it really
sends. Every envelope body a peer writes (its ``POST /v1/exchange`` and ``GET /v1/state``
requests' bodies as a caller, its answers as a callee: the messages the simulator charges)
goes through the peer's one :class:`EmulatedLink`, its uplink:

* **latency** α (seconds, one way): each message waits α before its first byte is sent;
* **jitter** (seconds): each message's wait is drawn uniformly from ``[α − jitter, α + jitter]``
  (clipped at 0; its mean is α while ``jitter <= α``);
* **bandwidth** B (bytes per second): a token bucket without burst on the bytes actually
  written, shared by every body the peer sends at once; slice k of a message is written once
  its bytes' time has passed, so a body of M bytes is out ``α + M/B`` seconds after it
  started on an idle link (``8M/R + α`` for a rate R in bit/s);
* **message_loss** p: each message is lost with probability p, independently. A lost message
  still takes its time on the link (its bytes left), then never arrives: a lost request
  fails the call as an unreachable neighbour does (``PeerUnavailable``: the callee never saw
  it); a lost answer cuts the connection after the callee handled the request (the caller
  gets nothing; the callee already mixed, as when any answer does not arrive).

Every draw comes from one ``random.Random`` seeded by the peer's seed and id, two draws per
message in the order the peer sends them (same seed, same delays and losses).

The names and units are the simulator's ``[network]`` table's (``sim.config.NetworkConfig``,
``sim.network.Links``): ``latency`` in seconds, ``bandwidth`` in bytes per second,
``message_loss`` a probability; :meth:`LinkSettings.for_peer` reads such a table for one
peer. The simulator charges a message over link i -> j ``α_ij + M/B_ij`` with
``α_ij = max(α_i, α_j)``, ``B_ij = min(B_i, B_j)``; emulated, it costs its sender's uplink,
``α_i + M/B_i``: the same on a swarm whose peers share one setting, and for a slow peer
the same on what it sends (docs/calibration.md says what differs).

Off (no setting given) costs nothing: a peer without shaping has no :class:`EmulatedLink`,
and the body it writes takes the unshaped path (no await, no copy added). Delays are
``asyncio.sleep``: the event loop stays free.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BANDWIDTH_FORMS",
    "DURATION_FORMS",
    "LINK_FIELDS",
    "LOSS_FORMS",
    "EmulatedLink",
    "LinkError",
    "LinkSettings",
    "parse_bandwidth",
    "parse_duration",
    "parse_loss",
]

LINK_FIELDS = ("latency", "bandwidth", "jitter", "message_loss")
"""The settings of an emulated link, named as the simulator's ``[network]`` keys."""

SHAPED_SLICE_BYTES = 1 << 16
"""Bytes written per paced write: the pacing's grain (5 ms at 100 Mbit/s)."""
CATCH_UP_S = 0.005
"""A write that starts within this long after the link's last reservation ended continues
from that reservation: a timer that woke late does not slow the link down."""

DURATION_FORMS = "a number of seconds (0.05) or NUMBER with us, ms or s (50ms, 200us, 1.5s)"
BANDWIDTH_FORMS = (
    "a number of bytes per second (1.25e7) or NUMBER with bit, kbit, Mbit, Gbit (bits per "
    "second: 100Mbit) or B, kB, MB, GB (bytes per second: 12.5MB), optionally /s"
)
LOSS_FORMS = "a probability in [0, 1) (0.01) or a percentage (1%)"

_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z%]*)(?:/s)?\s*$")
_SECONDS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_BYTES_PER_S = {
    "": 1.0,
    "B": 1.0,
    "kB": 1e3,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "Kbit": 1e3 / 8,
    "Mbit": 1e6 / 8,
    "mbit": 1e6 / 8,
    "Gbit": 1e9 / 8,
    "gbit": 1e9 / 8,
}


class LinkError(ValueError):
    """A link setting out of range; ``field`` names it (``str(error)`` starts with it)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _parse(text: str, units: Mapping[str, float], forms: str) -> float:
    match = _NUMBER.match(text)
    if match is None or match[2] not in units:
        raise ValueError(f"got {text!r}; allowed: {forms}")
    value = float(match[1]) * units[match[2]]
    if not math.isfinite(value):
        raise ValueError(f"got {text!r}; allowed: {forms}")
    return value


def parse_duration(text: str) -> float:
    """``"50ms"`` -> 0.05 (seconds); a bare number is seconds."""
    return _parse(text, _SECONDS, DURATION_FORMS)


def parse_bandwidth(text: str) -> float:
    """``"100Mbit"`` -> 1.25e7 (bytes per second, the simulator's unit); a bare number is
    bytes per second."""
    value = _parse(text, _BYTES_PER_S, BANDWIDTH_FORMS)
    if value <= 0:
        raise ValueError(f"got {text!r}, must be > 0; allowed: {BANDWIDTH_FORMS}")
    return value


def parse_loss(text: str) -> float:
    """``"1%"`` -> 0.01; a bare number is a probability."""
    value = _parse(text, {"": 1.0, "%": 0.01}, LOSS_FORMS)
    if not value < 1:
        raise ValueError(f"got {text!r}, must be < 1; allowed: {LOSS_FORMS}")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class LinkSettings:
    """One peer's emulated uplink (see the module docstring), in the simulator's units.

    Args:
        latency: one-way delay per message, seconds (>= 0).
        bandwidth: bytes per second (> 0); ``None``: not limited.
        jitter: each message's delay is uniform in ``latency ± jitter``, clipped at 0.
        message_loss: probability that a message is lost, in [0, 1).
    """

    latency: float = 0.0
    bandwidth: float | None = None
    jitter: float = 0.0
    message_loss: float = 0.0

    def __post_init__(self) -> None:
        for name in ("latency", "jitter"):
            value = getattr(self, name)
            if not (_number(value) and value >= 0):
                raise LinkError(name, f"must be a number of seconds >= 0, got {value!r}")
        if self.bandwidth is not None and not (_number(self.bandwidth) and self.bandwidth > 0):
            raise LinkError(
                "bandwidth", f"must be a number of bytes per second > 0, got {self.bandwidth!r}"
            )
        loss = self.message_loss
        if not (_number(loss) and 0 <= loss < 1):
            raise LinkError("message_loss", f"must be a probability in [0, 1), got {loss!r}")

    @property
    def shaped(self) -> bool:
        """Whether anything is emulated (else the peer sends as it always did)."""
        return bool(self.latency or self.jitter or self.message_loss) or (
            self.bandwidth is not None
        )

    @classmethod
    def for_peer(cls, network: Mapping[str, Any], peer: int) -> LinkSettings:
        """Peer ``peer``'s uplink from a simulator ``[network]`` table: ``latency`` and
        ``bandwidth`` (one value, or one per peer), ``message_loss`` and ``jitter`` as they
        are; keys the table leaves out are not emulated (the other keys are the time
        model's, not the link's: ``step_time``, ``stragglers``...)."""
        values: dict[str, Any] = {}
        for name in LINK_FIELDS:
            if name not in network:
                continue
            value = network[name]
            if isinstance(value, list | tuple):
                if not 0 <= peer < len(value):
                    raise LinkError(name, f"has {len(value)} per-peer values, none for peer {peer}")
                value = value[peer]
            values[name] = value
        return cls(**values)


class EmulatedLink:
    """A peer's uplink: its settings, its seeded draws and its token bucket.

    One object per peer, shared by its client and its server (both send on the uplink).
    :meth:`draw` is called once per message, before it is sent; the body's writer then
    waits the drawn delay and :meth:`pace` s its slices.
    """

    def __init__(self, settings: LinkSettings, *, seed: int | str = 0) -> None:
        self.settings = settings
        self._random = random.Random(seed)
        self._free_at = -math.inf
        """Loop time at which the bytes reserved so far have all been sent."""
        self.sent_bytes = 0
        self.lost_messages = 0
        self.messages = 0

    def draw(self) -> tuple[float, bool]:
        """The next message's ``(delay in seconds, lost)``: two draws, always."""
        s = self.settings
        spread, lost = self._random.random(), self._random.random()
        self.messages += 1
        is_lost = lost < s.message_loss
        self.lost_messages += is_lost
        return max(0.0, s.latency + s.jitter * (2 * spread - 1)), is_lost

    async def pace(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more bytes have had their time on the link."""
        self.sent_bytes += nbytes
        bandwidth = self.settings.bandwidth
        if bandwidth is None:
            return
        now = asyncio.get_running_loop().time()
        start = self._free_at if self._free_at >= now - CATCH_UP_S else now
        self._free_at = start + nbytes / bandwidth
        if self._free_at > now:
            await asyncio.sleep(self._free_at - now)

    async def spend(self, delay: float, nbytes: int) -> None:
        """A lost message's time: its delay, and its bytes on the link (never written)."""
        if delay > 0:
            await asyncio.sleep(delay)
        await self.pace(nbytes)
