"""The membership protocol of a peer: joining at start, announcing, refreshing views.

:class:`~peer.node.membership.Membership` is the view (who is alive, suspected, evicted);
:class:`MembershipProtocol` is how a peer fills it over the network:

* at start, ``POST /v1/join`` to the first of ``PeerConfig.join`` (and the members a resumed
  checkpoint remembered) that answers, retrying unreachable addresses with exponential
  backoff until ``join_timeout_s``, so peers started in any order find each other; the
  joined peer's model is copied (``GET /v1/state``) unless the peer resumed or
  ``fetch_state`` is off;
* announcing: joining every member the view named, so each knows us;
* refreshing: every :data:`VIEW_REFRESH_ROUNDS` rounds (and while waiting for members),
  pulling a random neighbour's view, and with a known peer list (``--topology --peers``)
  joining the listed peers that are not members yet;
* leaving: a peer that stops cleanly says goodbye to its neighbours (``POST /v1/leave``),
  which mark it *left*, not failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterable, Sequence

from peer.node.context import PeerContext
from peer.node.membership import Member
from peer.protocol.codecs import DenseCodec
from peer.protocol.errors import ProtocolError
from peer.protocol.threads import in_thread
from peer.protocol.wire import Envelope, check_sender
from peer.transport.client import PeerUnavailable, RemoteRefused

logger = logging.getLogger(__name__)

VIEW_REFRESH_ROUNDS = 10
"""Every this many rounds a peer pulls a random neighbour's membership view."""
JOIN_RETRY_FIRST_S = 0.25
"""The first wait before a join is retried; each later wait doubles, up to
:data:`JOIN_RETRY_MAX_S`, and is jittered by a factor in [0.5, 1.5)."""
JOIN_RETRY_MAX_S = 5.0
GOODBYE_TIMEOUT_S = 2.0
"""The longest a stopping peer spends saying goodbye to all its neighbours together."""


class JoinError(ConnectionError):
    """No join address answered: each was refused, or stayed unreachable until the timeout.

    Attributes:
        addresses: the addresses tried, in order.
        reasons: the last error of each address.
        unreachable: those that never answered (retried until ``timeout_s``); the others
            refused the join.
        timeout_s: how long unreachable addresses were retried.
    """

    def __init__(
        self,
        peer_id: str,
        addresses: Sequence[str],
        reasons: dict[str, str],
        *,
        unreachable: Sequence[str],
        timeout_s: float,
    ) -> None:
        self.addresses = tuple(addresses)
        self.reasons = dict(reasons)
        self.unreachable = tuple(unreachable)
        self.timeout_s = timeout_s
        retried = (
            f" (unreachable for {timeout_s:g} s of retries)" if unreachable and timeout_s else ""
        )
        super().__init__(
            f"peer {peer_id} could not join via any of: "
            + "; ".join(reasons.get(a, f"{a}: not tried") for a in self.addresses)
            + retried
        )


