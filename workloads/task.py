"""What a data set asks of a model, and how both runners score it: one loss, one evaluation.

Two tasks (:data:`TASKS`; a :class:`~workloads.datasets.Dataset` declares its own):

- ``classification``: ``x [N, ...]``, labels ``y [N]``, logits ``[N, C]``.
  Metrics ``accuracy`` (the headline, higher is better) and ``loss``.
- ``language-model``: token contexts ``x [N, L]``, next tokens ``y [N, L]``
  (``y[:, t] = x[:, t + 1]`` within the stream), logits ``[N, L, V]``.
  Metrics ``loss``, ``bits_per_byte`` (the headline, lower is better) and ``accuracy``
  (next-token top-1).

The loss is the same function for both (:func:`cross_entropy`): the mean cross entropy over
every target, ``ℓ = -(1/T) Σ_t log softmax(z_t)[y_t]`` over the T targets of a batch (T = N
for a classifier, N·L for a language model), in nats. Bits per byte is that mean in bits,
``bpb = ℓ / ln 2``: the average number of bits an ideal arithmetic coder driven by the model
spends on each byte of the validation text (a uniform byte model scores 8). For a user's
token-level data set the same number is bits per token.

:func:`metrics` turns the two sums an evaluation collects (correct predictions, summed loss)
into a task's named metrics; :func:`evaluate` scores one ``nn.Module`` (a peer's
:class:`~peer.node.trainer.Trainer`, :func:`~workloads.baseline.train_centralized`); the
simulator's :meth:`sim.batched.BatchedPeers.evaluate` scores a stack of models and hands its
sums to :func:`metrics` too, so every runner reports the same names.

    >>> task = TASKS["language-model"]
    >>> task.headline, task.higher_is_better
    ('bits_per_byte', False)
    >>> round(metrics("language-model", accuracy=0.5, loss=math.log(2))["bits_per_byte"], 6)
    1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = [
    "CLASSIFICATION",
    "LANGUAGE_MODEL",
    "TASKS",
    "Task",
    "bits_per_byte",
    "cross_entropy",
    "evaluate",
    "metrics",
    "task_named",
]

CLASSIFICATION = "classification"
LANGUAGE_MODEL = "language-model"


@dataclass(frozen=True)
class Task:
    """One task: its name, the metrics an evaluation reports (in order), the headline metric
    among them, whether higher is better for it, and how a figure labels it."""

    name: str
    metric_names: tuple[str, ...]
    headline: str
    higher_is_better: bool
    label: str


TASKS: dict[str, Task] = {
    CLASSIFICATION: Task(CLASSIFICATION, ("accuracy", "loss"), "accuracy", True, "test accuracy"),
    LANGUAGE_MODEL: Task(
        LANGUAGE_MODEL,
        ("loss", "bits_per_byte", "accuracy"),
        "bits_per_byte",
        False,
        "validation bits per byte",
    ),
}


def task_named(name: str) -> Task:
    """The :class:`Task` called ``name``; a ``ValueError`` listing the two otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"task: got {name!r}; allowed: {', '.join(TASKS)}") from None


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross entropy over every target: ``logits [..., V]``, integer ``targets [...]``.

    A classifier's ``[B, C]`` and ``[B]`` give exactly ``F.cross_entropy``; a language
    model's ``[B, L, V]`` and ``[B, L]`` give the mean next-token loss over all B·L positions.
    Works under ``torch.func.vmap`` (the simulator's batched gradients).
    """
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def bits_per_byte(loss: float) -> float:
    """A mean cross entropy in nats per byte as bits per byte: ``loss / ln 2``."""
    return loss / math.log(2.0)


def metrics(task: str, *, accuracy: float, loss: float) -> dict[str, float]:
    """A task's named metrics (in :attr:`Task.metric_names` order) from the fraction of
    targets predicted right (argmax) and the mean loss per target."""
    if task_named(task).name == LANGUAGE_MODEL:
        return {"loss": loss, "bits_per_byte": bits_per_byte(loss), "accuracy": accuracy}
    return {"accuracy": accuracy, "loss": loss}


@torch.no_grad()
def evaluate(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    task: str = CLASSIFICATION,
    *,
    batch_size: int = 1024,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """A task's :func:`metrics` of ``model`` on ``(inputs, targets)``, ``batch_size``
    samples at a time, in eval mode (the mode is restored after).

    Sums in float64: the loss of each batch weighted by its number of targets, and the
    targets whose argmax is right; ``device`` (default: where the model's first parameter
    is) is where the batches go.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
    if int(targets.shape[0]) == 0:
        raise ValueError("evaluate needs at least one sample, got 0")
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
    training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    try:
        for start in range(0, int(targets.shape[0]), batch_size):
            x = inputs[start : start + batch_size].to(device)
            y = targets[start : start + batch_size].to(device)
            output = model(x)
            loss_sum += float(cross_entropy(output, y)) * y.numel()
            correct += int((output.argmax(dim=-1) == y).sum())
    finally:
        model.train(training)
    count = targets.numel()
    return metrics(task, accuracy=correct / count, loss=loss_sum / count)
