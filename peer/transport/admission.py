"""What a peer's server admits before it spends: its bounds and the pools that enforce them.

A peer's server spends three things on a request before it knows whether the request is
worth it: a connection (a socket, aiohttp's parser and read buffer), an exchange slot (a
model-sized receive buffer and the averaging result) and the body bytes it holds while it
reads a body whose signature it cannot check yet (a digest signature covers the whole
body). Each has a bound, and a request beyond one is refused before anything is spent:

* **connections**: at most ``max_connections`` open at once; one more is answered
  ``429 overloaded`` and closed (:mod:`peer.transport.server` checks it when the connection opens).
  An idle connection, and one whose request headers do not arrive, is closed after
  ``idle_timeout_s``.
* **exchange slots** (:class:`Slots`): at most ``max_concurrent_exchanges`` model-sized
  bodies in flight (read, handled, answered); an exchange beyond it is ``409 busy`` before
  its body is read, a ``GET /v1/state`` waits for a slot (up to the body deadline).
* **unauthenticated bytes** (:class:`ByteBudget`): the bodies read before their signature
  can be checked (JSON control bodies always, digest-signed exchanges) hold at most
  ``max_unauthenticated_bytes`` in total; a body that would pass it is refused
  ``429 overloaded`` and its bytes are dropped.

Every body, read or not, has a deadline (``body_timeout_s``: ``408 body_timeout``), and
every slot and byte is given back when its request ends, however it ends (answered,
refused, timed out, disconnected). The defaults are derived from the exchange slots
(:meth:`ServerLimits.of`); docs/protocol.md ("Server limits") states them.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from peer.protocol.errors import Overloaded

MAX_JSON_BYTES = 1 << 20
"""Cap on one JSON control body (``POST /v1/join``), applied while it is read."""
DEFAULT_UNAUTHENTICATED_BYTES = 8 * MAX_JSON_BYTES
"""Default of ``max_unauthenticated_bytes``: eight full-size JSON bodies in flight."""
DEFAULT_BODY_TIMEOUT_S = 120.0
"""Default for the time a request body may take to arrive (a peer uses its request timeout)."""
DEFAULT_IDLE_TIMEOUT_S = 30.0
"""An idle connection (or one whose headers are not complete) is closed after this long;
longer than aiohttp clients keep an idle connection (15 s), so they never reuse a dead one."""
MAX_HEADERS = 32
"""Request header fields a request may have (a peer sends 6; aiohttp's default is 128)."""
MAX_FIELD_BYTES = 8190
"""Bytes of one header field or of the request line (aiohttp's default)."""
READ_BUFFER_BYTES = 1 << 16
"""aiohttp's read buffer per connection (it stops reading a socket beyond twice this)."""
CONNECTION_BYTES = 2 * READ_BUFFER_BYTES + (1 << 18) + MAX_HEADERS * MAX_FIELD_BYTES
"""What one open connection may hold at worst, whatever the model: aiohttp's buffered body
bytes (twice its read buffer), one socket read (256 KiB) and a full header section."""


class LimitError(ValueError):
    """A server limit that is not a positive number (names the field and the allowed values)."""


def default_max_connections(max_concurrent_exchanges: int) -> int:
    """``4 C + 32``: every exchange slot busy with a caller waiting behind it on another
    connection, twice over, plus room for joins, views, status reads and the idle
    keep-alive connections of neighbours' clients."""
    return 4 * max_concurrent_exchanges + 32


DEFAULT_LINGER_S = 10.0
"""aiohttp's default lingering time: :attr:`ServerLimits.linger_s`."""


@dataclass(frozen=True)
class ServerLimits:
    """The bounds of one peer's server (see the module docstring).

    Args:
        max_concurrent_exchanges: model-sized requests in flight at once (C).
        max_connections: open connections at once; default :func:`default_max_connections`.
        max_unauthenticated_bytes: body bytes held, in total, by requests whose signature
            is not checked yet.
        body_timeout_s: the deadline of every request body, and of every answer's writing.
        idle_timeout_s: an idle connection, or one whose headers are incomplete, closes.
        linger_s: after refusing a request whose body was not read, how long the rest of it
            is read and dropped before the connection closes (closing on a caller still
            sending resets the connection, and its kernel may drop the refusal unread).
        max_headers, max_field_bytes: aiohttp's header parser bounds.
    """

    max_concurrent_exchanges: int = 8
    max_connections: int = default_max_connections(8)
    max_unauthenticated_bytes: int = DEFAULT_UNAUTHENTICATED_BYTES
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    linger_s: float = DEFAULT_LINGER_S
    max_headers: int = MAX_HEADERS
    max_field_bytes: int = MAX_FIELD_BYTES

    def __post_init__(self) -> None:
        for name in (
            "max_concurrent_exchanges",
            "max_connections",
            "max_unauthenticated_bytes",
            "max_headers",
            "max_field_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LimitError(f"ServerLimits.{name} must be an integer >= 1, got {value!r}")
        for name in ("body_timeout_s", "idle_timeout_s", "linger_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise LimitError(f"ServerLimits.{name} must be a number > 0, got {value!r}")
        if self.max_unauthenticated_bytes < MAX_JSON_BYTES:
            raise LimitError(
                f"ServerLimits.max_unauthenticated_bytes must be >= {MAX_JSON_BYTES} (one "
                f"JSON body), got {self.max_unauthenticated_bytes}"
            )

    @classmethod
    def of(cls, service: Any) -> ServerLimits:
        """The limits a service (``peer.transport.service.Service``) asks for:
        ``max_concurrent_exchanges``, and ``max_connections``, ``max_unauthenticated_bytes``,
        ``body_timeout_s``, ``idle_timeout_s`` (``None``: the default)."""
        slots = service.max_concurrent_exchanges
        chosen = {
            "max_connections": service.max_connections,
            "max_unauthenticated_bytes": service.max_unauthenticated_bytes,
            "body_timeout_s": service.body_timeout_s,
            "idle_timeout_s": service.idle_timeout_s,
        }
        given = {name: value for name, value in chosen.items() if value is not None}
        given.setdefault(
            "max_connections",
            default_max_connections(slots) if isinstance(slots, int) else slots,
        )
        return cls(max_concurrent_exchanges=slots, **given)


def fixed_memory_bytes(limits: ServerLimits) -> int:
    """The server's memory bound that does not scale with the model: every connection's
    buffers (:data:`CONNECTION_BYTES` each) and the unauthenticated byte budget. The
    model-sized part is two copies per exchange slot (docs/protocol.md, "Memory")."""
    return limits.max_connections * CONNECTION_BYTES + limits.max_unauthenticated_bytes


class Slots:
    """At most ``size`` model-sized requests in flight.

    :meth:`take_now` takes a slot or raises at once (an exchange: ``409 busy``, the caller
    tries again later); :meth:`take` queues for one up to a deadline (a newcomer's
    ``GET /v1/state``). A slot given back goes to the longest waiting request first.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self, refuse: Exception) -> None:
        """Take a slot, or raise ``refuse`` if none is free (or others queue for one)."""
        if self.in_use >= self.size or self._waiters:
            raise refuse
        self.in_use += 1

    async def take(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a slot (``TimeoutError`` if none frees in time)."""
        if self.in_use < self.size and not self._waiters:
            self.in_use += 1
            return
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(handed)
        try:
            async with asyncio.timeout(timeout_s):
                await handed
        except BaseException:
            if handed.done() and not handed.cancelled():
                self.give()  # handed over just as the wait ended: pass it on
            else:
                handed.cancel()
                with suppress(ValueError):  # give() may have dropped it already
                    self._waiters.remove(handed)
            raise

    def give(self) -> None:
        """Give a slot back: to the first request still waiting, else to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_use -= 1


class ByteBudget:
    """Body bytes held by requests whose signature is not checked yet, bounded in total.

    Each request reads through an :meth:`account`, charging every chunk as it arrives; a
    chunk that would pass ``capacity`` raises :class:`~peer.protocol.errors.Overloaded` (the request
    is refused and its bytes dropped), and the account's bytes return to the budget when
    the request ends.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self.peak = 0

    @contextmanager
    def account(self) -> Iterator[ByteAccount]:
        account = ByteAccount(self)
        try:
            yield account
        finally:
            self.held -= account.charged
            account.charged = 0


class ByteAccount:
    """One request's share of a :class:`ByteBudget`."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.charged = 0

    def charge(self, count: int) -> None:
        """Hold ``count`` more bytes, or raise :class:`~peer.protocol.errors.Overloaded`."""
        budget = self.budget
        if budget.held + count > budget.capacity:
            raise Overloaded(
                f"this peer holds {budget.held} bytes of unauthenticated request bodies, "
                f"the bound is {budget.capacity}; retry later"
            )
        budget.held += count
        budget.peak = max(budget.peak, budget.held)
        self.charged += count


DEFAULT_SERVING_SHARE = 0.5
"""Default of ``max_serving_share``: while a peer trains, serving takes at most half its time."""
SERVING_WINDOW_S = 2.0
"""The serving share's horizon: it may run ``max_share x`` this many seconds ahead."""


class ServingShare:
    """Keeps a training peer's own training from being starved by neighbours' exchanges.

    While the peer trains (``active()`` is true), serving exchanges may take at most
    ``max_share`` of its time. Kept as a leaky bucket: each exchange served adds its wall
    time (from its body read whole and authenticated to the answer written: time spent on
    bytes not authenticated yet, such as a stalled body, never counts; concurrent exchanges
    add up, so the count is conservative), and the bucket drains at ``max_share`` seconds per second. While it
    holds ``max_share x window_s`` seconds or more, an exchange is refused ``409 busy``
    before its body is read (a caller counts busy as a sign of life and gives its place in
    the round to another neighbour, ``peer.node.pairwise.BUSY_RETRIES``). Over any stretch of
    T seconds of training, serving therefore takes at most ``max_share x (T + window_s)``
    seconds plus the exchanges in flight: training keeps at least ``1 - max_share`` of
    the peer's time, whatever the number of callers.

    A bucket, not a sliding window: a window forgets each exchange all at once
    ``window_s`` after it, so peers whose windows filled together reopen together, take a
    burst, and close again (seen as a whole swarm refusing for several rounds every 2 s);
    the bucket reopens for one exchange as soon as it has drained that much.

    A peer that is not training (no step in the last second, or ``Peer.run`` has taken
    its steps: finished, holding, waiting for peers) serves without this bound.
    ``max_share = 1`` turns it off.
    """

    def __init__(
        self,
        max_share: float,
        active: Any,
        *,
        window_s: float = SERVING_WINDOW_S,
        clock: Any = None,
    ) -> None:
        if isinstance(max_share, bool) or not isinstance(max_share, int | float):
            raise LimitError(f"max_serving_share must be a number in (0, 1], got {max_share!r}")
        if not 0.0 < float(max_share) <= 1.0:
            raise LimitError(f"max_serving_share must be in (0, 1], got {max_share}")
        self.max_share = float(max_share)
        self.window_s = float(window_s)
        self._active = active
        self._clock = clock if clock is not None else time.monotonic
        self._level = 0.0
        """Seconds of serving not yet drained."""
        self._drained_at = float(self._clock())
        self.refused = 0
        """Exchanges refused to keep the share (reported in ``/v1/status``)."""

    def _drain(self, now: float) -> None:
        self._level = max(0.0, self._level - (now - self._drained_at) * self.max_share)
        self._drained_at = now

    def share(self) -> float:
        """The bucket's level over ``window_s``: serving is refused from ``max_share`` on."""
        self._drain(self._clock())
        return self._level / self.window_s

    def admit(self) -> bool:
        """Whether one more exchange may be served now (counts the refusals)."""
        if self.max_share >= 1.0 or not self._active():
            return True
        if self.share() < self.max_share:
            return True
        self.refused += 1
        return False

    def start(self) -> float:
        """The start of an admitted exchange's authenticated work (pass it to :meth:`done`)."""
        return float(self._clock())

    def done(self, started: float) -> None:
        """Count an exchange served from ``started`` until now."""
        now = self._clock()
        self._drain(now)
        self._level += max(0.0, now - started)
