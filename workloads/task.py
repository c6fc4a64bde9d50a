"""What a data set asks of a model, and how every runner scores it: one place per task.

Three tasks (:data:`TASKS`; a :class:`~workloads.datasets.Dataset` declares its own, an
``.npz`` in its optional ``task`` entry or by the shape and dtype of ``y``). Each
:class:`Task` carries its loss, its metrics, its headline metric and whether higher is
better for it; the peer, ``launch``'s table and records and the centralized reference read
them from here and from nowhere else.

- ``classification``: ``x [N, ...]``, integer labels ``y [N]``, logits ``[N, C]``. Loss
  :func:`cross_entropy`. Metrics ``accuracy`` (the headline, higher is better) and ``loss``.
- ``language-model``: token contexts ``x [N, L]``, next tokens ``y [N, L]``
  (``y[:, t] = x[:, t + 1]`` within the stream), logits ``[N, L, V]``. Loss
  :func:`cross_entropy` over the vocabulary. Metrics ``loss``, ``bits_per_byte`` (the
  headline, lower is better) and ``accuracy`` (next-token top-1).
- ``regression``: ``x [N, ...]``, float targets ``y [N, K]`` (a 1-D ``y`` is read as
  ``[N, 1]``), outputs with ``K`` values per sample. Loss :func:`mean_squared_error`.
  Metrics ``mse`` (the headline, lower is better; the loss itself) and ``loss``.

Cross entropy is the mean over every target, ``ℓ = -(1/T) Σ_t log softmax(z_t)[y_t]`` over
the T targets of a batch (T = N for a classifier, N·L for a language model), in nats. Bits
per byte is that mean in bits, ``bpb = ℓ / ln 2``: the average number of bits an ideal
arithmetic coder driven by the model spends on each token of the validation data. It is per
*byte* only for a byte-level vocabulary (:data:`BYTE_VOCABULARY` = 256 values, the ``text``
data set; a uniform byte model scores 8); for a user's own tokens it is bits per token, and
:meth:`Task.title` says so. The mean squared error is ``(1/(N·K)) Σ_i Σ_k (f(x_i)_k -
y_ik)²``.

:func:`metrics` turns the two sums an evaluation collects (correct predictions, summed loss)
into a task's named metrics; :func:`evaluate` scores one ``nn.Module`` (a ``gossipnet peer``,
:func:`~workloads.baseline.train_centralized`); the simulator's
:meth:`sim.batched.BatchedPeers.evaluate` scores a stack of models and hands its sums to
:func:`metrics` too, so every runner reports the same names. :func:`check_model_fits` runs
one forward pass of one batch before anything starts and says in one line what does not fit.

    >>> task = TASKS["language-model"]
    >>> task.headline, task.higher_is_better
    ('bits_per_byte', False)
    >>> round(metrics("language-model", accuracy=0.5, loss=math.log(2))["bits_per_byte"], 6)
    1.0
    >>> metrics("regression", loss=0.25)
    {'mse': 0.25, 'loss': 0.25}
    >>> TASKS["regression"].better(0.1, 0.2), TASKS["classification"].better(0.1, 0.2)
    (True, False)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from workloads.datasets import Dataset

__all__ = [
    "BYTE_VOCABULARY",
    "CLASSIFICATION",
    "LANGUAGE_MODEL",
    "METRIC_NAMES",
    "REGRESSION",
    "TASKS",
    "ModelMismatchError",
    "Task",
    "bits_per_byte",
    "check_model_fits",
    "cross_entropy",
    "evaluate",
    "mean_squared_error",
    "metrics",
    "task_named",
]

CLASSIFICATION = "classification"
LANGUAGE_MODEL = "language-model"
REGRESSION = "regression"
BYTE_VOCABULARY = 256
"""A language model's vocabulary when its tokens are bytes: bits per token are bits per byte."""

