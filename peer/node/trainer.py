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

The methods block (they run on tensors): a :class:`~peer.node.peer.Peer` calls them
from worker threads (``asyncio.to_thread``), never on its event loop.

With ``buffers=True`` the model's floating-point buffers (BatchNorm running statistics)
are part of the flat vector after the parameters, so every exchange mixes them; the
optimizer still steps only the parameters (a factory is given ``[flat.parameter]``, the
parameter part; an optimizer you built steps the module's own parameters). Integer
buffers (``num_batches_tracked``) always stay local.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypedDict

import torch

from gossip.flat import FlatParameters, averageable
from peer.node.model_lock import ModelLock
from peer.node.privacy import PrivateTraining
from workloads.dropout import SeededDropout
from workloads.task import bits_per_byte
from workloads.task import evaluate as evaluate_task

Batch = tuple[Any, Any]
OptimizerFactory = Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]
LossFunction = Callable[[Any, Any], torch.Tensor]


class Evaluation(TypedDict):
    """What :meth:`Trainer.evaluate` returns.

    ``accuracy`` is None where it means nothing: a model that is neither a classifier
    (see :func:`is_classification`) nor a language model (:func:`is_language_model`; its
    accuracy is next-token top-1), such as a regression model. ``bits_per_byte`` is the
    loss in bits (``loss / ln 2``, :func:`workloads.task.bits_per_byte`) for a language
    model, else None.
    """

    loss: float
    accuracy: float | None
    bits_per_byte: float | None
    samples: int


def is_classification(output: torch.Tensor, targets: torch.Tensor) -> bool:
    """Whether argmax accuracy means something for ``output`` and ``targets``: outputs
    ``[N, C]`` with ``C >= 2`` classes and integer class labels ``[N]`` as targets.

    A regression model (one output per sample, or float targets) is not a classifier; a
    single logit ``[N, 1]`` (binary cross entropy) is not either (its argmax is always 0).
    """
    integer = not targets.is_floating_point() and not targets.is_complex()
    return (
        output.dim() == 2
        and output.shape[1] >= 2
        and integer
        and targets.dtype != torch.bool
        and targets.dim() == 1
    )


def is_language_model(output: torch.Tensor, targets: torch.Tensor) -> bool:
    """Whether ``output`` and ``targets`` are a language model's: logits ``[N, L, V]`` with
    ``V >= 2`` and integer next tokens ``[N, L]`` (:data:`workloads.task.LANGUAGE_MODEL`)."""
    integer = not targets.is_floating_point() and not targets.is_complex()
    return (
        output.dim() == 3
        and targets.dim() == 2
        and tuple(output.shape[:2]) == tuple(targets.shape)
        and output.shape[2] >= 2
        and integer
        and targets.dtype != torch.bool
    )


