"""``BackgroundPeer``: gossip from an ordinary synchronous PyTorch training loop.

Most training loops are plain Python: a ``DataLoader``, ``loss.backward()``,
``optimizer.step()``. :class:`BackgroundPeer` wraps the model and the optimizer such a
loop already has, runs a :class:`~peer.node.peer.Peer` (server, joins, membership, exchanges)
on its own asyncio event loop in a background thread, and gossips after every
``gossip_every``-th ``optimizer.step()``. The loop itself does not change and has no
``async`` in it::

    model = Net()                                   # BatchNorm welcome: buffers are averaged
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    config = PeerConfig(peer_id="a", join=("10.0.0.2:7000",), secret_file="swarm.secret")
    with BackgroundPeer(model, optimizer, config) as swarm:   # starts the thread and joins
        for epoch in range(3):
            for x, y in loader:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()        # steps, then gossips (every gossip_every steps)
                swarm.report(loss)      # optional: the loss /v1/status and /metrics show
                scheduler.step()
    # leaving the block stops the peer: final checkpoint and log record, server closed

What it does, and the rules it keeps:

* **The model.** Its parameters, and its floating-point buffers (BatchNorm running
  statistics) unless ``PeerConfig.average_buffers`` is off, become views into one flat
  vector (``gossip.FlatParameters``) that every exchange mixes. The module keeps its
  ``Parameter`` objects, so the optimizer built on ``model.parameters()`` beforehand, its
  state (momentum, Adam's moments) and any learning-rate scheduler keep working; the
  optimizer steps only the parameters. Integer buffers (``num_batches_tracked``) stay
  local. Do not move or cast the model after wrapping it.
* **When it gossips.** ``optimizer.step`` is wrapped on this optimizer object (so
  schedulers and ``GradScaler`` created before or after keep working): the step runs
  under the peer's model lock, the same lock every mix takes, so an exchange never
  sees, nor writes into, a half-stepped model; then the step is counted and, every
  ``gossip_every`` steps, one exchange phase (``Peer.gossip``) runs on the background
  loop. The exchange follows the step (adapt-then-combine) whatever ``PeerConfig.order``
  says: your loop takes the gradient itself.
* **What blocks.** Synchronous algorithms (``dpsgd``, ``local-sgd``, ``push-sum``,
  ``choco``: ``mode="sync"``) mix in rounds that every neighbour takes part in, so
  ``optimizer.step()`` waits for its round (at most ``round_deadline_s``). With
  ``ad-psgd`` (``mode="async"``) the exchange overlaps with your next steps, as in Lian
  et al. (ICML 2018); one exchange at most is in flight: when the next is due and the
  previous has not finished, ``optimizer.step()`` waits for it (a slow network slows
  training rather than queueing exchanges without bound). :meth:`wait` waits for it.
* **Errors.** An exception in the background thread (an exchange, the peer's start or
  stop) is raised in your thread: by ``start``/``with``, by the ``optimizer.step()``,
  :meth:`report` or :meth:`wait` after it, or at the latest by :meth:`close`. Network
  failures of single exchanges are not errors: they are counted, and a peer whose
  exchanges all fail for ``HEALTH_WINDOW_ROUNDS`` rounds logs a warning that it is
  training alone (``isolated`` in its status), as every peer does.
* **Threads.** Two besides yours: the event loop's, and the worker threads it runs
  tensor work in. Do not call ``optimizer.step()`` while holding :attr:`lock` (it is
  not reentrant); take the lock to read a model no exchange moves meanwhile.
* **Stopping.** :meth:`close` (or leaving the ``with`` block) waits for the exchange in
  flight, settles late sync messages (push-sum, CHOCO), writes the final checkpoint
  (``checkpoint_dir``) and log record, stops the server and the thread, and restores
  ``optimizer.step``. It is idempotent. The thread is a daemon: a program that never
  closes still exits, but without those last writes.
* **Records.** With ``PeerConfig.log_dir`` the status (step, loss, bytes, exchanges) is
  recorded every ``log_every`` steps and at close, through :class:`peer.node.logbook.Logbook`
  (TensorBoard event files and ``metrics.csv``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch

from peer.node.config import PeerConfig, resolve_device
from peer.node.model_lock import ModelLock
from peer.node.peer import Peer
from peer.node.step_wrap import StepWrap
from peer.node.trainer import Evaluation, LossFunction

if TYPE_CHECKING:
    from peer.node.logbook import Logbook

__all__ = ["BackgroundPeer"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
State = Literal["new", "running", "closed"]


def _trained_by_your_loop(output: Any, target: Any) -> torch.Tensor:
    raise RuntimeError(
        "a BackgroundPeer's model is trained by your own loop; pass loss_fn= to evaluate"
    )


def _int_at_least(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _model_device(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    raise ValueError("model has no parameters to train or gossip")


def _same_device(wanted: torch.device, actual: torch.device) -> bool:
    return wanted.type == actual.type and (wanted.index is None or wanted.index == actual.index)


class BackgroundPeer:
    """A gossip peer for a synchronous training loop, running in a background thread.

    See the module docstring for the rules (what blocks, threads, errors, stopping).

    Args:
        model: your ``nn.Module``, where your loop keeps it (CPU or GPU).
        optimizer: your optimizer, built on ``model.parameters()``.
        config: the peer's :class:`~peer.node.config.PeerConfig` (identity, joins, algorithm,
            secret, checkpoints, ``average_buffers``, ``log_dir``). ``device="auto"`` means
            the model's device; another device must be the model's.
        gossip_every: exchange after every this many optimizer steps (>= 1); default
            ``config.local_steps`` (1, or local SGD's H).
        log_every: with ``config.log_dir``, record the status every this many steps.

    Raises:
        ValueError: an argument is of the wrong kind or out of range (named), the
            optimizer steps tensors that are not the model's, or ``config.device`` is not
            where the model is.

    Attributes:
        peer: the :class:`~peer.node.peer.Peer` (its ``status()``, ``health``, ``membership``;
            its coroutines belong to the background loop).
        gossip_every: steps per exchange.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: PeerConfig,
        *,
        gossip_every: int | None = None,
        log_every: int = 10,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(
                "optimizer must be a torch.optim.Optimizer built on model.parameters(), got "
                f"{type(optimizer).__name__}"
            )
        if not isinstance(config, PeerConfig):
            raise ValueError(f"config must be a PeerConfig, got {type(config).__name__}")
        if config.slowdown != 1:
            raise ValueError(
                f"PeerConfig.slowdown is {config.slowdown:g}, but a BackgroundPeer's steps are "
                "your loop's (it cannot time them); emulate a straggler with Peer.run or "
                "gossipnet peer --slowdown, or slow your own loop"
            )
        local_steps = config.local_steps or 1
        if gossip_every is None:
            gossip_every = local_steps
        _int_at_least("gossip_every", gossip_every, 1)
        if local_steps > 1 and gossip_every != local_steps:
            raise ValueError(
                f"gossip_every={gossip_every} contradicts PeerConfig.local_steps="
                f"{local_steps} (the steps between exchanges); give one of them"
            )
        self.gossip_every = gossip_every
        self.log_every = _int_at_least("log_every", log_every, 1)
        device = _model_device(model)
        if config.device == "auto":
            config = dataclasses.replace(config, device=str(device))
        elif not _same_device(resolve_device(config.device), device):
            raise ValueError(
                f"PeerConfig.device is {config.device!r} but the model is on {device}; a "
                f"BackgroundPeer leaves the model where your loop put it: give device='auto' "
                f"or {str(device)!r}"
            )
        self.optimizer = optimizer
        self.peer = Peer(model, optimizer, _trained_by_your_loop, (), config)
        self._state: State = "new"
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._stop_error: BaseException | None = None
        self._pending: concurrent.futures.Future[int] | None = None
        self._logbook: Logbook | None = None
        self._step_wrap = StepWrap(optimizer, self._step)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> BackgroundPeer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> BackgroundPeer:
        """Open the log (``log_dir``), start the background thread and its event loop,
        start the peer there (resume, listen, join; join errors are raised here), then wrap
        ``optimizer.step``. Returns ``self``."""
        if self._state != "new":
            raise RuntimeError(
                f"BackgroundPeer {self.peer.peer_id} was already started; make a new one to "
                "start again"
            )
        self._state = "running"
        config = self.peer.config
        try:
            if config.log_dir is not None:
                from peer.node.logbook import Logbook

                self._logbook = Logbook.open(config.log_dir, run_name=config.peer_id)
            self._thread = threading.Thread(
                target=self._serve, name=f"gossipnet-peer-{config.peer_id}", daemon=True
            )
            self._thread.start()
            self._ready.wait()
            if self._start_error is not None:
                raise self._start_error
        except BaseException:
            self._shutdown()
            self._state = "closed"
            raise
        self._step_wrap.install()
        return self

    def close(self) -> None:
        """Stop: wait for the exchange in flight, restore ``optimizer.step``, settle (sync),
        final checkpoint, stop the server and the thread, write the last log record and
        close the log. Idempotent; raises the first error the background met meanwhile."""
        if self._state == "closed":
            return
        if self._state == "new":
            self._state = "closed"
            return
        self._state = "closed"
        errors: list[BaseException] = []
        try:
            self.wait()
        except Exception as error:
            errors.append(error)
        finally:
            self._step_wrap.uninstall()
            self._shutdown()
        if self._stop_error is not None:
            errors.append(self._stop_error)
        if errors:
            raise errors[0]

    def _shutdown(self) -> None:
        """Stop the loop (which stops the peer), join the thread, then record and close the
        log; errors of the log are raised, the peer's are kept in ``_stop_error``."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join()
        logbook, self._logbook = self._logbook, None
        if logbook is not None:
            try:
                if self._start_error is None:
                    logbook.record_status(self.peer.status())
            finally:
                logbook.close()

    def _serve(self) -> None:
        """The background thread: the peer's event loop, until :meth:`close`."""
        try:
            asyncio.run(self._main())
        except BaseException as error:  # asyncio.run itself failed
            if self._stop_error is None:
                self._stop_error = error
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        try:
            await self.peer.start()
        except BaseException as error:  # raised again by start(), in the user's thread
            self._start_error = error
            with contextlib.suppress(Exception):
                await self.peer.stop()  # whatever start had opened
            return
        try:
            self._ready.set()
            await self._stopping.wait()
            if self.peer.config.mode == "sync":
                await self.peer.settle()
        finally:
            try:
                await self.peer.stop()
            except BaseException as error:
                self._stop_error = error

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._loop is None or self._state != "running":
            coroutine.close()
            raise RuntimeError(
                f"BackgroundPeer {self.peer.peer_id} is not running: use it in a with block "
                "or call start() first"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    # ------------------------------------------------------------------ the step

    def _step(
        self, inner: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Your ``optimizer.step()``: under the model lock, counted, then the exchange."""
        if self._state != "running":
            return inner(*args, **kwargs)
        self._raise_if_failed()
        with self.peer.lock:
            result = inner(*args, **kwargs)
        step = self.peer.record_step()
        if step % self.gossip_every == 0:
            self._exchange()
        if self._logbook is not None and step % self.log_every == 0:
            self._logbook.record_status(self.status())
        return result

    def _exchange(self) -> None:
        """One exchange phase on the background loop; waits for it in sync mode, and for
        the previous one (at most one in flight) in async mode."""
        self.wait()
        future = self._call(self.peer.gossip())
        self._pending = future
        if self.waits_for_exchange:
            self.wait()

    def _raise_if_failed(self) -> None:
        """Raise the error of a finished exchange, here in the caller's thread."""
        pending = self._pending
        if pending is not None and pending.done():
            self._pending = None
            pending.result()

    # ------------------------------------------------------------------ the user's calls

    @property
    def waits_for_exchange(self) -> bool:
        """Whether ``optimizer.step()`` waits for its exchange: True for sync rounds
        (``mode="sync"``), False for AD-PSGD, whose exchange overlaps with the next steps."""
        return self.peer.config.mode == "sync"

    @property
    def lock(self) -> ModelLock:
        """The model lock every step and every mix takes: hold it to read a model that no
        exchange moves meanwhile (never while calling ``optimizer.step()``)."""
        return self.peer.lock

    @property
    def step(self) -> int:
        """Optimizer steps counted (restored from the checkpoint on resume)."""
        return self.peer.step

    @property
    def round(self) -> int:
        """Exchange phases run."""
        return self.peer.round

    @property
    def address(self) -> str | None:
        """``HOST:PORT`` where the peer listens (None before start, or client-only)."""
        return self.peer.address

    def report(self, loss: float | torch.Tensor) -> None:
        """Show ``loss`` (a number or a scalar tensor) as the last training loss in
        ``/v1/status``, ``/metrics`` and the log; raises a background error first, if any."""
        self._raise_if_failed()
        self.peer.record_loss(loss)

    def wait(self) -> int:
        """Wait for the exchange in flight, if any (async mode); returns how many neighbours
        it exchanged with (0 if none was in flight) and raises its error, if it failed."""
        pending = self._pending
        if pending is None:
            return 0
        try:
            return pending.result()
        finally:
            if pending.done():  # kept if the wait was interrupted (Ctrl-C): close cancels it
                self._pending = None

    def wait_for_members(self, count: int, *, timeout_s: float = 60.0) -> bool:
        """Block until ``count`` other members are alive, so that this peer does not train
        alone before the swarm has formed (``Peer.wait_for_members``); returns False, with
        a warning, if ``timeout_s`` passes first."""
        _int_at_least("count", count, 0)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise ValueError(f"timeout_s must be a number of seconds >= 0, got {timeout_s!r}")
        return self._call(self.peer.wait_for_members(count, timeout_s=timeout_s)).result()

    def status(self) -> dict[str, Any]:
        """The ``GET /v1/status`` object, read on the peer's loop (directly once closed)."""
        if self._state != "running":
            return self.peer.status()

        async def read() -> dict[str, Any]:
            return self.peer.status()

        return self._call(read()).result()

    def evaluate(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        loss_fn: LossFunction,
        *,
        batch_size: int = 1024,
    ) -> Evaluation:
        """Mean loss, and accuracy for a classifier (else None), of the model on
        ``(inputs, targets)`` (and bits per byte for a language model), under the model lock
        in eval mode
        (:meth:`peer.node.trainer.Trainer.evaluate`); recorded in the log with the status."""
        result = self.peer.evaluate(inputs, targets, batch_size=batch_size, loss_fn=loss_fn)
        if self._logbook is not None:
            self._logbook.record_status(
                self.status(),
                test_loss=result["loss"],
                accuracy=result["accuracy"],
                bits_per_byte=result["bits_per_byte"],  # None (not a language model): blank
            )
        return result
