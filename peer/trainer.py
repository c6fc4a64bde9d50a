"""``Trainer``: a peer's local training, under the model lock the exchanges share.

One object owns what local SGD needs, and nothing of the network: the model (its
parameters moved into one flat buffer, ``gossip.FlatParameters``, that training,
mixing and the wire share), the optimizer, the loss, the endless stream of batches,
the step count and the last loss. Every access to the model goes through ``lock``,
which the exchanges take too, so a gradient, an optimizer step and a mix never
interleave::

    trainer = Trainer(model, lambda params: torch.optim.SGD(params, lr=0.1),
                      torch.nn.functional.cross_entropy, loader, torch.device("cpu"))
    trainer.gradient()                       # takes the lock
    with trainer.lock:
        trainer.optimizer_step()             # the caller holds the lock
    trainer.evaluate(x_test, y_test)         # takes the lock, eval mode

The methods block (they run on tensors): a :class:`~peer.node.Peer` calls them
from worker threads (``asyncio.to_thread``), never on its event loop.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from gossip.flat import FlatParameters

Batch = tuple[Any, Any]
OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]


def _to(value: Any, device: torch.device) -> Any:
    """A batch element moved to ``device`` (tensors only; anything else as is)."""
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value


class Trainer:
    """Local training of one model: batches, gradient, optimizer step, evaluation.

    Args:
        model, optimizer, loss_fn, train_data: as :class:`~peer.node.Peer` takes them
            (the optimizer factory is given ``[flat.parameter]``; ``train_data`` is
            re-iterated forever).
        device: where the model lives (it is moved there); batches are moved there too.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | OptimizerFactory,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        train_data: Iterable[Batch],
        device: torch.device,
    ) -> None:
        self.device = device
        self.model = model.to(device)
        self.flat = FlatParameters(self.model)
        if isinstance(optimizer, torch.optim.Optimizer):
            self.optimizer = optimizer
        elif callable(optimizer):
            self.optimizer = optimizer([self.flat.parameter])
        else:
            raise TypeError("optimizer must be a torch optimizer or a factory params -> optimizer")
        self.loss_fn = loss_fn
        self.train_data = train_data
        self.lock = threading.Lock()
        """Guards the model, gradient and optimizer: hold it while training by hand."""
        self.step = 0
        """Optimizer steps taken (restored from a checkpoint on resume)."""
        self.loss = math.nan
        """The loss of the last gradient's batch (NaN before the first)."""
        self._batches: Iterator[Batch] | None = None
        self.last_step_at: float | None = None
        """``time.monotonic()`` of the last optimizer step (None before the first)."""

    def next_batch(self) -> Batch:
        """The next ``(inputs, targets)`` of ``train_data``, starting a new pass at its end."""
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

    def gradient(self) -> float:
        """The gradient of the loss on the next batch, into the flat gradient (under the
        lock); returns that loss, also kept as ``loss``."""
        inputs, targets = self.next_batch()
        if self.device.type != "cpu":
            inputs, targets = _to(inputs, self.device), _to(targets, self.device)
        with self.lock:
            self.flat.zero_grad()
            loss = self.loss_fn(self.model(inputs), targets)
            loss.backward()
        self.loss = float(loss.detach())
        return self.loss

    def optimizer_step(self) -> int:
        """One optimizer step with the current gradient; returns the new step count.

        The caller holds ``lock`` (so it can checkpoint the stepped model before any
        exchange moves it).
        """
        self.optimizer.step()
        self.step += 1
        self.last_step_at = time.monotonic()
        return self.step

    def training(self, within_s: float = 1.0) -> bool:
        """Whether an optimizer step was taken in the last ``within_s`` seconds."""
        return self.last_step_at is not None and time.monotonic() - self.last_step_at < within_s

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
