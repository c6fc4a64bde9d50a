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

A ``Peer`` is composed of parts, built once from its config: the shared
:class:`~peer.node.context.PeerContext` (trainer, codecs, rule and state, topology,
membership, metrics, health, client), one exchange mode picked at construction
(:mod:`peer.node.modes`), the membership protocol (:mod:`peer.node.joins`), the server
handlers (:mod:`peer.node.handlers`) and the checkpoints (:mod:`peer.node.checkpointing`).
This module wires them: the lifecycle (resume, listen, join, checkpoint at stop) and the
round loop. The model copies a peer holds are counted in :mod:`peer.node.modes`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from gossip.compression import node_seed
from peer.node.checkpointing import Checkpointing
from peer.node.config import PeerConfig, resolve_device
from peer.node.context import HEALTH_WINDOW_ROUNDS, PeerContext
from peer.node.handlers import ServerHandlers
from peer.node.hooks import (
    NO_HOOKS,
    SCHEDULER_EVERY,
    Scheduler,
    SchedulerEvery,
    StepCallback,
    StepHooks,
)
from peer.node.joins import VIEW_REFRESH_ROUNDS, JoinError, MembershipProtocol
from peer.node.membership import check_address
from peer.node.modes import build_mode
from peer.node.privacy import PrivateTraining
from peer.node.recipe import ModelRecipe
from peer.node.trainer import Batch, Evaluation, OptimizerFactory, Trainer
from peer.protocol.tls import server_ssl_context
from peer.transport.client import PeerClient
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


