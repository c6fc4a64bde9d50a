"""The synchronous round (``mode="sync"``): publish, exchange, deadline, combine.

D-PSGD rounds (Lian et al., NeurIPS 2017) through the configured rule's ``combine``
(``gossip.DecentralizedSGD.combine`` by default): x_i <- w_ii x_i + sum_j w_ij x_j with
uniform w_ij = 1/(k+1) over the k known members, or with ``PeerConfig.topology`` row i
of the topology's W_t (:mod:`peer.node.topology`). Round t of a peer:

1. hand the rule the messages that came after their round mixed (``late``);
2. publish this round's message (the rule's ``message``: the model, a delta, push-sum's
   ``[x, w]``, CHOCO's increment), encoded once and decoded as receivers will;
3. one round trip per pair: the smaller id calls, the callee stores the caller's
   round-t message and answers with its own once it has published round t; a
   smaller-id neighbour not heard from after a quarter of the deadline is called too;
4. neighbours that miss ``round_deadline_s`` are masked out, so their weight folds into
   the self weight (consensus's mask convention), and the rule combines what arrived.

A message up to ``LATE_ROUNDS`` rounds ahead (a faster neighbour's) is kept for its
round; one up to ``LATE_ROUNDS`` late goes to the rule's ``late`` at the next round's
start (or in ``settle``). A Byzantine peer (``PeerConfig.byzantine``) replaces every
message it sends with ``consensus.byzantine_message``. Tensor work runs in worker
threads (``peer.protocol.threads.in_thread``), never on the event loop: the k received
messages are stacked in the thread that combines them.

A neighbour heard from at a round later than ours will not send ours (it sends each round's
message once, in that round): it is not waited for. Catching up: a peer whose rule drops a
message that missed its round (the model: D-PSGD, local SGD; the fast weights: DiLoCo,
NoLoCo, SparseLoCo) takes up its neighbours' round when it starts; push-sum's mass and
CHOCO's increments must all arrive, so those never skip. Until one of its rounds mixes a
neighbour's message, a round starts at the newest round any neighbour was heard at, the
rounds between skipped (no step, no exchange; its step count and learning rate go on from
its own). So a peer resumed from a checkpoint, or
restarted afresh, rounds behind its swarm (``launch --crashes P@AT+DOWN``) goes on from its
model in the swarm's current round, as the simulator's rejoining peer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

import torch

import consensus
from gossip.algorithms import neighbourhood_fits
from gossip.outer import DiLoCo
from peer.node.context import PeerContext
from peer.node.membership import Member
from peer.node.secure_round import SecureSums
from peer.protocol.errors import ALIVE_REFUSALS, Busy, ProtocolError
from peer.protocol.threads import in_thread
from peer.protocol.wire import Envelope
from peer.transport.admission import ServingShare
from peer.transport.client import PeerUnavailable, RemoteRefused

logger = logging.getLogger(__name__)

LATE_ROUNDS = 4
"""A sync message up to this many rounds late is still handed to the rule (``late``); an
older one is dropped (for CHOCO that leaves a public copy behind: the peer warns)."""


class SyncRound:
    """The sync mode of a :class:`~peer.node.peer.Peer`: one round (:meth:`exchange`), the
    callee's answer (:meth:`answer`), the inbox of neighbours' messages and :meth:`settle`,
    over the peer's shared parts (``ctx``)."""

    retains_messages = True
    """A received message outlives its request (kept until its round's combine): the server
    reads each exchange into a fresh buffer."""
    serving_share: ServingShare | None = None
    """No serving share: a sync round serves each neighbour once per round by design."""

    def __init__(self, ctx: PeerContext) -> None:
        self.ctx = ctx
        self._inbox: dict[str, dict[int, torch.Tensor]] = {}
        """Neighbours' messages by sender and round, until their round mixes."""
        self._heard: dict[str, set[int]] = {}
        """Recent rounds each sender's message came for (a round counts once)."""
        self._delivered: dict[str, int] = {}
        """The newest round of ours each neighbour has."""
        self._awaiting: dict[str, int] = {}
        """Callers waiting for our reply, by their round."""
        self._sent: torch.Tensor | None = None
        """This round's message as receivers decode it."""
        self._published: Envelope | None = None
        """This round's message as sent (the callee's reply)."""
        self._starved = False
        """Whether the last round had too few models for the rule."""
        self._changed: asyncio.Condition | None = None
        """Notified when a message arrives or a round is published (made by :meth:`start`)."""
        self._secure = SecureSums(ctx) if ctx.secure_key is not None else None
        """Secure sums (``--secure-sum``, :mod:`peer.node.secure_round`), or None."""
        self._sealed: dict[str, Envelope] = {}
        """With secure sums: this round's masked message for each partner address."""
        self._newest: dict[str, int] = {}
        """The newest round each sender was heard at (kept or not)."""
        self._catching_up = False
        """Whether a round starts at the newest round heard (:meth:`_catch_up`)."""

    def start(self) -> None:
        """Make the condition rounds and answers wait on, for the running event loop."""
        self._changed = asyncio.Condition()
        self._catching_up = self.ctx.algorithm.message_is_model or isinstance(
            self.ctx.algorithm, DiLoCo
        )

    async def settle(self) -> None:
        """Hand the rule the messages that arrived after this peer's last round (sync mode).

        Call it once the swarm has stopped exchanging and before reading the final model:
        push-sum adds the late mass and CHOCO the late increments (``late`` of the rule),
        so nothing sent is left out; D-PSGD drops them, as it does every round.
        """
        if self._changed is None:
            raise RuntimeError("peer is not started: await peer.start() first")
        async with self._changed:
            overdue = self._take_late(self.ctx.round)
        if overdue:
            await in_thread(self._late_locked, overdue, self.ctx.round)

    # ------------------------------------------------------------------ one round

    async def exchange(self) -> int:
        """Round ``ctx.round`` (while catching up, the newest round heard if later: see the
        module doc): hand over late messages, publish ours, exchange with the
        round's neighbours until all answered or the deadline, and combine what arrived;
        returns how many neighbours' messages it mixed."""
        assert self._changed is not None
        async with self._changed:
            t = self._catch_up()
            overdue = self._take_late(t)
        if overdue:
            await in_thread(self._late_locked, overdue, t)
        payload, sent = await in_thread(self._message_locked)
        sealed: dict[str, Envelope] = {}
        if self._secure is not None:  # one masked message per receiver
            await self._secure.fetch_keys(t)
            sealed = await in_thread(self._secure.seal, t, sent)
        async with self._changed:
            self._published = self.ctx.envelope_of(payload)
            self._sealed = sealed
            self._sent = sent
            self._changed.notify_all()
        expected = self._expected()
        failed: set[str] = set()
        envelope = self._published

        def done(peer_id: str) -> bool:
            return (
                peer_id in failed
                or t in self._inbox.get(peer_id, {})
                or self._newest.get(peer_id, -1) > t  # past round t: it will not send ours
            )

        def complete() -> bool:
            return all(done(j) for j in expected)

        # One round trip per pair: we call neighbours with a larger id (a client-only
        # peer calls everyone) and expect the others to call us. A smaller-id neighbour
        # whose model has not arrived after a quarter of the deadline is called too,
        # so a dead or lagging one is still detected and suspected; one already suspected
        # is called at once (a dead one costs a refused call, not a quarter deadline).
        eager: list[Member] = []
        lazy: list[Member] = []
        for member in self.ctx.neighbours():
            if self._delivered.get(member.id, -1) >= t or self._awaiting.get(member.id, t + 1) <= t:
                continue  # it called us this round: our reply carries (or carried) round t
            if t in self._inbox.get(member.id, {}):
                # it called us ahead of us and got an older round: push it ours now, so no
                # round's message is lost (CHOCO's copies and push-sum's mass need every one)
                eager.append(member)
                continue
            calls = self.ctx.address is None or member.id > self.ctx.peer_id
            (eager if calls or member.status == "suspected" else lazy).append(member)
        tasks = [asyncio.create_task(self._sync_call(m, envelope, failed)) for m in eager]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ctx.config.round_deadline_s
        patience = loop.time() + self.ctx.config.round_deadline_s / 4
        no_one: list[Member] = []
        for until, then_call in ((patience, lazy), (deadline, no_one)):
            async with self._changed:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(complete), max(until - loop.time(), 0)
                    )
            late = [m for m in then_call if not done(m.id) and self._delivered.get(m.id, -1) < t]
            tasks += [asyncio.create_task(self._sync_call(m, envelope, failed)) for m in late]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        present = [j for j in expected if t in self._inbox.get(j, {})]
        mixed, weights = self._mixing_row(expected, t)
        arrived = sum(j in present for j in mixed)
        # too few models for the rule: keep our own state this round, as the simulator
        # freezes such a row; otherwise combine, with no neighbour too (a node the round's
        # matching leaves out still takes its own step, as every simulated row does)
        if self._secure is not None:
            arrivals = {self._address_of(j): self._inbox[j][t] for j in present}
            await in_thread(self._secure.mix, t, arrivals, sent)
        elif self._fits(arrived + 1):
            messages = [self._inbox[j][t] if j in present else sent for j in mixed]
            mask = [j in present for j in mixed]
            self_weight = None if self.ctx.topology is None else self.ctx.topology.self_weight(t)
            await in_thread(self._combine_locked, sent, messages, weights, mask, self_weight)
        for j in present:  # a message that comes after this mix is late (next round's start)
            self._inbox[j].pop(t, None)
        self._catching_up = self._catching_up and not present
        self.ctx.health.record(ok=len(present), failed=len(expected) - len(present))
        return len(present)

    def _catch_up(self) -> int:
        """This round's number: ``ctx.round``, or, while catching up, the newest round a
        neighbour was heard at if later (the peer skips to it; condition held)."""
        newest = max(self._newest.values(), default=-1)
        if self._catching_up and newest > self.ctx.round:
            logger.info(
                "peer %s: its neighbours are at round %d; skipping rounds %d-%d to take it up",
                self.ctx.peer_id,
                newest,
                self.ctx.round,
                newest - 1,
            )
            self.ctx.round = newest
        return self.ctx.round

    def _fits(self, size: int) -> bool:
        """Whether the rule can mix ``size`` models; warns once when it starts not to."""
        fits = bool(neighbourhood_fits(self.ctx.algorithm.aggregator, torch.tensor([size])).item())
        if not fits and not self._starved:
            logger.warning(
                "peer %s: round %d has %d model(s) (own + arrived), too few for aggregator %s; "
                "keeping its own model until enough neighbours answer",
                self.ctx.peer_id,
                self.ctx.round,
                size,
                self.ctx.config.aggregator,
            )
        elif fits and self._starved:
            logger.info("peer %s: enough neighbours again, mixing resumes", self.ctx.peer_id)
        self._starved = not fits
        return fits

    def _expected(self) -> list[str]:
        """Whose round-t model we wait for: neighbours we call, and client-only members
        (no address) heard from within the last three deadlines; with a topology, the
        round's partners among them."""
        recent = time.monotonic() - 3 * self.ctx.config.round_deadline_s
        members = [
            m
            for m in self.ctx.membership.members("alive", "suspected")
            if m.address is not None or m.last_seen >= recent
        ]
        if self.ctx.topology is not None:
            partners = self.ctx.topology.partners(self.ctx.round)
            members = [m for m in members if m.address in partners]
        return [m.id for m in members]

    def _mixing_row(self, expected: list[str], t: int) -> tuple[list[str], torch.Tensor]:
        """Whom round t mixes and with which off-diagonal weights W_ij.

        Without a topology: every expected member, uniform 1/(k+1). With one: the
        members row i of W_t receives from, with their W_ij (a partner we only send
        to is left out); an absent member's weight folds into the self weight.
        """
        dtype = self.ctx.spec.dtype
        if self.ctx.topology is None:
            weight = 1.0 / (len(expected) + 1)
            return expected, torch.full(
                (len(expected),), weight, dtype=dtype, device=self.ctx.device
            )
        row = self.ctx.topology.weights(t)
        addresses = {m.id: m.address for m in self.ctx.membership.members()}
        mixed = [j for j in expected if addresses.get(j) in row]
        values = [row[addresses[j]] for j in mixed]  # type: ignore[index]
        return mixed, torch.tensor(values, dtype=dtype, device=self.ctx.device)

    def _address_of(self, peer_id: str) -> str:
        member = self.ctx.membership.get(peer_id)
        return "" if member is None or member.address is None else member.address

    async def _sync_call(self, member: Member, envelope: Envelope, failed: set[str]) -> None:
        assert member.address is not None and self._changed is not None
        if self._secure is not None:
            if member.address not in self._sealed:
                failed.add(member.id)  # no masked message for it this round (a key missing)
                return
            envelope = self._sealed[member.address]
        try:
            if self.ctx.attack is not None:
                envelope = await self._attacked(envelope, member.id, None)
            # signed for member.id, and answered by it (else UnknownPeer)
            reply = await self.ctx.started_client().exchange(
                member.address, envelope, receiver=member.id, codecs=self.ctx.codecs
            )
            codec = self.ctx.codecs[reply.codec]
            vector = await in_thread(codec.decode, reply.payload, self.ctx.message_spec)
        except RemoteRefused as error:
            busy = error.code in ALIVE_REFUSALS  # at one of its bounds: alive
            self.ctx.metrics.exchanges(role="caller", outcome="busy" if busy else "failed").inc()
            if not busy:
                self.ctx.failed(member, error)
            failed.add(member.id)
        except (PeerUnavailable, ProtocolError) as error:
            self.ctx.metrics.exchanges(role="caller", outcome="failed").inc()
            self.ctx.failed(member, error)
            failed.add(member.id)
        else:
            self.ctx.membership.record_success(member.id)
            self.ctx.metrics.exchanges(role="caller", outcome="ok").inc()
            self._delivered[member.id] = max(envelope.round, self._delivered.get(member.id, -1))
            self._store(reply.sender, reply.round, vector)
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ callee

    async def answer(self, envelope: Envelope, vector: torch.Tensor) -> Envelope:
        """Answer a neighbour's ``POST /v1/exchange`` (validated): store its message, and
        reply with our message of its round once we have published it (or, after the
        deadline, the newest we have)."""
        assert self._changed is not None
        async with self._changed:
            self._store(envelope.sender, envelope.round, vector)
            self._changed.notify_all()
            self._awaiting[envelope.sender] = envelope.round  # our reply will carry that round
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(
                            lambda: (
                                self._published is not None
                                and self._published.round >= envelope.round
                            )
                        ),
                        self.ctx.config.round_deadline_s,
                    )
            finally:
                self._awaiting.pop(envelope.sender, None)
            reply = self._published
            if self._secure is not None and reply is not None:
                reply = self._sealed.get(self._address_of(envelope.sender))
                if reply is None:
                    raise Busy(f"{self.ctx.peer_id} has no masked message for {envelope.sender}")
            if reply is not None:
                self._delivered[envelope.sender] = max(
                    reply.round, self._delivered.get(envelope.sender, -1)
                )
        if reply is None:  # no round of ours yet
            # nothing the rule has accounted for; or a model that must not travel in the clear
            if not self.ctx.algorithm.message_is_model or self._secure is not None:
                raise Busy(f"{self.ctx.peer_id} has not published a round yet")
            reply = await in_thread(lambda: self.ctx.envelope(self.ctx.snapshot()))
        if self.ctx.attack is not None:
            if self._sent is None:
                raise Busy(f"{self.ctx.peer_id} has not published a round yet")
            reply = await self._attacked(reply, envelope.sender, vector)
        return reply

    async def _attacked(
        self, envelope: Envelope, receiver: str, target: torch.Tensor | None
    ) -> Envelope:
        """A Byzantine peer's message to ``receiver``: ``consensus.byzantine_message`` on this
        round's message, as the simulator's injection computes it.

        An attack that reads the honest messages (ALIE, IPM, dissensus, mimic) sees what a
        real attacker can: the receiver's message when it called us first (else our own),
        and the messages our other neighbours sent us this round, with uniform weights.
        The simulator's injection is omniscient instead (the receiver's whole neighbourhood);
        docs/consensus.md says so.
        """
        assert self.ctx.attack is not None and self._sent is not None
        own = self._sent
        honest = [
            rounds[envelope.round]
            for sender, rounds in self._inbox.items()
            if sender != receiver and envelope.round in rounds
        ]

        def attack() -> Envelope:
            view: dict[str, Any] = {}
            if self.ctx.attack is not None and self.ctx.attack.needs_honest:
                weight = 1.0 / (len(honest) + 2)
                view = {
                    "target": own if target is None else target.to(own.dtype),
                    "honest": torch.stack(honest).to(own.dtype)
                    if honest
                    else own.new_zeros((0, own.numel())),
                    "honest_weights": own.new_full((len(honest),), weight),
                    "byzantine_weight": weight,
                    "byzantine_count": 1,
                }
            assert self.ctx.attack is not None
            message = consensus.byzantine_message(
                self.ctx.attack, own, generator=self.ctx.attack_generator, **view
            )
            return dataclasses.replace(envelope, payload=self.ctx.codec.encode(message.cpu()))

        return await in_thread(attack)

    # ------------------------------------------------------------------ inbox and the rule

    def _store(self, sender: str, round_: int, vector: torch.Tensor) -> None:
        """Keep a neighbour's message for this round or a later one, or a late one, within
        the rule's window (:meth:`_window`); others are dropped."""
        heard = self._heard.setdefault(sender, set())
        if round_ in heard:  # a round's message counts once (a reply may repeat one)
            return
        self._newest[sender] = max(round_, self._newest.get(sender, -1))
        behind, ahead = self._window()
        beyond = round_ > self.ctx.round + ahead
        if self.ctx.round - behind <= round_ <= self.ctx.round + ahead or (
            beyond and self._catching_up and round_ == self._newest[sender]
        ):
            inbox = self._inbox.setdefault(sender, {})
            if beyond:  # for the round we will skip to: only the sender's newest is kept
                for r in [r for r in inbox if r > self.ctx.round + ahead]:
                    del inbox[r]
            inbox[round_] = vector
            heard.add(round_)
            heard.difference_update([r for r in heard if r < self.ctx.round - LATE_ROUNDS])
        elif round_ < self.ctx.round and behind:
            logger.warning(
                "peer %s: dropped %s's message of round %d, more than %d rounds late",
                self.ctx.peer_id,
                sender,
                round_,
                LATE_ROUNDS,
            )

    def _window(self) -> tuple[int, int]:
        """Rounds behind and ahead of ours whose messages are kept. Where a message is the
        model (D-PSGD, local SGD), a late one is stale and one round ahead suffices (the
        inbox holds at most 2 per neighbour); push-sum's mass and CHOCO's increments must
        all arrive, so up to LATE_ROUNDS either way (docs/protocol.md counts the copies)."""
        if self.ctx.algorithm.message_is_model:
            return 0, 1
        return LATE_ROUNDS, LATE_ROUNDS

    def _take_late(self, t: int) -> list[tuple[str, int, torch.Tensor]]:
        """Inbox messages of rounds before ``t``: they came after their round mixed."""
        late = []
        for sender, rounds in self._inbox.items():
            for r in [r for r in rounds if r < t]:
                late.append((sender, r, rounds.pop(r)))
        return late

    def _message_locked(self) -> tuple[dict[str, Any], torch.Tensor]:
        """This round's message (the rule's ``message``), encoded once for every neighbour,
        and decoded as they will decode it (the ``sent`` the rule combines with)."""
        with self.ctx.lock, torch.no_grad():
            # a copy: the payload views it, and is served for this round after the model moves
            message = (
                self.ctx.algorithm.message(self.ctx.gossip_state).detach().to("cpu", copy=True)
            )
        payload = self.ctx.codec.encode(message)
        # what a receiver decodes (CHOCO combines with exactly that)
        # (a secure peer receives only masked messages: its own codec decodes its payload)
        decoder = self.ctx.codecs.get(self.ctx.codec.name, self.ctx.codec)
        return payload, decoder.decode(payload, self.ctx.message_spec)

    def _late_locked(self, late: list[tuple[str, int, torch.Tensor]], t: int) -> None:
        """``late(state, sum_j W_ij m_j, sum_j r_j W_ij m_j)`` with each message's own round's
        weights (0 for a sender that row of W does not receive from) and lateness r_j."""
        if self.ctx.topology is None:
            return  # uniform mixing (dpsgd only): a late model is stale and dropped
        addresses = {m.id: m.address for m in self.ctx.membership.members()}
        arrived = torch.zeros(
            self.ctx.message_spec.numel, dtype=self.ctx.spec.dtype, device=self.ctx.device
        )
        missed = torch.zeros_like(arrived)
        for sender, r, vector in late:
            weight = self.ctx.topology.weights(r).get(addresses.get(sender) or "", 0.0)
            if weight:
                value = vector.to(self.ctx.device, self.ctx.spec.dtype)
                arrived.add_(value, alpha=weight)
                missed.add_(value, alpha=weight * (t - r))
        with self.ctx.lock:
            self.ctx.algorithm.late(self.ctx.gossip_state, arrived, missed)

    def _combine_locked(
        self,
        sent: torch.Tensor,
        messages: list[torch.Tensor],
        weights: torch.Tensor,
        mask: list[bool],
        self_weight: float | None,
    ) -> None:
        """The rule's ``combine`` of this round's message with the ``messages`` of the row
        (``mask``: which arrived; an absent one's slot holds ``sent``), stacked here, in the
        worker thread, then combined under the model lock."""
        device, dtype = self.ctx.device, self.ctx.spec.dtype
        if messages:
            received = torch.stack(messages).to(device, dtype)
        else:
            received = torch.empty((0, sent.numel()), device=device, dtype=dtype)
        present = torch.tensor(mask, dtype=torch.bool, device=device)
        diagonal = None if self_weight is None else torch.tensor(self_weight)
        with self.ctx.lock:
            self.ctx.algorithm.combine(
                self.ctx.gossip_state, sent.to(device), received, weights, present, diagonal
            )
