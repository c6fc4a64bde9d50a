"""One peer's side of secure neighbour sums in sync rounds (``--secure-sum``).

The math is :mod:`gossip.secure_sum`'s; this part does what only a networked peer must:

* keys: the peer's X25519 key (``PeerContext.secure_key``, drawn from the OS at start) and
  the public keys of the members it must share masks with, fetched from each over
  ``GET /v1/key`` (signed with the swarm secret, so a stranger cannot inject a key), cached;
  ``K_jk`` from :func:`gossip.secure_sum.pair_key`. Node ids are ranks in the peer list: a
  sender j masks its message to receiver r with every other in-neighbour k of r that round
  (row r of the topology's W_t, which every rank computes alike), so it needs the keys of
  its receivers' in-neighbours (2 hops away);
* sealing: one masked message per receiver (:meth:`SecureSums.seal`), each the receiver's own
  envelope; a partner that does not receive from us (a directed graph) gets an all-zero one;
* mixing: the modular sum of the row's messages, unmasked and mixed by the rule
  (:func:`gossip.secure_sum.mix_sums`). A round that lacks any message of the row (a
  neighbour down, late or without a key) cannot be unmasked: the peer keeps its own model,
  warns, and counts it (``gossipnet_secure_sum_rounds_total{outcome="skipped"}`` in
  ``/metrics``, ``secure_sum`` in ``/v1/status``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import torch
from prometheus_client import Counter

from gossip.secure_sum import (
    PAYLOAD_CODEC,
    SecureSumError,
    masked_message,
    masked_payload,
    mix_sums,
    pair_key,
    unmask,
)
from peer.node.context import PeerContext
from peer.protocol.errors import ProtocolError
from peer.protocol.wire import Envelope
from peer.transport.client import PeerUnavailable, RemoteRefused

logger = logging.getLogger(__name__)

ROUNDS_METRIC = "gossipnet_secure_sum_rounds"
KEY_REFRESH_ROUNDS = 10
"""Every this many rounds a peer fetches again every key its masks need: a restarted member has
a new key, and until its co-senders have it their receivers' sums do not unmask (skipped)."""
OUTCOMES = ("mixed", "skipped")


