"""Batched optimizers: one torch optimizer over the stacked ``[n, d]`` leaf is n per-peer ones.

SGD (momentum, Nesterov, weight decay) and Adam update each coordinate from that
coordinate's own state, so one optimizer over the stacked rows is exactly n independent
per-peer optimizers (``tests/sim`` checks against :class:`sim.reference.ReferencePeers`, one
``nn.Module`` and optimizer per peer). :func:`masked_step` steps only the active rows (a
crashed or busy peer does not step); :class:`BlockedOptimizer` runs gradient then step for one
block of peers at a time, while the block is in cache, with the same result as one optimizer
over all rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from sim.batched import BatchedPeers


def build_optimizer(
    params: Tensor,
    name: str = "sgd",
    *,
    lr: float = 0.1,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.optim.Optimizer:
    """One torch optimizer over the stacked ``[n, d]`` leaf: n per-peer optimizers at once.

    SGD (with momentum / Nesterov / weight decay) and Adam (Kingma and Ba, 2015) update each
    coordinate from that coordinate's own state, so one optimizer over the stacked rows is
    exactly n independent per-peer optimizers (tested against the per-peer reference).
    """
    if lr <= 0 or not math.isfinite(lr):
        raise ValueError(f"lr: learning rate must be a finite number > 0, got {lr}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum: must be in [0, 1), got {momentum}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay: must be >= 0, got {weight_decay}")
    if name == "sgd":
        return _fused_if_supported(
            torch.optim.SGD,
            params,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )
    if name == "adam":
        return _fused_if_supported(
            torch.optim.Adam, params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
        )
    raise ValueError(f"optimizer: must be one of 'sgd', 'adam', got {name!r}")


def _fused_if_supported(
    kind: type[torch.optim.Optimizer], params: Tensor, **options: Any
) -> torch.optim.Optimizer:
    """``kind([params], fused=True)``: one pass over parameters, gradients and state per step
    (the foreach form makes two to four passes over every ``[n, d]`` tensor, and at large n
    those passes are memory-bound). Falls back to the default implementation where this torch
    has no fused kernel for the device or dtype."""
    try:
        return kind([params], fused=True, **options)  # type: ignore[call-arg]
    except (RuntimeError, TypeError, ValueError):
        return kind([params], **options)


def masked_step(optimizer: torch.optim.Optimizer, params: Tensor, active: Tensor | None) -> None:
    """``optimizer.step()`` for the rows where ``active [n]`` is True; other rows keep their
    parameters and optimizer state (a crashed or busy peer does not step).

    Row-shaped state (momentum buffers, Adam's moments) is restored for idle rows (zero when
    this is the first step); Adam's scalar step count is shared by all rows, so an idle
    peer's bias correction advances too.
    """
    if active is None or bool(active.all()):
        optimizer.step()
        return
    idle = (~active).nonzero().squeeze(1)
    if idle.numel() == 0:
        optimizer.step()
        return
    state = optimizer.state.get(params, {})
    saved = {
        key: value[idle].clone() for key, value in state.items() if _is_row_state(value, params)
    }
    saved_params = params[idle].clone()
    optimizer.step()
    state = optimizer.state[params]
    with torch.no_grad():
        params[idle] = saved_params
        for key, value in saved.items():
            state[key][idle] = value
        for key, value in state.items():
            if key not in saved and _is_row_state(value, params):
                # created by this step (the first): an idle row has never stepped, and zero
                # is the state of a peer that never did (momentum, Adam's moments)
                value[idle] = 0


class BlockedOptimizer:
    """Gradient and optimizer step fused per block of peers: for each block of rows R,
    ``g_R = ∇ℓ(x_R)`` by one ``vmap(grad)``, then ``x_R <- step(x_R, g_R)`` at once, while the
    block's parameters, gradients and optimizer state are still in the CPU cache.

    Each block has its own torch optimizer over a row-slice view of the stacked ``[n, d]``
    leaf (the views share its storage: no copy of the parameters). SGD, momentum, Nesterov,
    weight decay and Adam are elementwise, so the result equals one optimizer over all rows
    (tested bit for bit against :func:`masked_step` after :meth:`BatchedPeers.gradients`).

    Args:
        peers: the batched model (its ``gradients``).
        params: the stacked leaf ``[n, d]`` to train in place (must be contiguous).
        build: ``leaf -> torch.optim.Optimizer`` for one block (e.g.
            ``OptimizerConfig.build``).
        block_rows: peers per block (default: as many as keep ~32 MiB of gradients in flight,
            the same blocks :meth:`BatchedPeers.gradients` uses).
    """

    def __init__(
        self,
        peers: BatchedPeers,
        params: Tensor,
        build: Callable[[Tensor], torch.optim.Optimizer],
        *,
        block_rows: int | None = None,
    ) -> None:
        if params.dim() != 2 or not params.is_contiguous():
            raise ValueError(
                f"params: must be a contiguous [n, d] tensor, got shape {tuple(params.shape)}"
            )
        if block_rows is not None and (not isinstance(block_rows, int) or block_rows < 1):
            raise ValueError(f"block_rows: must be an integer >= 1, got {block_rows!r}")
        self.peers = peers
        self.params = params
        self.block_rows = block_rows or peers.default_block_rows()
        self.blocks = [
            params[start : start + self.block_rows]
            for start in range(0, params.shape[0], self.block_rows)
        ]
        self.optimizers = [build(block) for block in self.blocks]
        self.grads = torch.empty_like(params)  # reused every step: no fresh pages

    def step(self, x: Tensor, y: Tensor, active: Tensor | None = None) -> Tensor:
        """One local step of every peer on its batch ``x [n, B, ...]``, ``y [n, B]`` (rows
        where ``active [n]`` is False keep their parameters and state); returns losses ``[n]``."""
        n = self.params.shape[0]
        if x.shape[0] != n or y.shape[0] != n:
            raise ValueError(
                f"x, y: leading dimension must be the number of peers {n}, "
                f"got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        losses = torch.empty(n, dtype=self.params.dtype, device=self.params.device)
        for index, (block, optimizer) in enumerate(zip(self.blocks, self.optimizers)):
            rows = slice(index * self.block_rows, index * self.block_rows + block.shape[0])
            if active is not None and not bool(active[rows].any()):
                # no gradient for an all-idle block, but its optimizer still steps (and
                # restores every row) so that shared scalar state (Adam's step count)
                # advances exactly as in one optimizer over all rows
                block.grad = self.grads[rows].zero_()
                masked_step(optimizer, block, active[rows])
                block.grad = None
                continue
            loss, block.grad = self.peers.gradients(
                x[rows], y[rows], block, block_rows=block.shape[0], out=self.grads[rows]
            )
            masked_step(optimizer, block, None if active is None else active[rows])
            block.grad = None
            losses[rows] = loss
        if active is not None:
            losses[~active] = float("nan")
        return losses

    def step_with(self, grads: Tensor, active: Tensor | None = None) -> None:
        """The optimizer step alone, with given gradients ``[n, d]`` (a plan whose gradient
        and step are split by an exchange, e.g. D-PSGD's combine-then-adapt order)."""
        if grads.shape != self.params.shape:
            raise ValueError(
                f"grads: must have the parameters' shape {tuple(self.params.shape)}, "
                f"got {tuple(grads.shape)}"
            )
        for index, (block, optimizer) in enumerate(zip(self.blocks, self.optimizers)):
            rows = slice(index * self.block_rows, index * self.block_rows + block.shape[0])
            block.grad = grads[rows]
            masked_step(optimizer, block, None if active is None else active[rows])
            block.grad = None

    def swap(self, values: Tensor) -> Tensor:
        """Make the stacked leaf hold ``values [n, d]`` by exchanging storages instead of
        copying (a mixing round writes its result into a second buffer; this saves the
        ``[n, d]`` copy back). The leaf, its block views and the optimizers' state keep
        their identity; views of the leaf taken elsewhere before the swap keep reading the
        old storage. Returns a tensor over the old storage, the buffer for the next round."""
        params = self.params
        if (
            values.shape != params.shape
            or values.dtype != params.dtype
            or not values.is_contiguous()
        ):
            raise ValueError(
                f"values: must be a contiguous {params.dtype} tensor of shape "
                f"{tuple(params.shape)}, got {values.dtype} {tuple(values.shape)}"
            )
        if values.untyped_storage().data_ptr() == params.untyped_storage().data_ptr():
            raise ValueError("values: must not share the parameters' storage")
        old = params.new_empty(0).set_(
            params.untyped_storage(), params.storage_offset(), params.shape, params.stride()
        )
        storage, offset, width = values.untyped_storage(), values.storage_offset(), params.shape[1]
        with torch.no_grad():
            params.set_(storage, offset, values.shape, values.stride())
            for index, block in enumerate(self.blocks):
                start = offset + index * self.block_rows * width
                block.set_(storage, start, block.shape, block.stride())
        return old


def _is_row_state(value: object, params: Tensor) -> bool:
    return isinstance(value, Tensor) and value.shape == params.shape