Loss = Callable[[Tensor, Tensor], Tensor]


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross entropy over every target: ``logits [..., V]``, integer ``targets [...]``.

    A classifier's ``[B, C]`` and ``[B]`` give exactly ``F.cross_entropy``; a language
    model's ``[B, L, V]`` and ``[B, L]`` give the mean next-token loss over all B·L positions.
    Works under ``torch.func.vmap`` (the simulator's batched gradients).
    """
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def mean_squared_error(outputs: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error over every target value, ``(1/(N·K)) Σ (f(x)_ik - y_ik)²``.

    ``targets [B, K]`` (or any ``[B, ...]``); ``outputs`` hold as many values, in any shape
    with the same leading batch (``[B]`` for ``[B, 1]`` targets): they are read in the
    targets' shape, never broadcast (``[B, 1]`` against ``[B]`` would silently give a
    ``[B, B]`` difference). A different count raises ``ValueError`` naming both shapes.
    """
    if outputs.shape[:1] != targets.shape[:1] or outputs.numel() != targets.numel():
        raise ValueError(
            f"mean squared error: outputs {tuple(outputs.shape)} do not hold one value per "
            f"target of {tuple(targets.shape)}"
        )
    return nn.functional.mse_loss(outputs.reshape(targets.shape), targets)


@dataclass(frozen=True)
class Task:
    """One task: its name, its loss, the metrics an evaluation reports (in order), the
    headline metric among them, whether higher is better for it, and how a figure titles it
    (``label``) and a table heads its column (``column``)."""

    name: str
    loss: Loss
    metric_names: tuple[str, ...]
    headline: str
    higher_is_better: bool
    label: str
    column: str
    has_accuracy: bool

    def better(self, value: float, other: float) -> bool:
        """Whether headline ``value`` is strictly better than ``other`` for this task."""
        return value > other if self.higher_is_better else value < other

    def best(self, values: Iterable[float]) -> float:
        """The best of headline ``values`` (max, or min where lower is better)."""
        return max(values) if self.higher_is_better else min(values)

    def title(self, num_classes: int | None = None) -> str:
        """The headline's title; a language model's bits per *token* unless its vocabulary
        (``num_classes``) is the 256 bytes (unknown: the label as declared)."""
        return self._per_token(self.label, num_classes)

    def heading(self, num_classes: int | None = None) -> str:
        """The headline's short column heading, per token as :meth:`title` says."""
        return self._per_token(self.column, num_classes)

    def _per_token(self, text: str, num_classes: int | None) -> str:
        if self.name != LANGUAGE_MODEL or num_classes in (None, BYTE_VOCABULARY):
            return text
        return text.replace("byte", "token")


TASKS: dict[str, Task] = {
    CLASSIFICATION: Task(
        CLASSIFICATION,
        cross_entropy,
        ("accuracy", "loss"),
        "accuracy",
        True,
        "test accuracy",
        "test accuracy",
        True,
    ),
    LANGUAGE_MODEL: Task(
        LANGUAGE_MODEL,
        cross_entropy,
        ("loss", "bits_per_byte", "accuracy"),
        "bits_per_byte",
        False,
        "validation bits per byte",
        "val. bits/byte",
        True,
    ),
    REGRESSION: Task(
        REGRESSION,
        mean_squared_error,
        ("mse", "loss"),
        "mse",
        False,
        "test mean squared error",
        "test MSE",
        False,
    ),
}

METRIC_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys(name for task in TASKS.values() for name in task.metric_names)
)
"""Every metric any task reports, each once, in order (a record's columns)."""


def task_named(name: str) -> Task:
    """The :class:`Task` called ``name``; a ``ValueError`` listing the tasks otherwise."""
    try:
        return TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"task: got {name!r}; allowed: {', '.join(TASKS)}") from None


def bits_per_byte(loss: float) -> float:
    """A mean cross entropy in nats per byte as bits per byte: ``loss / ln 2``."""
    return loss / math.log(2.0)


def metrics(task: str, *, loss: float, accuracy: float | None = None) -> dict[str, float]:
    """A task's named metrics (in :attr:`Task.metric_names` order) from the mean loss per
    target and, for a task with accuracy, the fraction of targets predicted right (argmax)."""
    name = task_named(task).name
    if name == REGRESSION:
        return {"mse": loss, "loss": loss}
    if accuracy is None:
        raise ValueError(f"metrics: the {name} task needs the accuracy")
    if name == LANGUAGE_MODEL:
        return {"loss": loss, "bits_per_byte": bits_per_byte(loss), "accuracy": accuracy}
    return {"accuracy": accuracy, "loss": loss}