class SecureSums:
    """Keys, sealing and unmasking of one peer's secure sums over ``ctx`` (which must have a
    ``secure_key`` and a topology)."""

    def __init__(self, ctx: PeerContext) -> None:
        if ctx.secure_key is None or ctx.topology is None:
            raise ValueError("secure sums need the peer's key and a topology")
        self.ctx = ctx
        self.key = ctx.secure_key
        self.topology = ctx.topology
        self.rank = ctx.topology.rank
        self._pair: dict[int, bytes] = {}
        """``K_rank,k`` by the other rank k."""
        self._round_table: tuple[int, Any] | None = None
        self.rounds = Counter(
            ROUNDS_METRIC,
            "Secure-sum rounds by outcome: mixed, or skipped (a message of the row missing, "
            "so the sum could not be unmasked; the peer kept its own model)",
            ["outcome"],
            registry=ctx.metrics.registry,
        ).labels
        for outcome in OUTCOMES:
            self.rounds(outcome=outcome)

    # ------------------------------------------------------------------ the round's table

    def _table(self, t: int) -> Any:
        """Round t's neighbour table (kept for the round)."""
        if self._round_table is None or self._round_table[0] != t:
            self._round_table = (t, self.topology.schedule.neighbour_table(t))
        return self._round_table[1]

    def _senders(self, t: int) -> list[list[int]]:
        """Each rank's in-neighbours (ranks) in round t."""
        table = self._table(t)
        return [[int(j) for j in table.index[r][table.mask[r]]] for r in range(table.n)]

    def _weight(self, t: int, receiver: int) -> float:
        table = self._table(t)
        slots = table.index[receiver] == self.rank
        return float(np.sum(np.where(slots & table.mask[receiver], table.weight[receiver], 0.0)))

    async def fetch_keys(self, t: int) -> None:
        """Fetch the public keys round t's masks need and are not known yet, all at once (one
        that does not answer is asked again next round); every :data:`KEY_REFRESH_ROUNDS`
        rounds fetch them all again (a restarted member has a new key)."""
        senders = self._senders(t)
        needed = {k for row in senders if self.rank in row for k in row if k != self.rank}
        if t % KEY_REFRESH_ROUNDS:
            needed -= set(self._pair)
        if not needed:
            return
        ids = {m.address: m.id for m in self.ctx.membership.members()}
        client = self.ctx.started_client()

        async def fetch(k: int) -> None:
            address = self.topology.addresses[k]
            try:
                public = await client.public_key(address, receiver=ids.get(address))
            except (PeerUnavailable, RemoteRefused, ProtocolError) as error:
                logger.info(
                    "peer %s: no secure-sum key from %s yet (%s)", self.ctx.peer_id, address, error
                )
                return
            if public is None:
                logger.error(
                    "peer %s: %s runs no secure sums (start every peer with --secure-sum); "
                    "its receivers cannot unmask",
                    self.ctx.peer_id,
                    address,
                )
                self._pair.pop(k, None)
                return
            self._pair[k] = pair_key(self.key, public)

        await asyncio.gather(*(fetch(k) for k in sorted(needed)))

    # ------------------------------------------------------------------ sender and receiver

    def seal(self, t: int, model: torch.Tensor) -> dict[str, Envelope]:
        """Round t's envelope for each partner address: ``encode(W_rj x_j) + mask`` for a
        receiver r whose masks we can make, all zeros for a partner that does not receive
        from us (run it in a worker thread)."""
        senders = self._senders(t)
        sealed: dict[str, Envelope] = {}
        for address in self.topology.partners(t):
            r = self.topology.addresses.index(address)
            row = senders[r]
            if self.rank not in row or len(row) < 2:
                # r does not mix our model this round, or could not without seeing it alone:
                # zeros keep the round trip and reveal nothing (r skips a row of one, loudly)
                message = np.zeros(model.numel(), dtype=np.uint64)
            elif all(k in self._pair for k in row if k != self.rank):
                message = masked_message(
                    model, self._weight(t, r), self.rank, r, row, t, self._pair.__getitem__
                )
            else:
                continue  # a key is missing: r cannot unmask this round anyway
            sealed[address] = Envelope(
                sender=self.ctx.peer_id,
                round=t,
                step=self.ctx.step,
                codec=PAYLOAD_CODEC,
                payload=masked_payload(message),
            )
        return sealed

    def mix(self, t: int, arrived: dict[str, torch.Tensor], sent: torch.Tensor) -> bool:
        """Unmask round t's sum from the messages that ``arrived`` (by sender address) and mix
        it; with any message of our row missing, keep our model, warn and count it. Returns
        whether it mixed (run it in a worker thread)."""
        row = self._senders(t)[self.rank]
        mine = {self.topology.addresses[k]: k for k in row}
        missing = sorted(set(mine) - set(arrived))
        ctx = self.ctx
        if len(row) < 2 or missing:
            why = (
                f"{len(row)} in-neighbour(s) this round, too few to hide one"
                if len(row) < 2
                else f"no message from {', '.join(missing)}"
            )
            logger.warning(
                "peer %s: round %d's secure sum cannot be unmasked (%s); keeping its own model",
                ctx.peer_id,
                t,
                why,
            )
            self.rounds(outcome="skipped").inc()
            return False
        stacked = np.stack([arrived[a].numpy().view(np.uint64) for a in mine])
        try:
            total = unmask(stacked)
        except SecureSumError as error:
            logger.warning(
                "peer %s: round %d's secure sum is not mixed: %s; keeping its own model "
                "(keys are fetched again every %d rounds)",
                ctx.peer_id,
                t,
                error,
                KEY_REFRESH_ROUNDS,
            )
            self.rounds(outcome="skipped").inc()
            return False
        weights = self.topology.weights(t)
        total_weight = torch.tensor(sum(weights[a] for a in mine), dtype=torch.float64)
        with ctx.lock:
            mix_sums(
                ctx.algorithm,
                ctx.gossip_state,
                sent.to(ctx.device),
                total.to(ctx.device),
                total_weight,
                torch.tensor(True),
            )
        self.rounds(outcome="mixed").inc()
        return True


def secure_sum_status(ctx: PeerContext) -> dict[str, object]:
    """``/v1/status``'s ``secure_sum``: the rounds mixed and skipped (``{"mixed",
    "skipped"}``), or None without secure sums."""
    if ctx.secure_key is None:
        return {"secure_sum": None}
    sample = ctx.metrics.registry.get_sample_value
    return {
        "secure_sum": {
            outcome: int(sample(f"{ROUNDS_METRIC}_total", {"outcome": outcome}) or 0)
            for outcome in OUTCOMES
        }
    }
