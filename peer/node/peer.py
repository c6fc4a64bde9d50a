"""``Peer``: one networked gossip-training participant, embeddable in any asyncio program.

A peer trains its model in a worker thread and gossips over HTTP with its
neighbours while its server keeps answering::

    config = PeerConfig(peer_id="a", port=7000, join=("10.0.0.2:7000",), mode="async")
    async with Peer(model, lambda params: torch.optim.SGD(params, lr=0.1),
                    torch.nn.functional.cross_entropy, loader, config) as peer:
        await peer.run(steps=1000)          # rounds of gradient / exchange / step

Per-step hooks: ``await peer.run(1000, callbacks=[log], scheduler=scheduler)`` calls
``log(step, loss)`` after every optimizer step and steps the learning-rate scheduler
after every step (or, with ``scheduler_every="round"``, every round). Or drive training
yourself: train under ``peer.lock``, ``peer.record_step(loss)`` after each optimizer step
(so ``/v1/status`` and ``/metrics`` show it), then ``await peer.gossip()``. A synchronous
training loop with no event loop uses :class:`peer.node.background.BackgroundPeer` instead.

Each round follows ``gossip.RoundPlan.phases()`` (combine-then-adapt by default:
gradient, exchange, step). The exchange is

* ``mode="async"`` -- AD-PSGD (Lian et al., ICML 2018): pairwise push-pull averaging
  with ``fanout`` random neighbours (:mod:`peer.node.pairwise`);
* ``mode="sync"`` -- D-PSGD rounds (Lian et al., NeurIPS 2017): every neighbour's
  message of the round, mixed with the rule's weights by a deadline
  (:mod:`peer.node.sync_round`).

A ``Peer`` is a facade over its rooms: :mod:`peer.node.core` (the parts built from the
config, shared by the rooms), :mod:`peer.node.trainer` (batches, gradient, optimizer step,
evaluation under the model lock), :mod:`peer.node.pairwise`, :mod:`peer.node.sync_round`,
:mod:`peer.node.handlers` (what the server calls) and :mod:`peer.node.training_state`
(checkpoints of the model and optimizer). This module wires them: the lifecycle
(resume, listen, join, checkpoint at stop), the membership joins and view refreshes,
and the round loop.

A restarted peer finds its swarm again: each checkpoint records the membership view
(ids and addresses) beside the model, and ``resume`` rejoins those members as it joins
``PeerConfig.join`` addresses. Joins retry unreachable addresses with exponential
backoff until ``join_timeout_s``, so peers started in any order find each other.

Model copies held (d = parameter count; an edge device sizes for these): the
model itself, the flat gradient, the optimizer's state, the reused send buffer (the
request streams from it), the reused buffer the answer lands in, two per exchange
served (the request's buffer and the averaging result the answer streams from; at
most ``max_concurrent_exchanges`` at once: the server answers ``409 busy``
beyond it before reading the body), and in sync mode this round's message and the
inbox: up to two rounds of each neighbour's message (2k), or up to nine for push-sum
and CHOCO, whose late messages still count. docs/protocol.md counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from peer.node.checkpoint import remove_stale_temporaries
from peer.node.config import PeerConfig, resolve_device
from peer.node.core import HEALTH_WINDOW_ROUNDS
from peer.node.handlers import ServerHandlers
from peer.node.membership import check_address
from peer.node.pairwise import PairwiseExchange
from peer.node.recipe import RECIPE_KEY, ModelRecipe
from peer.node.sync_round import SyncRound
from peer.node.trainer import Batch, Evaluation, OptimizerFactory, Trainer
from peer.node.training_state import load_training_state, save_training_state
from peer.protocol import strict_json
from peer.protocol.auth import client_ssl_context, server_ssl_context, warn_open_swarm
from peer.protocol.codecs import DenseCodec
from peer.protocol.errors import ProtocolError
from peer.protocol.wire import check_sender
from peer.transport.client import PeerClient, PeerUnavailable, RemoteRefused
from peer.transport.server import Listening, listen

__all__ = [
    "HEALTH_WINDOW_ROUNDS",
    "SCHEDULER_EVERY",
    "VIEW_REFRESH_ROUNDS",
    "JoinError",
    "Peer",
    "StepCallback",
]

logger = logging.getLogger(__name__)

VIEW_REFRESH_ROUNDS = 10
"""Every this many rounds a peer pulls a random neighbour's membership view."""
JOIN_RETRY_FIRST_S = 0.25
"""The first wait before a join is retried; each later wait doubles, up to
:data:`JOIN_RETRY_MAX_S`, and is jittered by a factor in [0.5, 1.5)."""
JOIN_RETRY_MAX_S = 5.0
MEMBERS_KEY = "members"
"""The checkpoint metadata key holding the membership view: JSON ``[{id, address}, ...]``."""
SchedulerEvery = Literal["step", "round"]
SCHEDULER_EVERY: tuple[SchedulerEvery, ...] = ("step", "round")
"""When :meth:`Peer.run` steps a learning-rate scheduler: after every optimizer step, or
after every round (the same with one local step per round)."""