class Peer:
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
        recipe: how ``workloads`` rebuilds ``model`` (:class:`peer.node.recipe.ModelRecipe`);
            recorded in every checkpoint, so ``gossipnet export`` and
            ``peer.node.model_file.load_model`` can turn a checkpoint into a model. Optional: a
            peer without one still checkpoints and resumes.

    A ``Peer`` is a ``peer.transport.server.Service`` itself (its server is given its
    :attr:`handlers`, which carry the same attributes).
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
        privacy: PrivateTraining | None = None,
    ) -> None:
        if not isinstance(config, PeerConfig):
            raise TypeError(f"config must be a PeerConfig, got {type(config).__name__}")
        if recipe is not None and not isinstance(recipe, ModelRecipe):
            raise TypeError(f"recipe must be a ModelRecipe or None, got {type(recipe).__name__}")
        device = resolve_device(config.device)
        trainer = Trainer(
            model,
            optimizer,
            loss_fn,
            train_data,
            device,
            buffers=config.average_buffers,
            seed=node_seed(config.seed + 2, config.peer_id),  # dropout masks
        )
        trainer.privacy = self.privacy = privacy
        """DP-SGD (``--dp-*``, :mod:`peer.node.privacy`): the gradient hook and the account."""
        ctx = self.ctx = PeerContext.build(trainer, config)
        """The parts every part of this peer shares (:mod:`peer.node.context`)."""
        self.mode = build_mode(ctx)
        """The exchange mode ``config.mode`` names, picked once (:mod:`peer.node.modes`)."""
        self.joins = MembershipProtocol(ctx)
        """Joins, announcements, view refreshes (:mod:`peer.node.joins`)."""
        self.checkpoints = Checkpointing(ctx, recipe)
        """What is written to ``checkpoint_dir``, and resume (:mod:`peer.node.checkpointing`)."""
        handlers = self.handlers = ServerHandlers(ctx, self.mode)
        """What the server calls (:mod:`peer.node.handlers`)."""
        self._listening: Listening | None = None
        self._goodbye_due = False
        """Joined and not yet said goodbye (:meth:`stop`)."""
        # the shared parts, under the names tests, examples and applications use
        self.config = config
        self.peer_id = config.peer_id
        self.device = trainer.device
        self.trainer = trainer
        """Local training: batches, gradient, optimizer step, evaluation (:mod:`peer.node.trainer`)."""
        self.model = trainer.model
        self.flat = trainer.flat
        self.optimizer = trainer.optimizer
        self.loss_fn = trainer.loss_fn
        self.train_data = trainer.train_data
        self.lock = trainer.lock
        """Guards the model, gradient and optimizer: hold it while training by hand."""
        self.spec = ctx.spec
        self.message_spec = ctx.message_spec
        self.codec = ctx.codec
        self.codecs = ctx.codecs
        self.algorithm = ctx.algorithm
        self.aggregator = ctx.algorithm.aggregator
        self.gossip_state = ctx.gossip_state
        self.topology = ctx.topology
        self.secret = ctx.secret
        self.verifier = ctx.verifier
        self.metrics = ctx.metrics
        self.attack = ctx.attack
        self.health = ctx.health
        """Exchanges that succeeded / failed per round; isolation (:mod:`peer.node.health`)."""
        self.membership = ctx.membership
        # the server's view of this peer (peer.transport.server.Service), as the handlers'
        self.max_body_bytes = handlers.max_body_bytes
        self.max_concurrent_exchanges = handlers.max_concurrent_exchanges
        self.body_timeout_s = handlers.body_timeout_s
        self.max_connections = handlers.max_connections
        self.max_unauthenticated_bytes = handlers.max_unauthenticated_bytes
        self.idle_timeout_s = handlers.idle_timeout_s
        self.retains_messages = handlers.retains_messages
        self.pin_buffers = handlers.pin_buffers
        self.serving_share = handlers.serving_share
        # what the server calls, answered by the handlers
        self.on_exchange = handlers.on_exchange
        self.on_join = handlers.on_join
        self.on_leave = handlers.on_leave
        self.peers_view = handlers.peers_view
        self.state_envelope = handlers.state_envelope
        self.status = handlers.status
        self.render_metrics = handlers.render_metrics
        if privacy is not None:
            self.metrics.track_privacy(lambda: privacy.epsilon)

    # ------------------------------------------------------------------ what changes

    @property
    def round(self) -> int:
        """Exchange phases run (restored from the checkpoint on resume)."""
        return self.ctx.round

    @round.setter
    def round(self, value: int) -> None:
        self.ctx.round = value

    @property
    def step(self) -> int:
        """Optimizer steps taken (the trainer's count)."""
        return self.trainer.step

    @step.setter
    def step(self, value: int) -> None:
        self.trainer.step = value

    @property
    def loss(self) -> float:
        """The loss of the last training batch (NaN before the first)."""
        return self.trainer.loss

    @property
    def address(self) -> str | None:
        """``HOST:PORT`` where this peer is reached (None before start, or client-only)."""
        return self.ctx.address

    @property
    def client(self) -> PeerClient | None:
        """The client its calls go through (made by :meth:`start`)."""
        return self.ctx.client

    @property
    def recipe(self) -> ModelRecipe | None:
        """How ``workloads`` rebuilds the model (recorded in checkpoints), or None."""
        return self.checkpoints.recipe

    @property
    def resumed_from(self) -> Path | None:
        """The checkpoint ``start`` resumed from, or None."""
        return self.checkpoints.resumed_from

    @property
    def remembered_members(self) -> tuple[str, ...]:
        """Addresses of the members the resumed checkpoint recorded (rejoined at start)."""
        return self.checkpoints.remembered_members

    @property
    def join_timeout_s(self) -> float:
        """How long unreachable join addresses are retried (``PeerConfig.join_timeout_s``)."""
        return self.config.join_timeout_s

    @property
    def listening(self) -> Listening | None:
        """Where this peer serves (its port, its open connections); ``None`` for a
        client-only peer or before :meth:`start`."""
        return self._listening

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Peer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Resume (if configured), listen (unless client-only), and join the swarm."""
        config, ctx = self.config, self.ctx
        self.mode.start()
        ctx.warn_at_start()
        self.checkpoints.remove_stale_temporaries()
        if config.resume:
            self.checkpoints.resume()
        ctx.open_client()
        if not config.client_only:
            server_context = None
            if config.tls_cert is not None and config.tls_key is not None:
                server_context = server_ssl_context(
                    config.tls_cert, config.tls_key, cafile=config.tls_ca
                )
            self._listening = await listen(
                self.handlers,
                config.host,
                config.port,
                ssl_context=server_context,
                link=ctx.link,
            )
            ctx.address = config.advertise or f"{config.host}:{self._listening.port}"
            self.membership.self_address = check_address(ctx.address)
        try:
            await self.joins.join_at_start(
                self.remembered_members, resumed=self.resumed_from is not None
            )
        except BaseException:
            await self.stop()
            raise
        self._goodbye_due = True
        logger.info("peer %s started at %s", self.peer_id, self.address or "(client-only)")

    async def stop(self, *, goodbye: bool = True) -> None:
        """Checkpoint (if configured), say goodbye to the neighbours once (``POST /v1/leave``:
        they mark this peer left, not failed), close connections, stop listening.
        ``goodbye=False`` leaves without a word, as a crash would (its neighbours suspect
        and evict it)."""
        if self.checkpoints.due_at_stop:
            await asyncio.to_thread(self.checkpoints.save)
        if goodbye and self._goodbye_due:
            await self.joins.say_goodbye()
        self._goodbye_due = False
        if self.client is not None:
            await self.client.close()
        if self._listening is not None:
            await self._listening.close()
            self._listening = None

    async def settle(self) -> None:
        """Hand the rule the messages that arrived after this peer's last round (sync mode).

        Call it once the swarm has stopped exchanging and before reading the final model:
        push-sum adds the late mass and CHOCO the late increments (``late`` of the rule),
        so nothing sent is left out; D-PSGD drops them, as it does every round. An async
        peer has nothing to settle.

        Raises:
            RuntimeError: the peer is not started.
        """
        self.ctx.started_client()
        await self.mode.settle()

    # ------------------------------------------------------------------ membership

    async def wait_for_members(self, count: int, *, timeout_s: float = 60.0) -> bool:
        """Wait until ``count`` other members are alive, pulling views meanwhile; False (and
        the peer goes on) if ``timeout_s`` passes first (:mod:`peer.node.joins`)."""
        return await self.joins.wait_for_members(count, timeout_s=timeout_s)

    async def refresh_view(self) -> None:
        """Pull one random neighbour's membership view and merge it (and, with a known peer
        list, join the listed peers that are not members yet)."""
        await self.joins.refresh_view()

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
        hooks = StepHooks(callbacks, scheduler, scheduler_every)
        target = self.step + steps
        per_round = self.algorithm.plan.phases().count("gradient")
        try:
            while self.step < target:
                if self.privacy is not None and self.privacy.exhausted(per_round, self.step):
                    break  # the privacy budget is spent (a warning said so)
                await self._run_round(hooks)
        finally:
            # a peer that has finished its steps (or whose run was cancelled) serves its
            # neighbours without the serving share at once: the swarm's last rounds are
            # not refused by peers that merely trained a moment ago
            self.trainer.stopped()

    async def run_round(self) -> None:
        """One round: the phases of ``gossip.RoundPlan`` (gradient, step, exchange)."""
        await self._run_round(NO_HOOKS)

    async def _run_round(self, hooks: StepHooks) -> None:
        slowdown = self.ctx.slowdown
        for phase in self.algorithm.plan.phases():
            if phase == "gradient":  # each compute phase timed, then stretched (a straggler)
                await slowdown.stretch(await asyncio.to_thread(slowdown.timed, self._gradient))
            elif phase == "step":
                await slowdown.stretch(await asyncio.to_thread(slowdown.timed, self._step, hooks))
            else:
                await self.gossip()
        if hooks.per_round is not None:
            await asyncio.to_thread(self._step_scheduler, hooks.per_round)

    async def gossip(self) -> int:
        """One exchange phase in the configured mode; returns how many neighbours took part."""
        done = await self.mode.exchange()
        self.ctx.round += 1
        self.metrics.round.set(self.round)
        self.health.end_round()
        if self.round % VIEW_REFRESH_ROUNDS == 0:
            await self.joins.refresh_view()
        return done

    def _gradient(self) -> None:
        self.metrics.loss.set(self.trainer.gradient())

    def _step(self, hooks: StepHooks) -> None:
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
        self.checkpoints.after_step_locked()

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