class MembershipProtocol:
    """Joins, announcements and view refreshes of one peer, over its shared parts ``ctx``
    (its client, membership view, address, topology and random generator)."""

    def __init__(self, ctx: PeerContext) -> None:
        self.ctx = ctx

    async def join_at_start(self, remembered: Sequence[str], *, resumed: bool) -> None:
        """Join ``config.join`` (retried until ``join_timeout_s``), then, or else, the
        ``remembered`` member addresses of a resumed checkpoint; the joined peer's model is
        copied unless ``resumed`` (or ``fetch_state`` is off).

        Without ``config.join`` the remembered members are tried once: a restarted
        bootstrap peer whose swarm is gone starts alone (the others will join it). With a
        known peer list (``--topology --peers``) every join is tried once: ranks not up yet
        join us when they start.

        Raises:
            JoinError: ``config.join`` was given, without a peer list, and none answered.
        """
        config = self.ctx.config
        others = [a for a in remembered if a not in config.join and a != self.ctx.address]
        if not config.join and not others:
            return
        listed = self.ctx.topology is not None
        timeout_s = 0.0 if listed or not config.join else config.join_timeout_s
        try:
            await self.join([*config.join, *others], timeout_s=timeout_s, fetch=not resumed)
        except JoinError as error:
            if config.join and not listed:
                raise
            why = "the other ranks will join" if listed else "they will find us when they return"
            logger.warning("%s; starting alone, %s", error, why)

    async def join(
        self, addresses: Sequence[str], *, timeout_s: float = 0.0, fetch: bool = True
    ) -> None:
        """Join the swarm via the first of ``addresses`` that answers (copying its model if
        ``fetch`` and ``PeerConfig.fetch_state``), then announce ourselves to every member
        its view names.

        Unreachable addresses (refused connections, timeouts, 5xx) are retried, all of
        them each pass, with exponential backoff (:data:`JOIN_RETRY_FIRST_S`, doubling up
        to :data:`JOIN_RETRY_MAX_S`, jittered) until ``timeout_s`` has passed; an address
        that refuses the join (4xx: a wrong secret, a taken id) is not retried.

        Raises:
            JoinError: no address answered.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay = JOIN_RETRY_FIRST_S
        retrying = list(dict.fromkeys(addresses))
        reasons: dict[str, str] = {}
        while True:
            for address in list(retrying):
                try:
                    added = await self._join_one(address, fetch=fetch)
                except PeerUnavailable as error:
                    reasons[address] = str(error)
                    continue
                except (RemoteRefused, ProtocolError) as error:
                    reasons[address] = str(error)
                    retrying.remove(address)
                    continue
                await self._announce(added)
                if address in reasons:
                    logger.info("peer %s joined via %s", self.ctx.peer_id, address)
                return
            left = deadline - loop.time()
            if not retrying or left <= 0:
                raise JoinError(
                    self.ctx.peer_id,
                    list(dict.fromkeys(addresses)),
                    reasons,
                    unreachable=retrying,
                    timeout_s=timeout_s,
                )
            if delay == JOIN_RETRY_FIRST_S:
                logger.warning(
                    "peer %s: no answer yet from %s; retrying for up to %g s",
                    self.ctx.peer_id,
                    ", ".join(retrying),
                    timeout_s,
                )
            await asyncio.sleep(min(left, delay * random.uniform(0.5, 1.5)))
            delay = min(2 * delay, JOIN_RETRY_MAX_S)

    async def _join_one(self, address: str, *, fetch: bool) -> list[str]:
        """``POST /v1/join`` to ``address``: admit it and merge its view (and copy its model
        if ``fetch`` and configured); returns the ids its view added."""
        ctx = self.ctx
        answer = await ctx.started_client().join(address, ctx.peer_id, ctx.address)
        bootstrap = check_sender(answer["id"])
        ctx.membership.observe(bootstrap, address)
        added = ctx.membership.merge(answer["peers"])
        if fetch and ctx.config.fetch_state:
            await self._fetch_state(address, receiver=bootstrap)
        return added

    async def _announce(self, added: Iterable[str]) -> None:
        """Join each newly learned member too, so it knows us (and merge its view)."""
        ctx = self.ctx
        client = ctx.started_client()
        for peer_id in added:
            member = ctx.membership.get(peer_id)
            if member is not None and member.address is not None:
                with contextlib.suppress(PeerUnavailable, RemoteRefused, ProtocolError):
                    answer = await client.join(
                        member.address, ctx.peer_id, ctx.address, receiver=peer_id
                    )
                    ctx.membership.merge(answer["peers"], source=f"view of {peer_id}")

    async def _fetch_state(self, address: str, *, receiver: str) -> None:
        """Adopt the model ``address`` serves (``GET /v1/state``, uncompressed) and its
        round, if later than ours; decoded and loaded under the model lock in a worker
        thread."""
        envelope = await self.ctx.started_client().state(
            address, codecs={"none"}, receiver=receiver
        )
        await in_thread(self._load_locked, envelope)
        self.ctx.round = max(self.ctx.round, envelope.round)

    def _load_locked(self, envelope: Envelope) -> None:
        vector = DenseCodec().decode(envelope.payload, self.ctx.spec)
        with self.ctx.lock:
            self.ctx.flat.load_(vector)

    async def wait_for_members(self, count: int, *, timeout_s: float = 60.0) -> bool:
        """Wait until ``count`` other members are alive (pulling views meanwhile).

        For swarms started together (``gossipnet launch``): nobody trains alone
        before the others have joined. Returns False (and the peer goes on) if
        ``timeout_s`` passes first.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be an integer >= 0, got {count!r}")
        membership = self.ctx.membership
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(membership.members("alive")) < count:
            if loop.time() >= deadline:
                logger.warning(
                    "peer %s: %d of %d members after %.0f s; going on",
                    self.ctx.peer_id,
                    len(membership.members("alive")),
                    count,
                    timeout_s,
                )
                return False
            await self.refresh_view()
            await asyncio.sleep(0.1)
        return True

    async def say_goodbye(self) -> int:
        """Tell every neighbour we can call that we leave (``POST /v1/leave``, all at once,
        at most :data:`GOODBYE_TIMEOUT_S` in all), so each marks us *left* rather than
        counting failed calls to us until it evicts us. A neighbour that does not answer in
        time is not waited for (it will find out as before). Returns how many answered."""
        ctx = self.ctx
        client = ctx.client
        if client is None:
            return 0
        neighbours = ctx.membership.neighbours()

        async def goodbye(member: Member) -> bool:
            assert member.address is not None
            try:
                await client.leave(member.address, ctx.peer_id, receiver=member.id)
            except (PeerUnavailable, RemoteRefused, ProtocolError) as error:
                logger.info("peer %s: goodbye to %s failed (%s)", ctx.peer_id, member.id, error)
                return False
            return True

        try:
            async with asyncio.timeout(GOODBYE_TIMEOUT_S):
                said = await asyncio.gather(*(goodbye(m) for m in neighbours))
        except TimeoutError:
            logger.info("peer %s: not every neighbour answered its goodbye", ctx.peer_id)
            return 0
        return sum(said)

    async def _join_listed(self) -> None:
        """With a known peer list (``--topology --peers``), join each listed address that is
        not a member yet: ranks started in any order, or restarted, find each other."""
        ctx = self.ctx
        if ctx.topology is None:
            return
        known = {m.address for m in ctx.membership.members()} | {ctx.address}
        missing = [a for a in ctx.config.peer_list if a not in known]
        client = ctx.started_client()

        async def join(address: str) -> None:
            with contextlib.suppress(PeerUnavailable, RemoteRefused, ProtocolError):
                answer = await client.join(address, ctx.peer_id, ctx.address)
                ctx.membership.observe(check_sender(answer["id"]), address)
                ctx.membership.merge(answer["peers"])

        await asyncio.gather(*(join(address) for address in missing))

    async def refresh_view(self) -> None:
        """Pull one random neighbour's membership view and merge it (and, with a known peer
        list, join the listed peers that are not members yet)."""
        await self._join_listed()
        ctx = self.ctx
        neighbours = ctx.membership.neighbours()
        if not neighbours:
            return
        member = ctx.rng.choice(neighbours)
        assert member.address is not None
        try:
            view = await ctx.started_client().peers(member.address, receiver=member.id)
            ctx.membership.merge(view["peers"], source=f"view of {member.id}")
        except (PeerUnavailable, RemoteRefused, ProtocolError) as error:
            ctx.failed(member, error)