def _check_optimizer_parameters(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    """An optimizer you built must step ``model``'s own parameters (the ones the flat buffer
    is made of); one over other tensors would train something the peer never ships."""
    own = {id(p) for p in model.parameters()}
    foreign = [
        index
        for index, p in enumerate(p for group in optimizer.param_groups for p in group["params"])
        if id(p) not in own
    ]
    if foreign:
        raise ValueError(
            f"optimizer: {len(foreign)} of its parameters (index {foreign[0]} first) are not "
            "the model's; build it on model.parameters() (before wrapping), or pass a "
            "factory params -> optimizer"
        )


def _to(value: Any, device: torch.device) -> Any:
    """A batch element moved to ``device`` (tensors only; anything else as is)."""
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value


class Trainer:
    """Local training of one model: batches, gradient, optimizer step, evaluation.

    Args:
        model, optimizer, loss_fn, train_data: as :class:`~peer.node.peer.Peer` takes them
            (the optimizer factory is given ``[flat.parameter]``; an optimizer must be over
            ``model.parameters()``, built before or after wrapping: the module keeps its
            ``Parameter`` objects; ``train_data`` is re-iterated forever).
        device: where the model lives (it is moved there); batches are moved there too.
        buffers: also carry the model's floating-point buffers in the flat vector
            (``PeerConfig.average_buffers``), so they are shipped and mixed.
        seed: seeds the dropout masks of :meth:`gradient` (``F.dropout`` and
            ``F.dropout1d/2d/3d``, :class:`workloads.dropout.SeededDropout`) from a generator
            of the trainer's own, so the same seed draws the same masks whatever other peers
            or threads of the process draw; a peer passes one derived from its seed and id.
            None: they draw from torch's global generator.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | OptimizerFactory,
        loss_fn: LossFunction,
        train_data: Iterable[Batch],
        device: torch.device,
        *,
        buffers: bool = False,
        seed: int | None = None,
    ) -> None:
        self.device = device
        self.generator: torch.Generator | None = None
        """The dropout masks' generator (None: torch's global one)."""
        if seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(seed)
        self.model = model.to(device)
        self.flat = FlatParameters(self.model, buffers=buffers)
        if isinstance(optimizer, torch.optim.Optimizer):
            _check_optimizer_parameters(optimizer, self.model)
            self.optimizer = optimizer
        elif callable(optimizer):
            self.optimizer = optimizer([self.flat.parameter])
        else:
            raise TypeError("optimizer must be a torch optimizer or a factory params -> optimizer")
        self.loss_fn = loss_fn
        self.train_data = train_data
        self.lock = ModelLock()
        """Guards the model, gradient and optimizer: hold it while training by hand."""
        self.step = 0
        """Optimizer steps taken (restored from a checkpoint on resume)."""
        self.loss = math.nan
        """The loss of the last gradient's batch (NaN before the first)."""
        self._batches: Iterator[Batch] | None = None
        self.last_step_at: float | None = None
        """``time.monotonic()`` of the last optimizer step (None before the first)."""
        self.privacy: PrivateTraining | None = None
        """DP-SGD: when set, :meth:`gradient` takes its private gradient (per-sample clipped,
        noised; :mod:`peer.node.privacy`) instead of ``loss.backward()``."""

    @property
    def local_buffers(self) -> tuple[str, ...]:
        """Buffers that could be averaged (``gossip.flat.averageable``: floating point and
        finite) but stay outside the flat vector because ``buffers=False``: each peer keeps
        its own; empty when they are mixed or there are none. Integer counters and
        non-finite masks are never averaged, so they are not listed."""
        in_flat = set(self.flat.layout.names)
        return tuple(
            name
            for name, buffer in self.model.named_buffers()
            if averageable(buffer) and name not in in_flat
        )

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
            if self.privacy is not None:  # DP-SGD's gradient of step `step` (its noise key)
                self.loss = self.privacy.gradient_into(
                    self.model, self.loss_fn, inputs, targets, self.step, self.flat.grad
                )
                return self.loss
            if self.generator is None:
                loss = self.loss_fn(self.model(inputs), targets)
            else:
                with SeededDropout(self._uniform):
                    loss = self.loss_fn(self.model(inputs), targets)
            loss.backward()
        self.loss = float(loss.detach())
        return self.loss

    def _uniform(self, shape: Sequence[int], device: torch.device) -> torch.Tensor:
        return torch.rand(list(shape), generator=self.generator, device=device)

    def optimizer_step(self) -> int:
        """One optimizer step with the current gradient; returns the new step count.

        The caller holds ``lock`` (so it can checkpoint the stepped model before any
        exchange moves it).
        """
        self.optimizer.step()
        return self.record_step()

    def record_step(self) -> int:
        """Count one optimizer step (taken here or by the caller's own loop); returns the
        new step count."""
        self.step += 1
        self.last_step_at = time.monotonic()
        return self.step

    def record_loss(self, loss: float | torch.Tensor) -> float:
        """Keep ``loss`` (a number or a scalar tensor) as the last training loss; returns it
        as a float."""
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise ValueError(
                    f"loss must be a scalar, got a tensor of shape {tuple(loss.shape)}"
                )
            value = float(loss.detach())
        elif isinstance(loss, int | float) and not isinstance(loss, bool):
            value = float(loss)
        else:
            raise ValueError(f"loss must be a number or a scalar tensor, got {type(loss).__name__}")
        self.loss = value
        return value

    def training(self, within_s: float = 1.0) -> bool:
        """Whether an optimizer step was taken in the last ``within_s`` seconds (and
        :meth:`stopped` was not called since)."""
        return self.last_step_at is not None and time.monotonic() - self.last_step_at < within_s

    def stopped(self) -> None:
        """Training stopped (the steps asked for are taken): :meth:`training` is false
        until the next step, instead of for ``within_s`` more seconds."""
        self.last_step_at = None

    def evaluate_task(
        self, inputs: torch.Tensor, targets: torch.Tensor, task: str
    ) -> dict[str, float]:
        """The metrics of ``task`` (:func:`workloads.task.evaluate`: its loss, accuracy, bits
        per byte or mean squared error, named as every runner names them) of the current
        model on ``(inputs, targets)``, under the model lock in eval mode; what ``gossipnet
        peer`` reports. Call it from a worker thread while the peer is serving."""
        with self.lock:
            return evaluate_task(self.model, inputs, targets, task, device=self.device)

    def evaluate(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        *,
        batch_size: int = 1024,
        loss_fn: LossFunction | None = None,
    ) -> Evaluation:
        """Mean loss, and accuracy (argmax) for a classifier, of the current model on
        ``(inputs, targets)``; for a language model also bits per byte.

        ``accuracy`` is reported only where it means something: outputs ``[N, C]`` with
        ``C >= 2`` and integer class labels as targets (:func:`is_classification`), or a
        language model's logits ``[N, L, V]`` and next tokens ``[N, L]``
        (:func:`is_language_model`: next-token accuracy over all N·L positions, and
        ``bits_per_byte``); otherwise (a regression model) it is None. ``loss_fn`` replaces the trainer's loss
        for this evaluation. Runs under the model lock in eval mode, ``batch_size`` samples
        at a time; call it from a worker thread (``asyncio.to_thread``) while the peer is
        serving.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        total = int(targets.shape[0])
        if total == 0:
            raise ValueError("evaluate needs at least one sample, got 0")
        criterion = self.loss_fn if loss_fn is None else loss_fn
        loss_sum, correct = 0.0, 0
        classification = language = True
        with self.lock, torch.no_grad():
            training = self.model.training
            self.model.eval()
            try:
                for start in range(0, total, batch_size):
                    x = _to(inputs[start : start + batch_size], self.device)
                    y = _to(targets[start : start + batch_size], self.device)
                    output = self.model(x)
                    loss_sum += float(criterion(output, y)) * int(y.shape[0])
                    classification = classification and is_classification(output, y)
                    language = language and is_language_model(output, y)
                    if classification or language:
                        correct += int((output.argmax(dim=-1) == y).sum())
            finally:
                self.model.train(training)
        loss = loss_sum / total
        scored = targets.numel() if language else total
        return {
            "loss": loss,
            "accuracy": correct / scored if classification or language else None,
            "bits_per_byte": bits_per_byte(loss) if language else None,
            "samples": total,
        }