@torch.no_grad()
def evaluate(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    task: str = CLASSIFICATION,
    *,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """A task's :func:`metrics` of ``model`` on ``(inputs, targets)``, ``batch_size``
    samples at a time, in eval mode (the mode is restored after).

    Sums in float64: the task's loss of each batch weighted by its number of targets, and
    (a task with accuracy) the targets whose argmax is right. ``batch_size`` defaults to
    1,024 samples, fewer where a sample has many targets (at most 65,536 targets); ``device``
    (default: where the model's first parameter is) is where the batches go.
    """
    found = task_named(task)
    if int(targets.shape[0]) == 0:
        raise ValueError("evaluate needs at least one sample, got 0")
    if batch_size is None:
        per_sample = max(math.prod(targets.shape[1:]), 1)
        batch_size = max(1, min(1024, 65536 // per_sample))
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
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
            loss_sum += float(found.loss(output, y)) * y.numel()
            if found.has_accuracy:
                correct += int((output.argmax(dim=-1) == y).sum())
    finally:
        model.train(training)
    count = targets.numel()
    accuracy = correct / count if found.has_accuracy else None
    return metrics(found.name, accuracy=accuracy, loss=loss_sum / count)


class ModelMismatchError(ValueError):
    """The model does not fit the data set (:func:`check_model_fits`): one line saying what
    of the model's output, or of its forward pass, does not match which part of the data."""


def _shape(value: Tensor) -> str:
    return f"[{', '.join(str(int(s)) for s in value.shape)}]"


def _expected_output(data: Dataset, batch: int) -> str:
    """What the task asks the model to output for ``batch`` samples, in words."""
    if data.task == CLASSIFICATION:
        return (
            f"logits [{batch}, {data.num_classes}] (the data set's labels take "
            f"{data.num_classes} classes, 0..{data.num_classes - 1})"
        )
    if data.task == LANGUAGE_MODEL:
        length = data.input_shape[0]
        return (
            f"logits [{batch}, {length}, {data.num_classes}] (contexts of {length} tokens, a "
            f"vocabulary of {data.num_classes})"
        )
    width = data.num_classes
    return (
        f"[{batch}, {width}] (regression targets y of {width} value"
        f"{'' if width == 1 else 's'} per sample)"
    )


def _output_problem(output: Tensor, data: Dataset, batch: int) -> str | None:
    """Why ``output`` of ``batch`` samples does not fit ``data``'s task, or None."""
    if not output.is_floating_point():
        return f"{str(output.dtype).removeprefix('torch.')}, not floating point"
    if output.dim() == 0 or int(output.shape[0]) != batch:
        return f"{_shape(output)}, not one row per sample of the {batch}"
    if data.task == CLASSIFICATION:
        if output.dim() != 2:
            return f"{_shape(output)}, not one row of logits per sample"
        if int(output.shape[1]) < data.num_classes:
            return f"{int(output.shape[1])} logits per sample, fewer than the classes"
        return None
    if data.task == LANGUAGE_MODEL:
        length = data.input_shape[0]
        if output.dim() != 3 or int(output.shape[1]) != length:
            return f"{_shape(output)}, not logits for each of the {length} positions"
        if int(output.shape[2]) < data.num_classes:
            return f"a vocabulary of {int(output.shape[2])}, smaller than the data's"
        return None
    if output.numel() != batch * data.num_classes:
        plural = "" if data.num_classes == 1 else "s"
        return f"{_shape(output)}, not {data.num_classes} value{plural} per sample"
    return None


def check_model_fits(model: nn.Module, data: Dataset, *, batch_size: int = 4) -> None:
    """One forward pass of the first ``batch_size`` training samples, and the task's loss on
    it, in eval mode under ``no_grad`` (nothing of the model changes): the check a command
    runs before anything starts. Raises :class:`ModelMismatchError` in one line: the forward
    pass failed on the data's inputs (their shape and dtype, and the error), the output has
    the wrong type, dtype or shape for the task (a classifier's ``[B, C]`` logits with at
    least the data's classes, a language model's ``[B, L, V]`` with at least its vocabulary,
    a regression's ``K`` values per sample), or the loss fails on it.
    """
    task = task_named(data.task)
    count = min(batch_size, data.num_train)
    x, y = data.x_train[:count], data.y_train[:count]
    first = next(model.parameters(), None)
    if first is not None:
        x, y = x.to(first.device), y.to(first.device)
    inputs = f"inputs x {_shape(x)} {str(x.dtype).removeprefix('torch.')}"
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            try:
                output = model(x)
            except Exception as error:
                hint = (
                    " (language-model data are integer tokens [B, L]: the model must embed "
                    "them, as gpt does)"
                    if task.name == LANGUAGE_MODEL
                    else ""
                )
                raise ModelMismatchError(
                    f"the model fails on one batch of the data set's {inputs}: "
                    f"{_one_line(error)}{hint}"
                ) from None
            if not isinstance(output, Tensor):
                raise ModelMismatchError(
                    f"the model returns a {type(output).__name__} for {inputs}; allowed: one "
                    f"tensor, {_expected_output(data, count)}"
                )
            problem = _output_problem(output, data, count)
            if problem is not None:
                raise ModelMismatchError(
                    f"the model's output for {inputs} is {problem}; the {task.name} data set "
                    f"needs {_expected_output(data, count)}"
                )
            try:
                task.loss(output, y)
            except Exception as error:
                raise ModelMismatchError(
                    f"the {task.name} loss fails on the model's output {_shape(output)} and "
                    f"targets y {_shape(y)}: {_one_line(error)}"
                ) from None
    finally:
        model.train(training)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
