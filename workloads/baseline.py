"""The centralized baseline: one model trained on all the data, the yardstick of a swarm.

N peers that each take B samples per step see N·B samples per step together; the
centralized reference is one model trained by SGD on the union of the data with batch N·B
for as many steps, so both have seen the same number of samples (the comparison of D-PSGD
with centralized SGD in Lian et al., NeurIPS 2017, "Can decentralized algorithms outperform
centralized algorithms?"). ``gossipnet launch`` prints each peer's test accuracy beside it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
from torch import nn

from workloads.batching import peer_batches
from workloads.datasets import Dataset
from workloads.optimizers import SGD_MOMENTUM, LocalOptimizer
from workloads.task import LANGUAGE_MODEL, evaluate, task_named


@dataclass
class CentralizedResult:
    """What the centralized reference reached after ``samples`` training samples: its
    ``task`` and that task's ``metrics`` on the test set (:func:`workloads.task.metrics`:
    ``accuracy`` and ``loss`` of a classifier, plus ``bits_per_byte`` of a language model,
    ``mse`` and ``loss`` of a regression); ``accuracy`` and ``loss`` repeat two of them
    (accuracy None where the task has none); ``error`` says why there is no result (then the
    others are None, empty and 0)."""

    accuracy: float | None = None
    loss: float | None = None
    samples: int = 0
    error: str | None = None
    task: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def train_centralized(
    model: nn.Module,
    data: Dataset,
    *,
    steps: int,
    batch_size: int,
    lr: float | None = None,
    momentum: float | None = None,
    seed: int = 0,
    optimizer: str | LocalOptimizer = "sgd",
    weight_decay: float = 0.0,
    stream: int = 0,
    stop: threading.Event | None = None,
) -> CentralizedResult:
    """Train ``model`` in place on all of ``data``'s training set and test it.

    ``steps`` steps of the local optimizer ``optimizer`` (a
    :class:`workloads.optimizers.LocalOptimizer`, with its schedule over these ``steps`` and
    its clipping: the optimizer a peer builds from the same flags; or its name with ``lr``,
    ``momentum`` (SGD's, 0.9 unless given) and ``weight_decay``) on the task's loss (:attr:`workloads.task.Task.loss`), each
    on ``batch_size``
    samples drawn by :func:`workloads.peer_batches` over every training index with ``seed``
    and ``stream`` (its ``peer``: the launcher passes N, a stream none of peers 0..N-1
    draws), then the task's metrics on the test set (:func:`workloads.task.evaluate`: accuracy
    and mean cross entropy, bits per byte for a language model, the mean squared error of a
    regression). Setting ``stop`` ends the
    run early: the result's ``error`` then says ``"stopped before the end"``.

    Example::

        data = load_dataset("synthetic:num_samples=400")
        model = build_model("mlp", data.input_shape, data.num_classes, seed=0)
        result = train_centralized(model, data, steps=100, batch_size=4 * 32, lr=0.05)
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: must be an integer >= 1, got {steps!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
    if isinstance(optimizer, LocalOptimizer):
        if lr is not None or momentum is not None or weight_decay:
            raise ValueError("lr: give lr, momentum and weight_decay in the LocalOptimizer")
        settings = optimizer
    else:
        if lr is None:
            raise ValueError("lr: needed with an optimizer given by name")
        keys: dict[str, object] = {"name": optimizer, "lr": lr, "weight_decay": weight_decay}
        if momentum is not None or optimizer == "sgd":
            keys["momentum"] = SGD_MOMENTUM if momentum is None else momentum
        settings = LocalOptimizer.from_keys(keys)
    step = settings.for_run(steps).torch_optimizer(model.parameters())
    loss = task_named(data.task).loss
    indices = torch.arange(int(data.y_train.shape[0]))
    batches = peer_batches(data, indices, batch_size=batch_size, seed=seed, peer=stream)
    for _, (x, y) in zip(range(steps), batches, strict=False):
        if stop is not None and stop.is_set():
            return CentralizedResult(error="stopped before the end")
        step.zero_grad()
        loss(model(x), y).backward()
        step.step()
    chunk = 32 if data.task == LANGUAGE_MODEL else len(data.y_test)  # logits [32, L, V]
    scores = evaluate(model, data.x_test, data.y_test, data.task, batch_size=chunk)
    model.eval()
    return CentralizedResult(
        accuracy=scores.get("accuracy"),
        loss=scores["loss"],
        samples=steps * batch_size,
        task=data.task,
        metrics=scores,
    )
