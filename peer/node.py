"""``Peer``: one networked gossip-training participant, embeddable in any asyncio program.

A peer trains its model in a worker thread and gossips over HTTP with its
neighbours while its server keeps answering::

    config = PeerConfig(peer_id="a", port=7000, join=("10.0.0.2:7000",), mode="async")
    async with Peer(model, lambda params: torch.optim.SGD(params, lr=0.1),
                    torch.nn.functional.cross_entropy, loader, config) as peer:
        await peer.run(steps=1000)          # rounds of gradient / exchange / step

or drive it yourself: train under ``peer.lock``, then ``await peer.gossip()``.

Each round follows ``gossip.RoundPlan.phases()`` (combine-then-adapt by default:
gradient, exchange, step). The exchange is

* ``mode="async"`` -- AD-PSGD (Lian et al., ICML 2018): with each of ``fanout``
  random neighbours, push-pull ``POST /v1/exchange``; the callee computes
  ``gossip.average_pair`` (x_i, x_j <- (x_i + x_j)/2) atomically under its model
  lock and answers with it; the caller adds ``average - sent`` to its model, so
  local progress made during the round trip is kept and the pair's sum is
  preserved under any interleaving.
* ``mode="sync"`` -- D-PSGD rounds (Lian et al., NeurIPS 2017) through
  ``gossip.DecentralizedSGD.combine``: x_i <- w_ii x_i + sum_j w_ij x_j with
  uniform w_ij = 1/(k+1) over the k known members, or with ``PeerConfig.topology``
  row i of the topology's W_t (:mod:`peer.topology`); each pair does one round trip
  (the smaller id calls; the callee stores the caller's round-t model and answers
  with its own round-t model once it has one); neighbours that miss
  ``round_deadline_s`` are masked out, so their weight folds into the self
  weight (consensus's mask convention).

Model copies held (d = parameter count; an edge device sizes for these): the
model itself, the flat gradient, the optimizer's state, the reused send buffer
and its request body, the answer being mixed, three per exchange served (at
most ``max_concurrent_exchanges`` at once: the server answers ``409 busy``
beyond it before reading the body), and in sync mode up to two rounds of each
neighbour's model in the inbox (2k). docs/protocol.md counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from aiohttp import web

import consensus
from gossip.algorithms import neighbourhood_fits
from gossip.configuration import build_algorithm
from gossip.flat import FlatParameters
from gossip.pairwise import PairwiseGossip
from peer import checkpoint
from peer.auth import (
    RequestVerifier,
    client_ssl_context,
    load_secret,
    server_ssl_context,
    warn_open_swarm,
)
from peer.client import PeerClient, PeerUnavailable, RemoteRefused
from peer.codecs import DenseCodec, build_codec, receiving_codecs
from peer.config import PeerConfig, resolve_device
from peer.errors import Busy, InvalidSender, MalformedBody, ProtocolError, UnknownPeer
from peer.health import ExchangeHealth
from peer.membership import Member, Membership, check_address
from peer.metrics import PeerMetrics
from peer.server import build_app
from peer.topology import TopologyNeighbours
from peer.wire import PROTOCOL_VERSION, Envelope, ModelSpec, check_sender, max_body_bytes

logger = logging.getLogger(__name__)

Batch = tuple[Any, Any]
OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
LATE_ROUNDS = 4
"""A sync message up to this many rounds late is still handed to the rule (``late``); an
older one is dropped (for CHOCO that leaves a public copy behind: the peer warns)."""
VIEW_REFRESH_ROUNDS = 10
"""Every this many rounds a peer pulls a random neighbour's membership view."""
HEALTH_WINDOW_ROUNDS = 5
"""A peer with no successful exchange in this many rounds in a row is *isolated* (logged)."""


def _to(value: Any, device: torch.device) -> Any:
    """A batch element moved to ``device`` (tensors only; anything else as is)."""
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value


