"""Membership: who is in the swarm, who answers, who is suspected or evicted.

Each peer keeps a view ``id -> Member``. A member is *alive* while calls to it
succeed; ``suspect_after`` consecutive failures make it *suspected* (still
called, its weight folds into ours when it misses a round), ``evict_after``
make it *evicted* (no longer called, dropped from the views we share). A member
that said goodbye (``POST /v1/leave``, sent by a peer that stops cleanly) has *left*:
like an evicted one it is neither called nor shared, but nothing failed. Any
later sign of life -- a successful call, a request from it, a join -- re-admits it
as alive with a clean failure count; a view we merge never changes the status of a
member we know (another peer's view may be older than a goodbye).

Views are exchanged on ``POST /v1/join`` and ``GET /v1/peers`` and merged with
:meth:`Membership.merge`; a peer never lets a merged view evict or overwrite
itself. A view comes from a neighbour, so it is untrusted input: each entry is
validated on its own (:func:`view_entry`: an ``id`` of the peer-id pattern, an
``address`` of the form ``HOST:PORT`` or null, an optional known ``status``, nothing
else), and a bad entry is skipped and logged, never joined; a view holds at most
:data:`MAX_VIEW_ENTRIES` entries (the client refuses a longer one whole). A
client-only member has ``address=None``: it is known (its values arrive in its
requests) but never called.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from peer.protocol.errors import MalformedBody, ProtocolError
from peer.protocol.wire import check_sender, describe

logger = logging.getLogger(__name__)

Status = Literal["alive", "suspected", "evicted", "left"]
STATUSES: tuple[Status, ...] = ("alive", "suspected", "evicted", "left")
_ENTRY_KEYS = frozenset({"id", "address", "status"})

_ADDRESS = re.compile(
    r"(?P<host>[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<port>[0-9]{1,5})"
)


def check_address(address: object, *, field: str = "address") -> str:
    """Return ``address`` if it is ``HOST:PORT`` (port 1-65535), else raise ``ValueError``."""
    if not isinstance(address, str) or (match := _ADDRESS.fullmatch(address)) is None:
        raise ValueError(f"{field} must be HOST:PORT (e.g. 127.0.0.1:7000), got {address!r:.80}")
    if not 1 <= int(match["port"]) <= 65535:
        raise ValueError(f"{field} port must be in 1..65535, got {match['port']}")
    return address


def view_entry(entry: object) -> tuple[str, str | None]:
    """``(id, address)`` of one entry of a received view; a typed protocol error otherwise
    (:class:`~peer.protocol.errors.InvalidSender` for the id, :class:`MalformedBody` for the rest).

    An entry is a map with an ``id`` (the peer-id pattern, ``peer.protocol.wire.check_sender``), an
    ``address`` (``HOST:PORT``, :func:`check_address`, or null for a client-only member)
    and a ``status`` (one of :data:`STATUSES`; informational), nothing else: exactly what
    ``Member.to_json`` writes and peer/openapi.yaml's ``Member`` requires.
    """
    if not isinstance(entry, dict):
        raise MalformedBody(f"a view entry must be a map, got {describe(entry)}")
    if set(entry) != _ENTRY_KEYS:
        keys = [describe(key) for key in list(entry)[:8]]
        raise MalformedBody(
            f"a view entry must have exactly the keys id, address, status, got {keys}"
        )
    peer_id = check_sender(entry["id"], field_name="id")
    if entry["status"] not in STATUSES:
        raise MalformedBody(
            f"status of {peer_id} must be one of {list(STATUSES)}, got {describe(entry['status'])}"
        )
    address = entry["address"]
    if address is None:
        return peer_id, None
    try:
        return peer_id, check_address(address, field=f"address of {peer_id}")
    except ValueError:
        raise MalformedBody(
            f"address of {peer_id} must be HOST:PORT or null, got {describe(address)}"
        ) from None


@dataclass
class Member:
    """One peer as we see it."""

    id: str
    address: str | None
    status: Status = "alive"
    failures: int = 0
    last_seen: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "address": self.address, "status": self.status}


class Membership:
    """The local view of the swarm, with failure suspicion and eviction.

    Args:
        self_id: this peer's id (never stored as a member, never evicted).
        self_address: ``HOST:PORT`` this peer listens on, or ``None`` if client-only.
        suspect_after: consecutive failed calls before a member is suspected (>= 1).
        evict_after: consecutive failed calls before it is evicted (>= suspect_after).
        clock: time source for ``last_seen`` (monotonic by default).
    """

    def __init__(
        self,
        self_id: str,
        self_address: str | None,
        *,
        suspect_after: int = 1,
        evict_after: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if suspect_after < 1:
            raise ValueError(f"suspect_after must be >= 1, got {suspect_after}")
        if evict_after < suspect_after:
            raise ValueError(
                f"evict_after must be >= suspect_after ({suspect_after}), got {evict_after}"
            )
        self.self_id = check_sender(self_id)
        self.self_address = None if self_address is None else check_address(self_address)
        self.suspect_after = suspect_after
        self.evict_after = evict_after
        self._clock = clock
        self._members: dict[str, Member] = {}

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    def get(self, peer_id: str) -> Member | None:
        return self._members.get(peer_id)

    def observe(self, peer_id: str, address: str | None = None) -> Member:
        """A sign of life from ``peer_id`` (a request, a success): (re-)admit it as alive."""
        if peer_id == self.self_id:
            raise ValueError(f"peer id {peer_id!r} is this peer's own id")
        member = self._members.get(peer_id)
        if member is None:
            member = self._members[peer_id] = Member(peer_id, address)
        elif address is not None:
            member.address = address
        member.status, member.failures, member.last_seen = "alive", 0, self._clock()
        return member

    def record_success(self, peer_id: str) -> None:
        """A call to ``peer_id`` succeeded."""
        self.observe(peer_id)

    def record_failure(self, peer_id: str) -> Status:
        """A call to ``peer_id`` failed (timeout, refused, 5xx); returns its new status."""
        member = self._members[peer_id]
        member.failures += 1
        if member.failures >= self.evict_after:
            member.status = "evicted"
        elif member.failures >= self.suspect_after:
            member.status = "suspected"
        return member.status

    def mark_left(self, peer_id: str) -> bool:
        """``peer_id`` said goodbye: it has left (not called, not shared, not a failure).
        False (and nothing changes) for a peer we do not know."""
        member = self._members.get(peer_id)
        if member is None:
            return False
        member.status, member.failures, member.last_seen = "left", 0, self._clock()
        return True

    def members(self, *statuses: Status) -> list[Member]:
        """Members with one of ``statuses`` (all if none given), sorted by id."""
        wanted = set(statuses or STATUSES)
        return [m for _, m in sorted(self._members.items()) if m.status in wanted]

    def neighbours(self) -> list[Member]:
        """Members we call: alive or suspected, with an address, sorted by id."""
        return [m for m in self.members("alive", "suspected") if m.address is not None]

    def counts(self) -> dict[Status, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for member in self._members.values():
            counts[member.status] += 1
        return counts

    def view(self) -> list[dict[str, Any]]:
        """What we share: ourselves plus every non-evicted member."""
        me = {"id": self.self_id, "address": self.self_address, "status": "alive"}
        return [me, *(m.to_json() for m in self.members("alive", "suspected"))]

    def merge(self, view: Iterable[object], *, source: str = "a view") -> list[str]:
        """Add the members of a received view we did not know; returns their ids.

        Each entry is validated on its own (:func:`view_entry`); a bad one is skipped (one
        log line per view counts them and gives the first reason), never joined. Known
        members keep their local status (our own calls decide suspicion); evicted ones come
        back only through :meth:`observe`. ``source`` names where the view came from, for
        the log.
        """
        added: list[str] = []
        skipped: list[str] = []
        for index, entry in enumerate(view):
            try:
                peer_id, address = view_entry(entry)
            except ProtocolError as error:
                skipped.append(f"entry {index}: {error.detail}")
                continue
            if peer_id == self.self_id or peer_id in self._members:
                continue
            self._members[peer_id] = Member(peer_id, address, last_seen=self._clock())
            added.append(peer_id)
        if skipped:
            logger.warning(
                "peer %s: skipped %d bad entr%s of %s (%s)",
                self.self_id,
                len(skipped),
                "y" if len(skipped) == 1 else "ies",
                source,
                skipped[0],
            )
        return added
