"""The batched engine: n copies of one model as a single ``[n, d]`` tensor.

All peers' parameters live in one stacked leaf ``params [n, d]``; gradients for every
peer come from one ``torch.func.vmap(torch.func.grad(loss))`` call over per-peer batches
``x [n, B, ...]``, ``y [n, B]``; one torch optimizer over the stacked leaf is the n per-peer
optimizers at once (SGD, momentum and Adam are elementwise, which ``tests/sim`` checks
against :class:`sim.reference.ReferencePeers`, one ``nn.Module`` and optimizer per peer).

Mixing reads neighbours by gather, ``params[index] -> [n, k, d]``, from a
``topologies.NeighbourTable`` and hands them to a ``consensus`` aggregator: the cost is
O(n * k * d), never a dense n x n product.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from consensus.base import Rule
from gossip.flat import ParameterLayout
from workloads.models import NotBatchableError, check_batchable

LossFunction = Callable[[Tensor, Tensor], Tensor]


class ModelNotBatchableError(NotBatchableError):
    """A user model that ``torch.func.vmap`` cannot run over a stack of peers (a
    ``workloads.NotBatchableError``, itself a ``ValueError``)."""


class NeighbourTableLike(Protocol):
    """What :func:`gather_mix` reads from a ``topologies.NeighbourTable``."""

    index: np.ndarray
    weight: np.ndarray
    mask: np.ndarray


class AggregatorLike(Protocol):
    """The ``consensus.Aggregator`` protocol (vector convention, batched over nodes)."""

    def __call__(
        self, own: Tensor, neighbours: Tensor, weights: Tensor, mask: Tensor | None = None
    ) -> Tensor: ...


def _flat(layout: ParameterLayout, module: nn.Module) -> Tensor:
    return layout.flatten({name: p.detach() for name, p in module.named_parameters()})


def _seeded_copy(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()


class BatchedPeers:
    """n peers of one model architecture, trained as one ``[n, d]`` tensor.

    The gradient of every peer's loss on its own batch in one call,
    ``g_i = ∇_x ℓ(f(x_i; X_i), Y_i)`` for i = 1..n, via ``vmap(grad(ℓ ∘ functional_call))``
    (Horace He and Richard Zou, *functorch*, 2021; the torch.func API).

    Args:
        model: a factory ``() -> nn.Module`` (called under ``seed`` so initial weights are
            reproducible) or a module to copy.
        n: number of peers (>= 1).
        init: ``"same"`` (every peer starts from the same weights, as in D-PSGD) or
            ``"independent"`` (peer i is built under seed ``seed + i``).
        seed: seeds the initial weights.
        loss: ``loss(logits [B, C], targets [B]) -> scalar``; cross entropy by default.

    Example::

        peers = BatchedPeers(lambda: nn.Linear(10, 3), n=16, seed=0)
        loss, grads = peers.gradients(x, y)        # x [16, B, 10], y [16, B]
        peers.params.grad = grads
        optimizer = torch.optim.SGD([peers.params], lr=0.1, momentum=0.9)
        optimizer.step()                            # 16 per-peer SGD steps at once
    """

    def __init__(
        self,
        model: Callable[[], nn.Module] | nn.Module,
        n: int,
        *,
        init: str = "same",
        seed: int = 0,
        loss: LossFunction | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n: number of peers must be an integer >= 1, got {n!r}")
        if init not in ("same", "independent"):
            raise ValueError(f"init: must be one of 'same', 'independent', got {init!r}")
        if isinstance(model, nn.Module):
            template = model
            factory: Callable[[], nn.Module] | None = None
        elif callable(model):
            factory = model
            template = _seeded_copy(factory, seed)
            if not isinstance(template, nn.Module):
                raise TypeError(f"model: factory must return an nn.Module, got {type(template)}")
        else:
            raise TypeError(f"model: expected an nn.Module or a factory, got {type(model)}")
        self.n = n
        self.template = template
        check_batchable(template)  # static checks: BatchNorm running stats, random layers
        self.layout = ParameterLayout.from_module(template)
        if self.layout.numel == 0:
            raise ValueError("model: has no parameters to train (numel 0)")
        self.loss: LossFunction = loss if loss is not None else nn.functional.cross_entropy
        self.buffers = {name: b.detach() for name, b in template.named_buffers()}
        first = _flat(self.layout, template).to(dtype)
        if init == "same":
            stacked = first.unsqueeze(0).repeat(n, 1)
        else:
            if factory is None:
                raise ValueError("init: 'independent' needs a model factory, not a module")
            stacked = torch.empty(n, self.layout.numel, dtype=dtype)
            stacked[0] = first
            for i in range(1, n):  # construction only, once per run
                stacked[i] = _flat(self.layout, _seeded_copy(factory, seed + i)).to(dtype)
        self.params: Tensor = stacked
        # differentiate w.r.t. per-parameter views of each row (not the flat row: the backward
        # of n slices of one flat vector would zero-fill and add n full [n, d] buffers)
        self._grad_fn = vmap(grad_and_value(self._loss_of_views), in_dims=(0, 0, 0))
        self._forward_shared = vmap(self._forward_views, in_dims=(0, None))
        self._checked = False

    @property
    def dim(self) -> int:
        """d, the number of parameters of one peer's model."""
        return self.layout.numel

    def _forward_views(self, views: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(self.template, (views, self.buffers), (x,))

    def _loss_of_views(self, views: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return self.loss(self._forward_views(views, x), y)

    def _batchable_guard(self, call: Callable[..., Any], *args: Any) -> Any:
        if self._checked:
            return call(*args)
        try:
            result = call(*args)
        except (RuntimeError, NotImplementedError, ValueError) as error:
            raise ModelNotBatchableError(
                "",
                f"{type(self.template).__name__} fails under vmap(grad(loss)) over the peers "
                f"({type(error).__name__}: {error}). Common causes: BatchNorm updating running "
                "statistics in training mode (use GroupNorm/LayerNorm or "
                "track_running_stats=False), in-place updates of buffers, .item() or "
                "data-dependent Python control flow in forward().",
            ) from error
        self._checked = True
        return result

    def gradients(
        self, x: Tensor, y: Tensor, params: Tensor | None = None, *, block_rows: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Per-peer loss ``[m]`` and gradient ``[m, d]`` of ``params [m, d]`` (default all).

        Peers are processed ``block_rows`` at a time (default: as many as keep about 32 MiB of
        per-peer gradients in flight), each block one ``vmap(grad)`` whose result is written
        straight into the ``[m, d]`` output: at large n this keeps the block's gradients in
        the CPU cache instead of materialising and copying an ``[n, d]`` intermediate.
        """
        flat = self.params if params is None else params
        m = flat.shape[0]
        if x.shape[0] != m or y.shape[0] != m:
            raise ValueError(
                f"x, y: leading dimension must be the number of peers {m}, "
                f"got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        block = block_rows or max(1, (32 << 20) // (4 * self.dim))
        if block < 1:
            raise ValueError(f"block_rows: must be >= 1, got {block_rows}")
        flat = flat.detach()
        if m <= block:
            views = self.layout.unflatten(flat)
            grads, losses = self._batchable_guard(self._grad_fn, views, x, y)
            return losses.detach(), self.layout.flatten(grads).detach()
        out = torch.empty_like(flat)
        losses = torch.empty(m, dtype=flat.dtype)
        for start in range(0, m, block):
            rows = slice(start, start + block)
            views = self.layout.unflatten(flat[rows])
            grads, loss = self._batchable_guard(self._grad_fn, views, x[rows], y[rows])
            out[rows] = self.layout.flatten(grads)
            losses[rows] = loss.detach()
        return losses, out

    @torch.no_grad()
    def logits(self, x: Tensor, params: Tensor | None = None) -> Tensor:
        """Outputs ``[m, N, C]`` of models ``params [m, d]`` on one shared input ``x [N, ...]``."""
        flat = self.params if params is None else params
        views = self.layout.unflatten(flat)
        return self._batchable_guard(self._forward_shared, views, x)

    @torch.no_grad()
    def evaluate(
        self, x: Tensor, y: Tensor, params: Tensor | None = None, *, batch_size: int = 4096
    ) -> tuple[Tensor, Tensor]:
        """Accuracy ``[m]`` and mean loss ``[m]`` of models ``params [m, d]`` on ``(x, y)``.

        One vmap over the models per chunk of ``batch_size`` examples.
        """
        flat = self.params if params is None else params
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        correct = torch.zeros(flat.shape[0], dtype=torch.float64)
        total_loss = torch.zeros(flat.shape[0], dtype=torch.float64)
        loss_per_model = vmap(self.loss, in_dims=(0, None))
        for start in range(0, x.shape[0], batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            out = self.logits(xb, flat)
            correct += (out.argmax(dim=-1) == yb).sum(dim=1).double()
            total_loss += loss_per_model(out, yb).double() * xb.shape[0]
        count = max(int(x.shape[0]), 1)
        return correct / count, total_loss / count

    def module(self, row: int | Tensor) -> nn.Module:
        """A standalone copy of the template model holding peer ``row``'s (or a given) weights."""
        import copy

        flat = self.params[row] if isinstance(row, int) else row
        clone = copy.deepcopy(self.template)
        with torch.no_grad():
            for name, view in self.layout.unflatten(flat.detach()).items():
                clone.get_parameter(name).copy_(view)
        return clone


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
        return torch.optim.SGD(
            [params], lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov
        )
    if name == "adam":
        return torch.optim.Adam([params], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    raise ValueError(f"optimizer: must be one of 'sgd', 'adam', got {name!r}")


def masked_step(optimizer: torch.optim.Optimizer, params: Tensor, active: Tensor | None) -> None:
    """``optimizer.step()`` for the rows where ``active [n]`` is True; other rows keep their
    parameters and optimizer state (a crashed or busy peer does not step).

    Row-shaped state (momentum buffers, Adam's moments) is restored for idle rows; Adam's
    scalar step count is shared by all rows, so an idle peer's bias correction advances too.
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


def _is_row_state(value: object, params: Tensor) -> bool:
    return isinstance(value, Tensor) and value.shape == params.shape


def gather_mix(
    values: Tensor,
    table: NeighbourTableLike,
    aggregator: AggregatorLike,
    *,
    sent: Tensor | None = None,
    alive: Tensor | None = None,
    chunk_rows: int | None = None,
) -> Tensor:
    """Every peer i mixes ``own = values[i]`` with what its neighbours sent:
    ``x_i <- rule(x_i, {sent_j : j ∈ N(i)}, W_i·)``.

    Args:
        values: each peer's own vector ``[n, d]``.
        table: who receives from whom, with the off-diagonal weights.
        aggregator: a ``consensus`` rule (``mean`` is plain gossip averaging).
        sent: what each peer sends ``[n, d]`` (default ``values``); Byzantine peers' rows differ.
        alive: ``[n]`` bool; a dead sender's entries are masked out (its weight folds into
            the receiver's self weight) and a dead receiver keeps its own vector.
        chunk_rows: mix this many receivers at a time to bound the ``[rows, k, d]`` gather;
            only for stateless rules (a rule that overrides ``reset()`` keeps batched state
            and is called once on all rows).
    """
    sent = values if sent is None else sent
    index = torch.as_tensor(np.asarray(table.index), dtype=torch.long)
    weight = torch.as_tensor(np.asarray(table.weight), dtype=values.dtype)
    mask = torch.as_tensor(np.asarray(table.mask), dtype=torch.bool)
    n = values.shape[0]
    if index.shape[0] != n:
        raise ValueError(f"table: has {index.shape[0]} rows but there are {n} peers")
    if alive is not None:
        mask = mask & alive[index]
    stateful = keeps_state(aggregator)
    if chunk_rows is None or stateful or chunk_rows >= n:
        mixed = aggregator(values, sent[index], weight, mask)
    else:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows: must be >= 1, got {chunk_rows}")
        mixed = torch.empty_like(values)
        for start in range(0, n, chunk_rows):
            rows = slice(start, start + chunk_rows)
            mixed[rows] = aggregator(values[rows], sent[index[rows]], weight[rows], mask[rows])
    if alive is not None:
        mixed = torch.where(alive.unsqueeze(1), mixed, values)
    return mixed


def keeps_state(aggregator: object) -> bool:
    """Whether a rule keeps batched state between calls: its ``stateful`` flag
    (``consensus.Rule.stateful``), else whether it overrides ``Rule.reset``."""
    flag = getattr(aggregator, "stateful", None)
    if isinstance(flag, bool):
        return flag
    reset = getattr(type(aggregator), "reset", None)
    return reset is not None and reset is not Rule.reset


def rows_for_budget(
    n: int, k: int, d: int, *, element_size: int = 4, budget_bytes: int = 1 << 23
) -> int:
    """How many receivers fit a ``[rows, k, d]`` gather in ``budget_bytes`` (default 8 MiB,
    about what stays in a CPU's last-level cache while the rule reads it back)."""
    per_row = max(k, 1) * d * element_size
    return max(1, min(n, budget_bytes // max(per_row, 1)))