StepCallback = Callable[[int, float], object]
"""``callback(step, loss)``, called after each optimizer step with the new step count and
the loss of that step's batch (NaN if there was none)."""


class Scheduler(Protocol):
    """A learning-rate scheduler: anything with ``step()`` (``torch.optim.lr_scheduler``)."""

    def step(self) -> Any: ...


class _StepHooks:
    """What :meth:`Peer.run` does after each optimizer step (and each round), checked once."""

    def __init__(
        self,
        callbacks: Iterable[StepCallback],
        scheduler: Scheduler | None,
        scheduler_every: SchedulerEvery,
    ) -> None:
        self.callbacks = tuple(callbacks)
        for index, callback in enumerate(self.callbacks):
            if not callable(callback):
                raise ValueError(
                    f"callbacks[{index}] must be callable as callback(step, loss), got "
                    f"{type(callback).__name__}"
                )
        if scheduler is not None and not callable(getattr(scheduler, "step", None)):
            raise ValueError(
                "scheduler must be a learning-rate scheduler with step() "
                f"(torch.optim.lr_scheduler), got {type(scheduler).__name__}"
            )
        if scheduler_every not in SCHEDULER_EVERY:
            raise ValueError(
                f"scheduler_every must be one of {', '.join(SCHEDULER_EVERY)}, "
                f"got {scheduler_every!r}"
            )
        self.per_step = scheduler if scheduler_every == "step" else None
        self.per_round = scheduler if scheduler_every == "round" else None


_NO_HOOKS = _StepHooks((), None, "step")


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


