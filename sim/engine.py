"""The batched engine: n copies of one model as a single ``[n, d]`` tensor.

All peers' parameters live in one stacked leaf ``params [n, d]``; gradients for every
peer come from one call over per-peer batches ``x [n, B, ...]``, ``y [n, B]``: the
hand-derived batched kernels of :mod:`sim.linear_chain` for chains of ``Linear`` layers and
activations, ``torch.func.vmap(torch.func.grad(loss))`` for every other model. One torch
optimizer over the stacked leaf is the n per-peer optimizers at once (SGD, momentum and Adam
are elementwise, which ``tests/sim`` checks against :class:`sim.reference.ReferencePeers`,
one ``nn.Module`` and optimizer per peer).

Mixing: plain gossip averaging is one sparse product ``X <- W X`` (:func:`sparse_mix`);
other ``consensus`` rules read neighbours by gather, ``params[index] -> [k, d]`` per
receiver along a ``topologies.NeighbourTable``, chunk by chunk. The cost is O(n * k * d),
never a dense n x n product.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from consensus.base import Rule
from consensus.mean import WeightedMean, weighted_mean
from gossip.algorithms import NeighbourTableLike
from gossip.flat import ParameterLayout
from sim.linear_chain import LinearChain, NotALinearChainError
from workloads.models import NotBatchableError, check_batchable

LossFunction = Callable[[Tensor, Tensor], Tensor]

#: values of :class:`BatchedPeers`' ``kernel`` argument
KERNELS = ("auto", "vmap", "linear")


class ModelNotBatchableError(NotBatchableError):
    """A user model that ``torch.func.vmap`` cannot run over a stack of peers (a
    ``workloads.NotBatchableError``, itself a ``ValueError``)."""


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
        kernel: how gradients are computed. ``"auto"`` (default): by the hand-derived
            batched kernels of :class:`sim.linear_chain.LinearChain` when the model is a
            chain of ``Linear`` layers and activations (an MLP, logistic regression, such an
            ``nn.Sequential``) under the default loss, else by ``vmap(grad)``; ``"vmap"``:
            always ``vmap(grad)``; ``"linear"``: the chain kernels, and a ``ValueError``
            saying why when the model does not qualify. Both give the same gradients up to
            float rounding (tested); :attr:`kernel` says which one is in use.
        device: where the stacked parameters, the model's buffers and everything the engine
            derives from them live (``"cpu"``, ``"cuda"``, ``"cuda:1"``; see
            :func:`workloads.resolve_device`). Initial weights are drawn on the CPU and
            moved, so they are the same on every device.

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
        kernel: str = "auto",
        device: torch.device | str = "cpu",
    ) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n: number of peers must be an integer >= 1, got {n!r}")
        if init not in ("same", "independent"):
            raise ValueError(f"init: must be one of 'same', 'independent', got {init!r}")
        if kernel not in KERNELS:
            raise ValueError(
                f"kernel: must be one of {', '.join(map(repr, KERNELS))}, got {kernel!r}"
            )
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
        device = torch.device(device)
        self.buffers = {name: b.detach().to(device) for name, b in template.named_buffers()}
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
        # built on the CPU under the seed (same initial weights on every device), then moved
        self.params: Tensor = stacked.to(device)
        # differentiate w.r.t. per-parameter views of each row (not the flat row: the backward
        # of n slices of one flat vector would zero-fill and add n full [n, d] buffers).
        # vmap(grad) rather than vmap(forward) + one backward of the summed losses: the latter
        # returns every weight gradient transposed ([out, in] with strides of [in, out]), and
        # flattening those costs more than it saves (measured for mlp-100k).
        self._grad_fn = vmap(grad_and_value(self._loss_of_views), in_dims=(0, 0, 0))
        self._forward_shared = vmap(self._forward_views, in_dims=(0, None))
        self._checked = False
        self.chain: LinearChain | None = None
        if kernel != "vmap":
            try:
                if loss is not None:
                    raise NotALinearChainError(
                        "a custom loss is given (the kernels compute cross entropy)"
                    )
                self.chain = LinearChain.from_module(template, self.layout)
            except NotALinearChainError as error:
                if kernel == "linear":
                    raise ValueError(f"kernel: 'linear' cannot run this model: {error}") from error

    @property
    def kernel(self) -> str:
        """``"linear"`` when gradients come from :class:`sim.linear_chain.LinearChain` (for
        inputs it :meth:`~sim.linear_chain.LinearChain.accepts`), else ``"vmap"``."""
        return "vmap" if self.chain is None else "linear"

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
        self,
        x: Tensor,
        y: Tensor,
        params: Tensor | None = None,
        *,
        block_rows: int | None = None,
        out: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Per-peer loss ``[m]`` and gradient ``[m, d]`` of ``params [m, d]`` (default all).

        Peers are processed ``block_rows`` at a time (default: as many as keep about 32 MiB of
        per-peer gradients in flight), each block one ``vmap(grad)`` whose result is written
        straight into the ``[m, d]`` output: at large n this keeps the block's gradients in
        the CPU cache instead of materialising and copying an ``[n, d]`` intermediate.
        ``out`` (``[m, d]``, contiguous) receives the gradients instead of a new tensor: a
        buffer reused every step costs no fresh pages (a new 100 MB tensor is ~25k page
        faults, each zero-filled by the kernel).
        """
        flat = self.params if params is None else params
        m = flat.shape[0]
        if x.shape[0] != m or y.shape[0] != m:
            raise ValueError(
                f"x, y: leading dimension must be the number of peers {m}, "
                f"got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        block = block_rows or self.default_block_rows()
        if block < 1:
            raise ValueError(f"block_rows: must be >= 1, got {block_rows}")
        flat = flat.detach()
        if out is not None and (out.shape != flat.shape or not out.is_contiguous()):
            raise ValueError(
                f"out: must be a contiguous tensor of shape {tuple(flat.shape)}, "
                f"got {tuple(out.shape)}"
            )
        if self.chain is not None and self.chain.accepts(flat, x, y):
            out = torch.empty_like(flat) if out is None else out
            losses = torch.empty(m, dtype=flat.dtype, device=flat.device)
            for start in range(0, m, block):
                rows = slice(start, start + block)
                losses[rows] = self.chain.gradients(flat[rows], x[rows], y[rows], out=out[rows])
            return losses, out
        if m <= block:
            views = self.layout.unflatten(flat)
            grads, losses = self._batchable_guard(self._grad_fn, views, x, y)
            if out is None:
                return losses.detach(), self.layout.flatten(grads).detach()
            self._flatten_into(grads, out)
            return losses.detach(), out
        out = torch.empty_like(flat) if out is None else out
        losses = torch.empty(m, dtype=flat.dtype, device=flat.device)
        for start in range(0, m, block):
            rows = slice(start, start + block)
            views = self.layout.unflatten(flat[rows])
            grads, loss = self._batchable_guard(self._grad_fn, views, x[rows], y[rows])
            self._flatten_into(grads, out[rows])
            losses[rows] = loss.detach()
        return losses, out

    def _flatten_into(self, grads: dict[str, Tensor], out: Tensor) -> None:
        """``layout.flatten(grads)`` written into ``out [b, d]`` by one ``torch.cat``."""
        rows = out.shape[0]
        parts = [grads[e.name].detach().reshape(rows, e.numel) for e in self.layout.entries]
        torch.cat(parts, dim=1, out=out)

    def default_block_rows(self) -> int:
        """Peers per gradient call: as many as keep ~32 MiB of gradients in flight, split
        evenly (64 peers of 100k parameters: one block; 100 peers: two of 50)."""
        limit = max(1, (32 << 20) // (self.params.element_size() * self.dim))
        return even_blocks(self.n, limit)

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
        correct = torch.zeros(flat.shape[0], dtype=torch.float64, device=flat.device)
        total_loss = torch.zeros(flat.shape[0], dtype=torch.float64, device=flat.device)
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


def even_blocks(n: int, limit: int) -> int:
    """The block size that splits ``n`` rows into as few blocks of at most ``limit`` rows as
    possible, all of about the same size (no block of one peer left over)."""
    count = -(-n // max(limit, 1))
    return -(-n // count)


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


def gather_mix(
    values: Tensor,
    table: NeighbourTableLike,
    aggregator: AggregatorLike,
    *,
    sent: Tensor | None = None,
    alive: Tensor | None = None,
    chunk_rows: int | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """Every peer i mixes ``own = values[i]`` with what its neighbours sent:
    ``x_i <- rule(x_i, {sent_j : j ∈ N(i)}, W_i·)``.

    Plain averaging (``consensus.WeightedMean``) of the peers' own vectors runs as one sparse
    product (:func:`sparse_mix`); other rules, or messages that differ from the senders'
    vectors (Byzantine peers, compression), gather the neighbours' rows.

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
        out: an ``[n, d]`` buffer (not ``values`` or ``sent``) for the chunked result, reused
            between rounds so that no fresh ``[n, d]`` pages are faulted in every round.
    """
    sent = values if sent is None else sent
    device = values.device
    index = torch.as_tensor(np.asarray(table.index), dtype=torch.long, device=device)
    weight = torch.as_tensor(np.asarray(table.weight), dtype=values.dtype, device=device)
    mask = torch.as_tensor(np.asarray(table.mask), dtype=torch.bool, device=device)
    n = values.shape[0]
    if index.shape[0] != n:
        raise ValueError(f"table: has {index.shape[0]} rows but there are {n} peers")
    if alive is not None:
        mask = mask & alive[index]
    if out is not None and (
        out.shape != values.shape or out.data_ptr() in (values.data_ptr(), sent.data_ptr())
    ):
        raise ValueError(
            f"out: must be a separate buffer of shape {tuple(values.shape)}, got {tuple(out.shape)}"
        )
    if type(aggregator) is WeightedMean and sent is values:
        # plain gossip averaging of the peers' own vectors is one sparse product
        product = sparse_mix(values, index, weight, mask, alive=alive, out=out)
        if product is not None:
            return product
    stateful = keeps_state(aggregator)
    if chunk_rows is None or stateful or chunk_rows >= n:
        mixed = aggregator(values, gather_rows(sent, index), weight, mask)
    else:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows: must be >= 1, got {chunk_rows}")
        mixed = torch.empty_like(values) if out is None else out
        # one gather buffer for every chunk: no fresh pages per chunk
        linear = type(aggregator) is WeightedMean and mixed.is_contiguous()
        scratch = sent.new_empty(chunk_rows * index.shape[1], sent.shape[1])
        for start in range(0, n, chunk_rows):
            rows = slice(start, start + chunk_rows)
            received = gather_rows(sent, index[rows], out=scratch)
            if linear:  # straight into the result rows: no temporary, no copy
                weighted_mean(values[rows], received, weight[rows], mask[rows], out=mixed[rows])
            else:
                mixed[rows] = aggregator(values[rows], received, weight[rows], mask[rows])
    if alive is not None:
        mixed = torch.where(alive.unsqueeze(1), mixed, values)
    if out is not None and mixed is not out:
        out.copy_(mixed)
        return out
    return mixed


def sparse_gossip_matrix(
    index: Tensor, weight: Tensor, mask: Tensor, *, alive: Tensor | None = None
) -> Tensor:
    """The sparse ``[n, n]`` gossip matrix (CSR) of a neighbour table: ``W_ij`` at the
    neighbours a receiver hears from (``mask``), the self weight ``w_ii = 1 − Σ_j W_ij`` on
    the diagonal, so a masked neighbour's weight folds into the self weight as in
    :func:`consensus.weighted_mean`; a dead receiver (``alive`` False) gets the identity row.
    ``n · (k + 1)`` stored entries; a neighbour listed twice has its weights summed."""
    n, k = index.shape
    w = torch.where(mask, weight, 0.0)
    if alive is not None:
        w = torch.where(alive.unsqueeze(1), w, 0.0)
    self_weight = 1.0 - w.sum(dim=1)
    rows = torch.arange(n, device=index.device)
    coordinates = torch.stack(
        (torch.cat((rows, rows.repeat_interleave(k))), torch.cat((rows, index.reshape(-1))))
    )
    values = torch.cat((self_weight, w.reshape(-1)))
    matrix = torch.sparse_coo_tensor(
        coordinates, values, (n, n), check_invariants=True, device=values.device
    )
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return matrix.coalesce().to_sparse_csr()


def sparse_mix(
    values: Tensor,
    index: Tensor,
    weight: Tensor,
    mask: Tensor,
    *,
    alive: Tensor | None = None,
    out: Tensor | None = None,
) -> Tensor | None:
    """Gossip averaging of every peer at once as one sparse product, ``X <- W X`` with ``W``
    from :func:`sparse_gossip_matrix`: O(n · (k + 1) · d) work, one read of the neighbours' rows
    and one write of the result (into ``out`` when given), about half the memory traffic of a
    gather followed by a weighted sum.

    The product runs over column chunks of a few MiB, and each chunk of the result is summed
    while it is still in cache: the finiteness check costs no second pass over ``[n, d]``.
    ``W`` is built once per distinct table (a static topology without losses reuses it
    every round; see :func:`cached_gossip_matrix`).

    Returns None where the exact :func:`consensus.weighted_mean` must run instead: a dtype
    torch's sparse product does not take, or a non-finite result (that rule masks a
    non-finite neighbour row and refuses a non-finite own vector, row by row).
    """
    if values.dim() != 2 or values.dtype not in (torch.float32, torch.float64):
        return None
    matrix = cached_gossip_matrix(
        index, weight, mask, alive=alive, dtype=values.dtype, device=values.device
    )
    target = torch.empty_like(values) if out is None else out
    n, d = values.shape
    # column chunks keep a CPU's cache hot; a GPU takes the whole product in one call
    width = (
        min(d, max(256, _MIX_CHUNK_BYTES // max(1, n * values.element_size())))
        if values.device.type == "cpu"
        else d
    )
    sums = values.new_empty(-(-d // width))
    for chunk, start in enumerate(range(0, d, width)):
        part = target[:, start : start + width]
        torch.addmm(part, matrix, values[:, start : start + width], beta=0, out=part)
        torch.sum(part, dim=(0, 1), out=sums[chunk])
    # a NaN or Inf anywhere makes its chunk's sum non-finite; a finite sum proves the chunk
    # finite, and only an overflowing sum needs the exact elementwise check
    finite = bool(torch.isfinite(sums).all()) or bool(torch.isfinite(target).all())
    return target if finite else None


#: bytes of ``values`` per column chunk of :func:`sparse_mix` (cache-sized)
_MIX_CHUNK_BYTES = 4 << 20
_MATRIX_CACHE_SIZE = 4
_matrix_cache: OrderedDict[tuple[object, ...], Tensor] = OrderedDict()
_matrix_cache_lock = threading.Lock()


def cached_gossip_matrix(
    index: Tensor,
    weight: Tensor,
    mask: Tensor,
    *,
    alive: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Tensor:
    """:func:`sparse_gossip_matrix` of the table, ``dtype`` and ``device``, reused while the
    same table comes again: the key is the tables' exact contents (n · k small entries), so a
    changed weight, mask or liveness builds a new matrix. The last few matrices are kept."""
    key = (
        str(torch.device(device)),
        dtype,
        tuple(index.shape),
        *(
            None if t is None else t.detach().cpu().contiguous().numpy().tobytes()
            for t in (index, weight.to(dtype), mask.to(torch.bool), alive)
        ),
    )
    with _matrix_cache_lock:
        matrix = _matrix_cache.get(key)
        if matrix is not None:
            _matrix_cache.move_to_end(key)
            return matrix
    matrix = sparse_gossip_matrix(
        index.to(device),
        weight.to(device, dtype),
        mask.to(device),
        alive=None if alive is None else alive.to(device),
    )
    with _matrix_cache_lock:
        _matrix_cache[key] = matrix
        while len(_matrix_cache) > _MATRIX_CACHE_SIZE:
            _matrix_cache.popitem(last=False)
    return matrix


def gather_rows(values: Tensor, index: Tensor, *, out: Tensor | None = None) -> Tensor:
    """``values[index]`` for ``values [n, *rest]`` and ``index [m, k]``: the ``[m, k, *rest]``
    rows each receiver reads, by ``torch.index_select`` (several times faster than advanced
    indexing on CPU), written into the front of ``out`` (at least ``m * k`` rows shaped like
    those of ``values``) when given, so that a buffer can be reused."""
    flat = index.reshape(-1)
    rest = tuple(values.shape[1:])
    if out is None:
        rows = torch.index_select(values, 0, flat)
    else:
        if out.shape[0] < flat.numel() or tuple(out.shape[1:]) != rest:
            raise ValueError(
                f"out: needs at least {flat.numel()} rows of shape {rest}, "
                f"got shape {tuple(out.shape)}"
            )
        rows = torch.index_select(values, 0, flat, out=out[: flat.numel()])
    return rows.view(*index.shape, *rest)


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