def _derived_seed(seed: int, peer_id: str) -> int:
    """A 63-bit seed from (seed, peer id): peers of one swarm seed differently, reproducibly."""
    digest = hashlib.sha256(f"{seed}:{peer_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class Peer:
    """A gossip-training peer: model, optimizer, data, server, client and membership.

    Args:
        model: the ``nn.Module``; its parameters are moved into one flat buffer
            (``gossip.FlatParameters``) that training, mixing and the wire share.
        optimizer: a torch optimizer over ``model.parameters()``, or a factory
            ``params -> optimizer`` that is given ``[flat.parameter]`` (one vector
            update for the whole model; preferred).
        loss_fn: ``loss_fn(model(inputs), targets) -> scalar tensor``.
        train_data: an iterable of ``(inputs, targets)`` batches, re-iterated forever
            (a ``DataLoader`` reshuffles each pass).
        config: a :class:`~peer.config.PeerConfig`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | OptimizerFactory,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        train_data: Iterable[Batch],
        config: PeerConfig,
    ) -> None:
        if not isinstance(config, PeerConfig):
            raise TypeError(f"config must be a PeerConfig, got {type(config).__name__}")
        self.config = config
        self.peer_id = config.peer_id
        self.device = resolve_device(config.device)
        self.model = model.to(self.device)
        self.flat = FlatParameters(self.model)
        if isinstance(optimizer, torch.optim.Optimizer):
            self.optimizer = optimizer
        elif callable(optimizer):
            self.optimizer = optimizer([self.flat.parameter])
        else:
            raise TypeError("optimizer must be a torch optimizer or a factory params -> optimizer")
        self.loss_fn = loss_fn
        self.train_data = train_data
        self.spec = ModelSpec.of(self.flat.vector)
        self.max_concurrent_exchanges = config.max_concurrent_exchanges
        self.max_body_bytes = max_body_bytes(self.spec.num_bytes, factor=config.max_body_factor)
        self.codec = build_codec(
            config.gossip.compressor or "none", seed=_derived_seed(config.seed, config.peer_id)
        )
        self.codecs = receiving_codecs()
        # the same rule object the simulator builds for this configuration
        self.algorithm = build_algorithm(config.gossip)
        self.aggregator = self.algorithm.aggregator
        self.gossip_state = self.algorithm.init(self.flat.vector)
        self.message_spec = ModelSpec(
            numel=self.algorithm.message_size(self.spec.numel), dtype=self.spec.dtype
        )
        """What a sync message holds (the model, or push-sum's ``[x, w]``)."""
        self.topology = (
            TopologyNeighbours(
                config.topology,
                config.peer_list,
                config.rank if config.rank is not None else -1,
                weights=config.topology_weights,
                seed=config.seed,
            )
            if config.topology is not None
            else None
        )
        self.secret = (
            config.secret if config.secret is not None else load_secret(config.secret_file)
        )
        self.verifier = (
            RequestVerifier(self.secret, clock_window_s=config.clock_window_s)
            if self.secret is not None
            else None
        )
        self.metrics = PeerMetrics(self.peer_id)
        self.attack = None if config.byzantine is None else consensus.build_attack(config.byzantine)
        """The attack this peer runs instead of honest messages (evaluation only), or None."""
        self._attack_generator = torch.Generator().manual_seed(
            _derived_seed(config.seed + 1, config.peer_id)
        )
        self._sent: torch.Tensor | None = None  # this round's message as receivers decode it
        self.metrics.byzantine.set(0 if self.attack is None else 1)
        self.health = ExchangeHealth(self.peer_id, window=HEALTH_WINDOW_ROUNDS)
        """Exchanges that succeeded / failed per round; isolation (:mod:`peer.health`)."""
        self.membership = Membership(
            self.peer_id,
            None,
            suspect_after=config.suspect_after,
            evict_after=config.evict_after,
        )
        self.lock = threading.Lock()
        """Guards the model, gradient and optimizer: hold it while training by hand."""
        self.round = 0
        self.step = 0
        self.loss = math.nan
        self.address: str | None = None
        self._rng = random.Random(f"{config.seed}:{self.peer_id}")
        self._batches: Iterator[Batch] | None = None
        self._inbox: dict[str, dict[int, torch.Tensor]] = {}
        self._heard: dict[str, set[int]] = {}  # recent rounds each sender's message came for
        self._delivered: dict[str, int] = {}  # the newest round of ours each neighbour has
        self._awaiting: dict[str, int] = {}  # callers waiting for our reply, by their round
        self._in_flight: set[str] = set()
        self._send_buffer: torch.Tensor | None = None
        self._starved = False  # the last round had too few models for the rule
        self._published: Envelope | None = None
        self._changed: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self.client: PeerClient | None = None
        self._last_checkpoint_step = -1
        self.resumed_from: Path | None = None

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Peer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Resume (if configured), listen (unless client-only), and join the swarm."""
        config = self.config
        self._changed = asyncio.Condition()
        if self.attack is not None:
            logger.warning(
                "peer %s is BYZANTINE: every message it sends is the attack %r (for evaluating "
                "robust rules; never use in a real swarm)",
                self.peer_id,
                config.byzantine,
            )
        if self.secret is None:
            warn_open_swarm(self.peer_id)
        if config.resume:
            self._resume()
        client_context = None
        if config.tls_cert is not None or config.tls_ca is not None:
            client_context = client_ssl_context(
                cafile=config.tls_ca, certfile=config.tls_cert, keyfile=config.tls_key
            )
        self.client = PeerClient(
            secret=self.secret,
            timeout_s=config.request_timeout_s,
            max_body_bytes=self.max_body_bytes,
            ssl_context=client_context,
            on_bytes=lambda direction, n: self.metrics.bytes(direction=direction).inc(n),
        )
        if not config.client_only:
            server_context = None
            if config.tls_cert is not None and config.tls_key is not None:
                server_context = server_ssl_context(
                    config.tls_cert, config.tls_key, cafile=config.tls_ca
                )
            self._runner = web.AppRunner(build_app(self), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, config.host, config.port, ssl_context=server_context)
            await site.start()
            port = self._runner.addresses[0][1]
            self.address = config.advertise or f"{config.host}:{port}"
            self.membership.self_address = check_address(self.address)
        if config.join:
            try:
                await self._join(config.join)
            except ConnectionError as error:
                if self.topology is None:
                    await self.stop()
                    raise
                # A known peer list: those not up yet will join us when they start.
                logger.warning("%s; starting alone, the other ranks will join", error)
            except BaseException:
                await self.stop()
                raise
        logger.info("peer %s started at %s", self.peer_id, self.address or "(client-only)")

    async def stop(self) -> None:
        """Checkpoint (if configured), close connections, stop listening."""
        if self.config.checkpoint_dir is not None and self.step != self._last_checkpoint_step:
            await asyncio.to_thread(self._save_checkpoint)
        if self.client is not None:
            await self.client.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ membership

    async def _join(self, addresses: Iterable[str]) -> None:
        client = self._client()
        errors = []
        for address in addresses:
            try:
                answer = await client.join(address, self.peer_id, self.address)
                bootstrap = check_sender(answer["id"])
                self.membership.observe(bootstrap, address)
                added = self.membership.merge(answer["peers"])
                if self.config.fetch_state and self.resumed_from is None:
                    await self._fetch_state(address)
            except (PeerUnavailable, RemoteRefused, ProtocolError) as error:
                errors.append(f"{address}: {error}")
                continue
            for peer_id in added:  # announce ourselves to everyone we just learned of
                member = self.membership.get(peer_id)
                if member is not None and member.address is not None:
                    with contextlib.suppress(PeerUnavailable, RemoteRefused, ProtocolError):
                        self.membership.merge(
                            (await client.join(member.address, self.peer_id, self.address))["peers"]
                        )
            return
        raise ConnectionError(
            f"peer {self.peer_id} could not join via any of: " + "; ".join(errors)
        )

    async def _fetch_state(self, address: str) -> None:
        envelope = await self._client().state(address, codecs={"none"})
        vector = DenseCodec().decode(envelope.payload, self.spec)
        with self.lock:
            self.flat.load_(vector)
        self.round = max(self.round, envelope.round)

    async def wait_for_members(self, count: int, *, timeout_s: float = 60.0) -> bool:
        """Wait until ``count`` other members are alive (pulling views meanwhile).

        For swarms started together (``gossipnet launch``): nobody trains alone
        before the others have joined. Returns False (and the peer goes on) if
        ``timeout_s`` passes first.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be an integer >= 0, got {count!r}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(self.membership.members("alive")) < count:
            if loop.time() >= deadline:
                logger.warning(
                    "peer %s: %d of %d members after %.0f s; going on",
                    self.peer_id,
                    len(self.membership.members("alive")),
                    count,
                    timeout_s,
                )
                return False
            await self.refresh_view()
            await asyncio.sleep(0.1)
        return True

    async def refresh_view(self) -> None:
        """Pull one random neighbour's membership view and merge it."""
        neighbours = self.membership.neighbours()
        if not neighbours:
            return
        member = self._rng.choice(neighbours)
        assert member.address is not None
        try:
            view = await self._client().peers(member.address)
            self.membership.merge(view["peers"])
        except (PeerUnavailable, RemoteRefused, ProtocolError) as error:
            self._failed(member, error)

    def _failed(self, member: Member, error: Exception) -> None:
        status = self.membership.record_failure(member.id)
        logger.info(
            "peer %s: call to %s failed (%s), now %s", self.peer_id, member.id, error, status
        )

    def _client(self) -> PeerClient:
        if self.client is None:
            raise RuntimeError("peer is not started: await peer.start() first")
        return self.client

    # ------------------------------------------------------------------ training

    def _next_batch(self) -> Batch:
        if self._batches is None:
            self._batches = self._cycle()
        return next(self._batches)

    def _cycle(self) -> Iterator[Batch]:
        while True:
            empty = True
            for batch in self.train_data:
                empty = False
                yield batch
            if empty:
                raise ValueError(
                    "train_data yielded no batches (an exhausted iterator? pass a list, a "
                    "DataLoader or an endless iterator such as workloads.peer_batches)"
                )

    def _gradient(self) -> None:
        inputs, targets = self._next_batch()
        if self.device.type != "cpu":
            inputs, targets = _to(inputs, self.device), _to(targets, self.device)
        with self.lock:
            self.flat.zero_grad()
            loss = self.loss_fn(self.model(inputs), targets)
            loss.backward()
        self.loss = float(loss.detach())
        self.metrics.loss.set(self.loss)

    def _step(self) -> None:
        with self.lock:
            self.optimizer.step()
            self.step += 1
            self.metrics.step.set(self.step)
            every = self.config.checkpoint_every
            if every and self.step % every == 0:
                self._save_checkpoint_locked()

    def evaluate(
        self, inputs: torch.Tensor, targets: torch.Tensor, *, batch_size: int = 1024
    ) -> dict[str, float]:
        """Mean loss and accuracy (argmax) of the current model on ``(inputs, targets)``.

        Runs under the model lock in eval mode, ``batch_size`` samples at a time; call it
        from a worker thread (``asyncio.to_thread``) while the peer is serving.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        total = int(targets.shape[0])
        if total == 0:
            raise ValueError("evaluate needs at least one sample, got 0")
        loss_sum, correct = 0.0, 0
        with self.lock, torch.no_grad():
            training = self.model.training
            self.model.eval()
            try:
                for start in range(0, total, batch_size):
                    x = _to(inputs[start : start + batch_size], self.device)
                    y = _to(targets[start : start + batch_size], self.device)
                    output = self.model(x)
                    loss_sum += float(self.loss_fn(output, y)) * int(y.shape[0])
                    correct += int((output.argmax(dim=-1) == y).sum())
            finally:
                self.model.train(training)
        return {"loss": loss_sum / total, "accuracy": correct / total, "samples": total}

    async def run(self, steps: int) -> None:
        """Train for at least ``steps`` optimizer steps, gossiping as the round plan says."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        target = self.step + steps
        while self.step < target:
            await self.run_round()

    async def run_round(self) -> None:
        """One round: the phases of ``gossip.RoundPlan`` (gradient, step, exchange)."""
        for phase in self.algorithm.plan.phases():
            if phase == "gradient":
                await asyncio.to_thread(self._gradient)
            elif phase == "step":
                await asyncio.to_thread(self._step)
            else:
                await self.gossip()

    async def settle(self) -> None:
        """Hand the rule the messages that arrived after this peer's last round (sync mode).

        Call it once the swarm has stopped exchanging and before reading the final model:
        push-sum adds the late mass and CHOCO the late increments (``late`` of the rule),
        so nothing sent is left out; D-PSGD drops them, as it does every round.
        """
        if self._changed is None:
            raise RuntimeError("peer is not started: await peer.start() first")
        async with self._changed:
            overdue = self._take_late(self.round)
        if overdue:
            await asyncio.to_thread(self._late_locked, overdue, self.round)

    async def gossip(self) -> int:
        """One exchange phase in the configured mode; returns how many neighbours took part."""
        if self.config.mode == "async":
            done = await self._gossip_async()
        else:
            done = await self._gossip_sync()
        self.round += 1
        self.metrics.round.set(self.round)
        self.health.end_round()
        if self.round % VIEW_REFRESH_ROUNDS == 0:
            await self.refresh_view()
        return done

    # ------------------------------------------------------------------ async (AD-PSGD)

    def _snapshot(self) -> torch.Tensor:
        with self.lock:
            return self.flat.vector.clone()

    def _snapshot_into_buffer(self) -> torch.Tensor:
        """The model copied into one buffer reused by every outgoing pairwise exchange.

        Async exchanges of a peer run one at a time, so one buffer suffices; copying
        into memory already mapped is several times faster than a fresh clone.
        """
        with self.lock:
            if self._send_buffer is None:
                self._send_buffer = torch.empty_like(self.flat.vector, device="cpu")
            self._send_buffer.copy_(self.flat.vector)
            return self._send_buffer

    def _envelope(self, vector: torch.Tensor) -> Envelope:
        return self._envelope_of(self.codec.encode(vector.cpu()))

    def _envelope_of(self, payload: dict[str, Any]) -> Envelope:
        return Envelope(
            sender=self.peer_id,
            round=self.round,
            step=self.step,
            codec=self.codec.name,
            payload=payload,
        )

    def _neighbours(self) -> list[Member]:
        """Members to exchange with this round: the view, or the topology's partners in it."""
        members = self.membership.neighbours()
        if self.topology is None:
            return members
        partners = self.topology.partners(self.round)
        return [m for m in members if m.address in partners]

    async def _gossip_async(self) -> int:
        neighbours = self._neighbours()
        chosen = self._rng.sample(neighbours, min(self.config.fanout, len(neighbours)))
        done = 0
        for member in chosen:
            done += await self._pairwise(member)
        return done

    async def _pairwise(self, member: Member) -> bool:
        assert member.address is not None
        self._in_flight.add(member.id)
        try:
            sent = await asyncio.to_thread(self._snapshot_into_buffer)
            started = time.perf_counter()
            try:
                reply = await self._client().exchange(
                    member.address, self._envelope(sent), codecs=self.codecs
                )
                if reply.sender != member.id:
                    raise UnknownPeer(
                        f"{member.address} answered as {reply.sender!r}, not {member.id!r}"
                    )
                averaged = self.codecs[reply.codec].decode(reply.payload, self.spec)
            except RemoteRefused as error:
                if error.code == Busy.code:  # it is averaging with us right now, as the callee
                    self.metrics.exchanges(role="caller", outcome="busy").inc()
                    return False
                self.metrics.exchanges(role="caller", outcome="failed").inc()
                self.health.record(failed=1)
                self._failed(member, error)
                return False
            except (PeerUnavailable, ProtocolError) as error:
                self.metrics.exchanges(role="caller", outcome="failed").inc()
                self.health.record(failed=1)
                self._failed(member, error)
                return False
            await asyncio.to_thread(self._add_locked, averaged, sent)
        finally:
            self._in_flight.discard(member.id)
        self.membership.record_success(member.id)
        self.metrics.exchanges(role="caller", outcome="ok").inc()
        self.health.record(ok=1)
        self.metrics.exchange_seconds.observe(time.perf_counter() - started)
        return True

    def _add_locked(self, averaged: torch.Tensor, sent: torch.Tensor) -> None:
        """The caller's half, ``gossip.PairwiseGossip.caller_update``: x <- x + (answer - sent),
        adopting the pair's average and keeping progress made meanwhile."""
        with self.lock:
            PairwiseGossip.caller_update(self.flat.vector, sent, averaged)

    def _average_locked(self, other: torch.Tensor) -> torch.Tensor:
        """The callee's half, ``gossip.PairwiseGossip.callee_answer``: adopt
        ``average_pair(own, other, aggregator)`` atomically and return it (the answer)."""
        with self.lock:
            return PairwiseGossip(self.aggregator).callee_answer(self.flat.vector, other)

    # ------------------------------------------------------------------ sync (D-PSGD)

    async def _gossip_sync(self) -> int:
        assert self._changed is not None
        t = self.round
        async with self._changed:
            overdue = self._take_late(t)
        if overdue:
            await asyncio.to_thread(self._late_locked, overdue, t)
        payload, sent = await asyncio.to_thread(self._message_locked)
        async with self._changed:
            self._published = self._envelope_of(payload)
            self._sent = sent
            self._changed.notify_all()
        expected = self._expected()
        failed: set[str] = set()
        envelope = self._published

        def done(peer_id: str) -> bool:
            return peer_id in failed or t in self._inbox.get(peer_id, {})

        def complete() -> bool:
            return all(done(j) for j in expected)

        # One round trip per pair: we call neighbours with a larger id (a client-only
        # peer calls everyone) and expect the others to call us. A smaller-id neighbour
        # whose model has not arrived after a quarter of the deadline is called too,
        # so a dead or lagging one is still detected and suspected.
        eager: list[Member] = []
        lazy: list[Member] = []
        for member in self._neighbours():
            if self._delivered.get(member.id, -1) >= t or self._awaiting.get(member.id, t + 1) <= t:
                continue  # it called us this round: our reply carries (or carried) round t
            if t in self._inbox.get(member.id, {}):
                # it called us ahead of us and got an older round: push it ours now, so no
                # round's message is lost (CHOCO's copies and push-sum's mass need every one)
                eager.append(member)
                continue
            (eager if self.address is None or member.id > self.peer_id else lazy).append(member)
        tasks = [asyncio.create_task(self._sync_call(m, envelope, failed)) for m in eager]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.round_deadline_s
        patience = loop.time() + self.config.round_deadline_s / 4
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
        if mixed and not self._fits(arrived + 1):
            mixed = []  # keep our own model this round, as the simulator freezes such a row
        if mixed:
            received = torch.stack([self._inbox[j][t] if j in present else sent for j in mixed]).to(
                self.device, self.spec.dtype
            )
            mask = torch.tensor([j in present for j in mixed], device=self.device)
            self_weight = None if self.topology is None else self.topology.self_weight(t)
            await asyncio.to_thread(
                self._combine_locked, sent.to(self.device), received, weights, mask, self_weight
            )
        for j in present:  # a message that comes after this mix is late (next round's start)
            self._inbox[j].pop(t, None)
        self.health.record(ok=len(present), failed=len(expected) - len(present))
        return len(present)

    def _fits(self, size: int) -> bool:
        """Whether the rule can mix ``size`` models; warns once when it starts not to."""
        fits = bool(neighbourhood_fits(self.aggregator, torch.tensor([size])).item())
        if not fits and not self._starved:
            logger.warning(
                "peer %s: round %d has %d model(s) (own + arrived), too few for aggregator %s; "
                "keeping its own model until enough neighbours answer",
                self.peer_id,
                self.round,
                size,
                self.config.aggregator,
            )
        elif fits and self._starved:
            logger.info("peer %s: enough neighbours again, mixing resumes", self.peer_id)
        self._starved = not fits
        return fits

    def _expected(self) -> list[str]:
        """Whose round-t model we wait for: neighbours we call, and client-only members
        (no address) heard from within the last three deadlines; with a topology, the
        round's partners among them."""
        recent = time.monotonic() - 3 * self.config.round_deadline_s
        members = [
            m
            for m in self.membership.members("alive", "suspected")
            if m.address is not None or m.last_seen >= recent
        ]
        if self.topology is not None:
            partners = self.topology.partners(self.round)
            members = [m for m in members if m.address in partners]
        return [m.id for m in members]

    def _mixing_row(self, expected: list[str], t: int) -> tuple[list[str], torch.Tensor]:
        """Whom round t mixes and with which off-diagonal weights W_ij.

        Without a topology: every expected member, uniform 1/(k+1). With one: the
        members row i of W_t receives from, with their W_ij (a partner we only send
        to is left out); an absent member's weight folds into the self weight.
        """
        dtype = self.spec.dtype
        if self.topology is None:
            weight = 1.0 / (len(expected) + 1)
            return expected, torch.full((len(expected),), weight, dtype=dtype, device=self.device)
        row = self.topology.weights(t)
        addresses = {m.id: m.address for m in self.membership.members()}
        mixed = [j for j in expected if addresses.get(j) in row]
        values = [row[addresses[j]] for j in mixed]  # type: ignore[index]
        return mixed, torch.tensor(values, dtype=dtype, device=self.device)

    async def _sync_call(self, member: Member, envelope: Envelope, failed: set[str]) -> None:
        assert member.address is not None and self._changed is not None
        try:
            if self.attack is not None:
                envelope = await self._attacked(envelope, member.id, None)
            reply = await self._client().exchange(member.address, envelope, codecs=self.codecs)
            if reply.sender != member.id:
                raise UnknownPeer(
                    f"{member.address} answered as {reply.sender!r}, not {member.id!r}"
                )
            vector = self.codecs[reply.codec].decode(reply.payload, self.message_spec)
        except RemoteRefused as error:
            busy = error.code == Busy.code  # at its bound of concurrent exchanges: alive
            self.metrics.exchanges(role="caller", outcome="busy" if busy else "failed").inc()
            if not busy:
                self._failed(member, error)
            failed.add(member.id)
        except (PeerUnavailable, ProtocolError) as error:
            self.metrics.exchanges(role="caller", outcome="failed").inc()
            self._failed(member, error)
            failed.add(member.id)
        else:
            self.membership.record_success(member.id)
            self.metrics.exchanges(role="caller", outcome="ok").inc()
            self._delivered[member.id] = max(envelope.round, self._delivered.get(member.id, -1))
            self._store(reply.sender, reply.round, vector)
        async with self._changed:
            self._changed.notify_all()

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
        assert self.attack is not None and self._sent is not None
        own = self._sent
        honest = [
            rounds[envelope.round]
            for sender, rounds in self._inbox.items()
            if sender != receiver and envelope.round in rounds
        ]

        def attack() -> Envelope:
            view: dict[str, Any] = {}
            if self.attack is not None and self.attack.needs_honest:
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
            assert self.attack is not None
            message = consensus.byzantine_message(
                self.attack, own, generator=self._attack_generator, **view
            )
            return dataclasses.replace(envelope, payload=self.codec.encode(message.cpu()))

        return await asyncio.to_thread(attack)

    def _store(self, sender: str, round_: int, vector: torch.Tensor) -> None:
        """Keep a neighbour's message for this round, up to LATE_ROUNDS rounds ahead (a faster
        neighbour's), or up to LATE_ROUNDS rounds late (the rule's ``late`` takes it at the
        next round's start); others are dropped."""
        heard = self._heard.setdefault(sender, set())
        if round_ in heard:  # a round's message counts once (a reply may repeat one)
            return
        if self.round - LATE_ROUNDS <= round_ <= self.round + LATE_ROUNDS:
            self._inbox.setdefault(sender, {})[round_] = vector
            heard.add(round_)
            heard.difference_update([r for r in heard if r < self.round - LATE_ROUNDS])
        elif round_ < self.round:
            logger.warning(
                "peer %s: dropped %s's message of round %d, more than %d rounds late",
                self.peer_id,
                sender,
                round_,
                LATE_ROUNDS,
            )

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
        with self.lock, torch.no_grad():
            # a copy: the payload views it, and is served for this round after the model moves
            message = self.algorithm.message(self.gossip_state).detach().to("cpu", copy=True)
        payload = self.codec.encode(message)
        # what a receiver decodes (CHOCO combines with exactly that)
        return payload, self.codecs[self.codec.name].decode(payload, self.message_spec)

    def _late_locked(self, late: list[tuple[str, int, torch.Tensor]], t: int) -> None:
        """``late(state, sum_j W_ij m_j, sum_j r_j W_ij m_j)`` with each message's own round's
        weights (0 for a sender that row of W does not receive from) and lateness r_j."""
        if self.topology is None:
            return  # uniform mixing (dpsgd only): a late model is stale and dropped
        addresses = {m.id: m.address for m in self.membership.members()}
        arrived = torch.zeros(self.message_spec.numel, dtype=self.spec.dtype, device=self.device)
        missed = torch.zeros_like(arrived)
        for sender, r, vector in late:
            weight = self.topology.weights(r).get(addresses.get(sender) or "", 0.0)
            if weight:
                value = vector.to(self.device, self.spec.dtype)
                arrived.add_(value, alpha=weight)
                missed.add_(value, alpha=weight * (t - r))
        with self.lock:
            self.algorithm.late(self.gossip_state, arrived, missed)

    def _combine_locked(
        self,
        sent: torch.Tensor,
        received: torch.Tensor,
        weights: torch.Tensor,
        mask: torch.Tensor,
        self_weight: float | None,
    ) -> None:
        with self.lock:
            diagonal = None if self_weight is None else torch.tensor(self_weight)
            self.algorithm.combine(self.gossip_state, sent, received, weights, mask, diagonal)

    # ------------------------------------------------------------------ server side

    async def on_exchange(self, envelope: Envelope, vector: torch.Tensor) -> Envelope:
        """Serve ``POST /v1/exchange`` (the body is already validated)."""
        self.membership.observe(envelope.sender)
        if self.config.mode == "async":
            if envelope.sender in self._in_flight and self.peer_id < envelope.sender:
                # Both sides of the pair called at once. If both averaged as callee and
                # then added (average - sent) as caller, the pair would swap models; the
                # smaller id declines, so the pair averages exactly once.
                raise Busy(f"{self.peer_id} is exchanging with {envelope.sender} as the caller")
            averaged = await asyncio.to_thread(self._average_locked, vector.to(self.spec.dtype))
            self.health.record(ok=1)  # averaged as the callee: this peer is not alone
            return self._envelope(averaged)
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
                        self.config.round_deadline_s,
                    )
            finally:
                self._awaiting.pop(envelope.sender, None)
            reply = self._published
            if reply is not None:
                self._delivered[envelope.sender] = max(
                    reply.round, self._delivered.get(envelope.sender, -1)
                )
        if reply is None:  # no round of ours yet
            if not self.algorithm.message_is_model:  # nothing the rule has accounted for
                raise Busy(f"{self.peer_id} has not published a round yet")
            reply = self._envelope(await asyncio.to_thread(self._snapshot))
        if self.attack is not None:
            if self._sent is None:
                raise Busy(f"{self.peer_id} has not published a round yet")
            reply = await self._attacked(reply, envelope.sender, vector)
        return reply

    def on_join(self, peer_id: object, address: object) -> list[dict[str, Any]]:
        """Serve ``POST /v1/join``: admit (or re-admit) the newcomer, answer with our view."""
        if not isinstance(peer_id, str):
            raise InvalidSender(f"id must be a string, got {peer_id!r:.40}")
        check_sender(peer_id)
        if peer_id == self.peer_id:
            raise UnknownPeer(f"id {peer_id!r} is already this peer's id; pick another")
        if address is not None:
            try:
                check_address(address)
            except ValueError as error:
                raise MalformedBody(str(error)) from None
        self.membership.observe(peer_id, address if isinstance(address, str) else None)
        return self.membership.view()

    def peers_view(self) -> list[dict[str, Any]]:
        return self.membership.view()

    async def state_envelope(self) -> Envelope:
        vector = await asyncio.to_thread(self._snapshot)
        return Envelope(
            sender=self.peer_id,
            round=self.round,
            step=self.step,
            codec="none",
            payload=DenseCodec().encode(vector.cpu()),
        )

    def status(self) -> dict[str, Any]:
        counts = self.membership.counts()
        for status, count in counts.items():
            self.metrics.members.labels(status=status).set(count)
        self.metrics.isolated.set(int(self.health.isolated))
        self.metrics.rounds_without_exchange.set(self.health.rounds_without_exchange)
        return {
            "v": PROTOCOL_VERSION,
            "id": self.peer_id,
            "address": self.address,
            "mode": self.config.mode,
            "round": self.round,
            "step": self.step,
            "loss": None if math.isnan(self.loss) else self.loss,
            "parameters": self.spec.numel,
            "dtype": str(self.spec.dtype).removeprefix("torch."),
            "codec": self.codec.name,
            "aggregator": self.config.aggregator,
            "algorithm": self.config.algorithm,
            "local_steps": self.config.local_steps,
            "topology": self.config.topology,
            "rank": self.config.rank,
            "device": str(self.device),
            "neighbours": [m.to_json() for m in self.membership.members()],
            "bytes_in": self.metrics.bytes_total("in"),
            "bytes_out": self.metrics.bytes_total("out"),
            "authenticated": self.secret is not None,
            "byzantine": self.config.byzantine,
            **self.health.to_json(),
        }

    def render_metrics(self) -> bytes:
        self.status()  # refreshes the member gauges
        return self.metrics.render()

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self) -> Path:
        with self.lock:
            return self._save_checkpoint_locked()

    def _save_checkpoint_locked(self) -> Path:
        directory = self.config.checkpoint_dir
        if directory is None:
            raise RuntimeError("PeerConfig.checkpoint_dir is not set")
        state = self.optimizer.state_dict()
        tensors: dict[str, torch.Tensor] = {"flat": self.flat.vector}
        scalars: dict[str, Any] = {}
        for index, entries in state["state"].items():
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optimizer.{index}.{key}"] = value
                else:
                    scalars[f"{index}.{key}"] = value
        metadata = {
            "optimizer": json.dumps({"param_groups": state["param_groups"], "scalars": scalars})
        }
        path = checkpoint.save_checkpoint(
            directory,
            tensors,
            step=self.step,
            round=self.round,
            peer_id=self.peer_id,
            metadata=metadata,
            keep=self.config.keep_checkpoints,
        )
        self._last_checkpoint_step = self.step
        return path

    def _resume(self) -> None:
        assert self.config.checkpoint_dir is not None
        loaded = checkpoint.load_latest(self.config.checkpoint_dir)
        if loaded is None:
            logger.info("peer %s: no checkpoint to resume from, starting fresh", self.peer_id)
            return
        flat = loaded.tensors.get("flat")
        if flat is None or flat.shape != self.flat.vector.shape or flat.dtype != self.spec.dtype:
            raise checkpoint.CheckpointError(
                f"{loaded.path}: 'flat' must be {self.spec.dtype} of shape ({self.spec.numel},) "
                f"for this model, got {None if flat is None else (flat.dtype, tuple(flat.shape))}"
            )
        saved = json.loads(loaded.metadata.get("optimizer", "{}") or "{}")
        state: dict[int, dict[str, Any]] = {}
        for name, tensor in loaded.tensors.items():
            if name.startswith("optimizer."):
                _, index, key = name.split(".", 2)
                state.setdefault(int(index), {})[key] = tensor
        for name, value in saved.get("scalars", {}).items():
            index, key = name.split(".", 1)
            state.setdefault(int(index), {})[key] = value
        with self.lock:
            self.flat.load_(flat)
            if "param_groups" in saved:
                self.optimizer.load_state_dict(
                    {"state": state, "param_groups": saved["param_groups"]}
                )
        self.step, self.round = loaded.step, loaded.round
        self._last_checkpoint_step = loaded.step
        self.resumed_from = loaded.path
        logger.info("peer %s resumed from %s (step %d)", self.peer_id, loaded.path, loaded.step)