class Peer(ServerHandlers, PairwiseExchange, SyncRound):
    """A gossip-training peer: model, optimizer, data, server, client and membership.

    Args:
        model: the ``nn.Module``; its parameters, and its floating-point buffers
            (BatchNorm running statistics) unless ``PeerConfig.average_buffers`` is off,
            are moved into one flat buffer (``gossip.FlatParameters``) that training,
            mixing and the wire share; every exchange mixes all of it. Integer buffers
            (``num_batches_tracked``) stay local.
        optimizer: a torch optimizer over ``model.parameters()`` (it keeps working: the
            module keeps its ``Parameter`` objects), or a factory ``params -> optimizer``
            that is given ``[flat.parameter]`` (one vector update for the whole model,
            the parameter part only; preferred).
        loss_fn: ``loss_fn(model(inputs), targets) -> scalar tensor``.
        train_data: an iterable of ``(inputs, targets)`` batches, re-iterated forever
            (a ``DataLoader`` reshuffles each pass).
        config: a :class:`~peer.node.config.PeerConfig`.
        recipe: how ``workloads`` rebuilds ``model`` (:class:`peer.app.export.ModelRecipe`);
            recorded in every checkpoint, so ``gossipnet export`` and
            ``peer.app.export.load_model`` can turn a checkpoint into a model. Optional: a
            peer without one still checkpoints and resumes.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | OptimizerFactory,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        train_data: Iterable[Batch],
        config: PeerConfig,
        *,
        recipe: ModelRecipe | None = None,
    ) -> None:
        if not isinstance(config, PeerConfig):
            raise TypeError(f"config must be a PeerConfig, got {type(config).__name__}")
        if recipe is not None and not isinstance(recipe, ModelRecipe):
            raise TypeError(f"recipe must be a ModelRecipe or None, got {type(recipe).__name__}")
        device = resolve_device(config.device)
        trainer = Trainer(
            model, optimizer, loss_fn, train_data, device, buffers=config.average_buffers
        )
        super().__init__(trainer, config)
        self._init_pairwise()
        self._init_sync_round()
        self._listening: Listening | None = None
        self._last_checkpoint_step = -1
        self.recipe = recipe
        """How ``workloads`` rebuilds the model (recorded in checkpoints), or None."""
        self.resumed_from: Path | None = None
        """The checkpoint ``start`` resumed from, or None."""
        self.remembered_members: tuple[str, ...] = ()
        """Addresses of the members the resumed checkpoint recorded (rejoined at start)."""

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Peer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def listening(self) -> Listening | None:
        """Where this peer serves (its port, its open connections); ``None`` for a
        client-only peer or before :meth:`start`."""
        return self._listening

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
        local = self.trainer.local_buffers
        if local:
            logger.warning(
                "peer %s: average_buffers is off; its floating-point buffers stay local and "
                "are never averaged: %s",
                self.peer_id,
                ", ".join(local),
            )
        if config.checkpoint_dir is not None:
            remove_stale_temporaries(config.checkpoint_dir)
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
            self._listening = await listen(
                self, config.host, config.port, ssl_context=server_context
            )
            port = self._listening.port
            self.address = config.advertise or f"{config.host}:{port}"
            self.membership.self_address = check_address(self.address)
        try:
            await self._join_at_start()
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
        if self._listening is not None:
            await self._listening.close()
            self._listening = None

    # ------------------------------------------------------------------ membership

    @property
    def join_timeout_s(self) -> float:
        """How long unreachable join addresses are retried (``PeerConfig.join_timeout_s``)."""
        return self.config.join_timeout_s

    async def _join_at_start(self) -> None:
        """Join ``config.join`` (retried until :attr:`join_timeout_s`), then, or else, the
        members the resumed checkpoint remembered.

        Without ``config.join`` the remembered members are tried once: a restarted
        bootstrap peer whose swarm is gone starts alone (the others will join it). With a
        known peer list (``--topology --peers``) every join is tried once: ranks not up yet
        join us when they start.
        """
        config = self.config
        remembered = [
            a for a in self.remembered_members if a not in config.join and a != self.address
        ]
        if not config.join and not remembered:
            return
        listed = self.topology is not None
        timeout_s = 0.0 if listed or not config.join else self.join_timeout_s
        try:
            await self._join([*config.join, *remembered], timeout_s=timeout_s)
        except JoinError as error:
            if config.join and not listed:
                raise
            why = "the other ranks will join" if listed else "they will find us when they return"
            logger.warning("%s; starting alone, %s", error, why)

    async def _join(self, addresses: Sequence[str], *, timeout_s: float = 0.0) -> None:
        """Join the swarm via the first of ``addresses`` that answers, then announce
        ourselves to every member its view names.

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
                    added = await self._join_one(address)
                except PeerUnavailable as error:
                    reasons[address] = str(error)
                    continue
                except (RemoteRefused, ProtocolError) as error:
                    reasons[address] = str(error)
                    retrying.remove(address)
                    continue
                await self._announce(added)
                if address in reasons:
                    logger.info("peer %s joined via %s", self.peer_id, address)
                return
            left = deadline - loop.time()
            if not retrying or left <= 0:
                raise JoinError(
                    self.peer_id,
                    list(dict.fromkeys(addresses)),
                    reasons,
                    unreachable=retrying,
                    timeout_s=timeout_s,
                )
            if delay == JOIN_RETRY_FIRST_S:
                logger.warning(
                    "peer %s: no answer yet from %s; retrying for up to %g s",
                    self.peer_id,
                    ", ".join(retrying),
                    timeout_s,
                )
            await asyncio.sleep(min(left, delay * random.uniform(0.5, 1.5)))
            delay = min(2 * delay, JOIN_RETRY_MAX_S)

    async def _join_one(self, address: str) -> list[str]:
        """``POST /v1/join`` to ``address``: admit it and merge its view (and copy its model
        if configured and not resumed); returns the ids its view added."""
        answer = await self._client().join(address, self.peer_id, self.address)
        bootstrap = check_sender(answer["id"])
        self.membership.observe(bootstrap, address)
        added = self.membership.merge(answer["peers"])
        if self.config.fetch_state and self.resumed_from is None:
            await self._fetch_state(address, receiver=bootstrap)
        return added

    async def _announce(self, added: Iterable[str]) -> None:
        """Join each newly learned member too, so it knows us (and merge its view)."""
        client = self._client()
        for peer_id in added:
            member = self.membership.get(peer_id)
            if member is not None and member.address is not None:
                with contextlib.suppress(PeerUnavailable, RemoteRefused, ProtocolError):
                    answer = await client.join(
                        member.address, self.peer_id, self.address, receiver=peer_id
                    )
                    self.membership.merge(answer["peers"], source=f"view of {peer_id}")

    async def _fetch_state(self, address: str, *, receiver: str | None = None) -> None:
        envelope = await self._client().state(address, codecs={"none"}, receiver=receiver)
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

    async def _join_listed(self) -> None:
        """With a known peer list (``--topology --peers``), join each listed address that is
        not a member yet: ranks started in any order, or restarted, find each other."""
        if self.topology is None:
            return
        known = {m.address for m in self.membership.members()} | {self.address}
        missing = [a for a in self.config.peer_list if a not in known]
        client = self._client()

        async def join(address: str) -> None:
            with contextlib.suppress(PeerUnavailable, RemoteRefused, ProtocolError):
                answer = await client.join(address, self.peer_id, self.address)
                self.membership.observe(check_sender(answer["id"]), address)
                self.membership.merge(answer["peers"])

        await asyncio.gather(*(join(address) for address in missing))

    async def refresh_view(self) -> None:
        """Pull one random neighbour's membership view and merge it (and, with a known peer
        list, join the listed peers that are not members yet)."""
        await self._join_listed()
        neighbours = self.membership.neighbours()
        if not neighbours:
            return
        member = self._rng.choice(neighbours)
        assert member.address is not None
        try:
            view = await self._client().peers(member.address, receiver=member.id)
            self.membership.merge(view["peers"], source=f"view of {member.id}")
        except (PeerUnavailable, RemoteRefused, ProtocolError) as error:
            self._failed(member, error)

    # ------------------------------------------------------------------ the round loop

    async def run(
        self,
        steps: int,
        *,
        callbacks: Iterable[StepCallback] = (),
        scheduler: Scheduler | None = None,
        scheduler_every: SchedulerEvery = "step",
    ) -> None:
        """Train for at least ``steps`` optimizer steps, gossiping as the round plan says.

        Args:
            steps: optimizer steps to take (whole rounds: a round of ``local_steps`` steps
                is never cut short).
            callbacks: each is called as ``callback(step, loss)`` after every optimizer
                step, in a worker thread, outside the model lock (so it may evaluate or
                log); an exception stops ``run`` and propagates.
            scheduler: a learning-rate scheduler over this peer's optimizer
                (``torch.optim.lr_scheduler.StepLR(peer.optimizer, ...)``), stepped under
                the model lock right after the optimizer step (``scheduler_every="step"``)
                or after each round's exchange (``"round"``).
            scheduler_every: ``"step"`` or ``"round"``.
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        hooks = _StepHooks(callbacks, scheduler, scheduler_every)
        target = self.step + steps
        try:
            while self.step < target:
                await self._run_round(hooks)
        finally:
            # a peer that has finished its steps (or whose run was cancelled) serves its
            # neighbours without the serving share at once: the swarm's last rounds are
            # not refused by peers that merely trained a moment ago
            self.trainer.stopped()

    async def run_round(self) -> None:
        """One round: the phases of ``gossip.RoundPlan`` (gradient, step, exchange)."""
        await self._run_round(_NO_HOOKS)

    async def _run_round(self, hooks: _StepHooks) -> None:
        for phase in self.algorithm.plan.phases():
            if phase == "gradient":
                await asyncio.to_thread(self._gradient)
            elif phase == "step":
                await asyncio.to_thread(self._step, hooks)
            else:
                await self.gossip()
        if hooks.per_round is not None:
            await asyncio.to_thread(self._step_scheduler, hooks.per_round)

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

    def _gradient(self) -> None:
        self.metrics.loss.set(self.trainer.gradient())

    def _step(self, hooks: _StepHooks = _NO_HOOKS) -> None:
        with self.lock:
            self.trainer.optimizer_step()
            if hooks.per_step is not None:
                hooks.per_step.step()
            self._after_step_locked()
        for callback in hooks.callbacks:
            callback(self.step, self.loss)

    def _step_scheduler(self, scheduler: Scheduler) -> None:
        with self.lock:
            scheduler.step()

    def _after_step_locked(self) -> None:
        """Publish the step count and write the checkpoint it is due for (lock held)."""
        self.metrics.step.set(self.step)
        every = self.config.checkpoint_every
        if every and self.step % every == 0:
            self._save_checkpoint_locked()

    def record_step(self, loss: float | torch.Tensor | None = None) -> int:
        """Count one optimizer step that your own code took; returns the new step count.

        For training driven by hand (``with peer.lock: optimizer.step()``, then
        ``await peer.gossip()``): ``/v1/status``, ``/metrics`` and the checkpoints
        (``checkpoint_every``) see the step, and ``loss`` (a number or a scalar tensor,
        optional) as the last training loss. Takes the model lock (not reentrant: call it
        after releasing the lock); call it from a worker thread or the training thread.
        """
        if loss is not None:
            self.record_loss(loss)
        with self.lock:
            self.trainer.record_step()
            self._after_step_locked()
        return self.step

    def record_loss(self, loss: float | torch.Tensor) -> None:
        """Show ``loss`` (a number or a scalar tensor) as the last training loss in
        ``/v1/status`` and ``/metrics``."""
        self.metrics.loss.set(self.trainer.record_loss(loss))

    def evaluate(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        batch_size: int = 1024,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    ) -> Evaluation:
        """Mean loss, and accuracy (argmax) for a classifier, of the current model on
        ``(inputs, targets)`` (:meth:`peer.node.trainer.Trainer.evaluate`).

        ``accuracy`` is None for a model that is not a classifier (outputs ``[N, C]``,
        ``C >= 2``, integer labels), such as a regression model. Runs under the model lock
        in eval mode, ``batch_size`` samples at a time; call it from a worker thread
        (``asyncio.to_thread``) while the peer is serving.
        """
        return self.trainer.evaluate(inputs, targets, batch_size=batch_size, loss_fn=loss_fn)

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self) -> Path:
        with self.lock:
            return self._save_checkpoint_locked()

    def _save_checkpoint_locked(self) -> Path:
        directory = self.config.checkpoint_dir
        if directory is None:
            raise RuntimeError("PeerConfig.checkpoint_dir is not set")
        metadata = {
            MEMBERS_KEY: json.dumps(
                [
                    {"id": m.id, "address": m.address}
                    for m in self.membership.members("alive", "suspected")
                    if m.address is not None
                ]
            )
        }
        if self.recipe is not None:
            metadata[RECIPE_KEY] = json.dumps(self.recipe.to_json())
        path = save_training_state(
            self.trainer,
            directory,
            round=self.round,
            peer_id=self.peer_id,
            keep=self.config.keep_checkpoints,
            metadata=metadata,
        )
        self._last_checkpoint_step = self.step
        return path

    def _resume(self) -> None:
        directory = self.config.checkpoint_dir
        if directory is None:
            raise RuntimeError("PeerConfig.checkpoint_dir is not set")
        loaded = load_training_state(self.trainer, directory)
        if loaded is None:
            logger.warning(
                "peer %s: resume found no checkpoint (checkpoint-*.safetensors) in %s; "
                "starting from scratch at step 0",
                self.peer_id,
                Path(directory).resolve(),
            )
            return
        self.round = loaded.round
        self._last_checkpoint_step = loaded.step
        self.resumed_from = loaded.path
        self.remembered_members = _remembered_members(loaded.metadata.get(MEMBERS_KEY), loaded.path)
        logger.info(
            "peer %s resumed from %s (step %d, %d remembered members)",
            self.peer_id,
            loaded.path,
            loaded.step,
            len(self.remembered_members),
        )


def _remembered_members(text: str | None, path: Path) -> tuple[str, ...]:
    """The member addresses a checkpoint's ``members`` metadata lists; entries that are not
    ``{id, address}`` with a valid ``HOST:PORT`` are skipped (logged once). Checkpoints
    written before members were recorded have none."""
    if text is None:
        return ()
    try:
        entries = strict_json.loads(text.encode(), what=f"{path} members", max_bytes=1 << 20)
    except ProtocolError as error:
        logger.warning("ignoring the members recorded in %s: %s", path, error)
        return ()
    addresses: list[str] = []
    skipped = 0
    for entry in entries if isinstance(entries, list) else [entries]:
        try:
            check_sender(entry["id"])
            addresses.append(check_address(entry["address"]))
        except (TypeError, KeyError, ValueError, ProtocolError):
            skipped += 1
    if skipped:
        logger.warning("ignoring %d malformed member entries recorded in %s", skipped, path)
    return tuple(dict.fromkeys(addresses))
