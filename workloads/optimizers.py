"""The local optimizer a peer (and the centralized reference) trains with, by name.

``gossipnet peer``, ``gossipnet launch`` and :func:`workloads.train_centralized` build one torch
optimizer over a model's parameters here; the simulator steps the same update over all peers'
stacked ``[n, d]`` parameters (``sim.optimizers``, names from :data:`LOCAL_OPTIMIZERS`).

    >>> import torch
    >>> net = torch.nn.Linear(3, 2)
    >>> type(build_local_optimizer(net.parameters(), "adamw", lr=1e-3)).__name__
    'AdamW'
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["LOCAL_OPTIMIZERS", "SGD_MOMENTUM", "build_local_optimizer", "check_local_optimizer"]

LOCAL_OPTIMIZERS = ("sgd", "adam", "adamw")
"""SGD (momentum: Polyak 1964), Adam (Kingma & Ba 2015), AdamW (Adam with decoupled weight
decay, Loshchilov & Hutter 2019: DiLoCo's inner optimizer)."""

SGD_MOMENTUM = 0.9
"""SGD's momentum when none is given."""


def check_local_optimizer(
    name: str, *, lr: float, momentum: float | None = None, weight_decay: float = 0.0
) -> float:
    """Check a local optimizer's settings; returns the momentum to use (0 for Adam and
    AdamW). A ``ValueError`` names the field (``optimizer``, ``lr``, ``momentum``,
    ``weight_decay``) and the allowed values."""
    if name not in LOCAL_OPTIMIZERS:
        raise ValueError(f"optimizer: must be one of {', '.join(LOCAL_OPTIMIZERS)}; got {name!r}")
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr: must be a finite number > 0; got {lr!r}")
    if not (isinstance(weight_decay, int | float) and math.isfinite(weight_decay)):
        raise ValueError(f"weight_decay: must be a finite number >= 0; got {weight_decay!r}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay: must be a finite number >= 0; got {weight_decay!r}")
    if name != "sgd":
        if momentum is not None:
            raise ValueError(f"momentum: is SGD's; {name} keeps its own moments (leave it out)")
        return 0.0
    value = SGD_MOMENTUM if momentum is None else momentum
    if not (isinstance(value, int | float) and math.isfinite(value) and 0 <= value < 1):
        raise ValueError(f"momentum: must be in [0, 1); got {value!r}")
    return float(value)


def build_local_optimizer(
    params: Iterable[torch.nn.Parameter] | Iterable[torch.Tensor],
    name: str = "sgd",
    *,
    lr: float,
    momentum: float | None = None,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """The torch optimizer ``name`` over ``params`` (see :func:`check_local_optimizer`)."""
    momentum = check_local_optimizer(name, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    kind = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return kind(params, lr=lr, weight_decay=weight_decay)
