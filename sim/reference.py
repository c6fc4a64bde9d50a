"""The naive reference: one ``nn.Module`` and one optimizer per peer, stepped in a Python loop.

It exists to check the batched engine (same seeds, same batches: same numbers within 1e-5)
and as the baseline of ``bench/sim_throughput.py``. Do not use it for experiments.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

from gossip.flat import ParameterLayout
from sim.batched import LossFunction
from workloads.task import cross_entropy


class ReferencePeers:
    """n independent ``nn.Module`` copies, each with its own ``torch.optim`` optimizer.

    Args:
        template: the model every peer starts from (deep-copied n times), or ``initial [n, d]``
            rows loaded into the copies.
        n: number of peers.
        optimizer: ``params -> torch.optim.Optimizer`` for one peer's parameters.
    """

    def __init__(
        self,
        template: nn.Module,
        n: int,
        optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
        *,
        initial: Tensor | None = None,
        loss: LossFunction | None = None,
    ) -> None:
        self.layout = ParameterLayout.from_module(template)
        self.models = [copy.deepcopy(template) for _ in range(n)]
        if initial is not None:
            for model, row in zip(self.models, initial):
                self.load(model, row)
        self.optimizers = [optimizer(list(m.parameters())) for m in self.models]
        self.loss: LossFunction = loss if loss is not None else cross_entropy

    def load(self, model: nn.Module, row: Tensor) -> None:
        with torch.no_grad():
            for name, view in self.layout.unflatten(row).items():
                model.get_parameter(name).copy_(view)

    def step(self, x: Tensor, y: Tensor) -> Tensor:
        """One optimizer step per peer on its own batch ``x[i], y[i]``; returns losses ``[n]``."""
        losses = []
        for model, optimizer, xi, yi in zip(self.models, self.optimizers, x, y):
            optimizer.zero_grad(set_to_none=True)
            loss = self.loss(model(xi), yi)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        return torch.stack(losses)

    def flat(self) -> Tensor:
        """All peers' parameters as ``[n, d]``."""
        return torch.stack(
            [
                self.layout.flatten({k: p.detach() for k, p in m.named_parameters()})
                for m in self.models
            ]
        )

    def set_flat(self, values: Tensor) -> None:
        for model, row in zip(self.models, values):
            self.load(model, row)
