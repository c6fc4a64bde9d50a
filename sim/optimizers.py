"""Batched optimizers: one torch optimizer over the stacked ``[n, d]`` leaf is n per-peer ones.

SGD (momentum, Nesterov, weight decay) and Adam update each coordinate from that
coordinate's own state, so one optimizer over the stacked rows is exactly n independent
per-peer optimizers (``tests/sim`` checks against :class:`sim.reference.ReferencePeers`, one
``nn.Module`` and optimizer per peer). :func:`masked_step` steps only the active rows (a
crashed or busy peer does not step); :class:`BlockedOptimizer` runs gradient then step for one
block of peers at a time, while the block is in cache, with the same result as one optimizer
over all rows. :class:`RowOptimizer` steps chosen rows only, each with its own state, at a cost
proportional to those rows (AD-PSGD's events, where a few peers step at a time). The
learning-rate schedule and per-peer gradient clipping are ``workloads.optimizers``' (one
``lr_at(t)``; :class:`sim.algorithms.OptimizerConfig` attaches them to what it builds).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim.adam import adam as adam_update
from torch.optim.sgd import sgd as sgd_update

from sim.batched import BatchedPeers
from workloads.optimizers import LOCAL_OPTIMIZERS, LocalOptimizer, clip_rows_


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

    SGD (with momentum / Nesterov / weight decay), Adam (Kingma and Ba, 2015) and AdamW
    (decoupled weight decay, Loshchilov and Hutter, ICLR 2019) update each
    coordinate from that coordinate's own state, so one optimizer over the stacked rows is
    exactly n independent per-peer optimizers (tested against the per-peer reference).
    """
    _check_hyperparameters(lr, momentum, weight_decay)
    if name == "sgd":
        return _fused_if_supported(
            torch.optim.SGD,
            params,
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )
    if name in ("adam", "adamw"):
        kind = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return _fused_if_supported(
            kind, params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
        )
    raise ValueError(f"optimizer: got {name!r}; allowed: {', '.join(OPTIMIZERS)}")


def _check_hyperparameters(lr: float, momentum: float, weight_decay: float) -> None:
    if lr <= 0 or not math.isfinite(lr):
        raise ValueError(f"lr: learning rate must be a finite number > 0, got {lr}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum: must be in [0, 1), got {momentum}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay: must be >= 0, got {weight_decay}")


OPTIMIZERS = LOCAL_OPTIMIZERS
"""The local optimizers by name, the same names a peer takes (``workloads.optimizers``)."""


class RowOptimizer:
    """n per-peer optimizers over a stacked ``[n, d]`` leaf, stepping only the rows given.

    ``step(rows, values, grads)`` is, for each i, one step of peer ``rows[i]``'s own optimizer
    on its parameters ``values[i]`` (a row the caller gathered) with gradient ``grads[i]``:
    torch's own update (``torch.optim.sgd.sgd`` / ``torch.optim.adam.adam``, the functional
    form of ``torch.optim.SGD`` / ``Adam``, fused where this torch has the kernel) over the
    m rows, each row a parameter of its own whose state is a row view of the ``[n, d]``
    state. The other peers' state is neither read nor written, so a step of m rows costs
    O(m·d) whatever n is (AD-PSGD's events, a few peers at a time).

    - ``sgd`` (momentum: Polyak 1964; Nesterov as in Sutskever et al., ICML 2013):
      ``b <- μ b + g``, ``x <- x − η b`` (Nesterov: ``x − η (g + μ b)``), g including
      ``weight_decay · x``. A row that never stepped has ``b = 0``, so its first step takes
      ``b = g`` exactly, as ``torch.optim.SGD``'s first step does.
    - ``adam`` (Kingma & Ba, ICLR 2015), with ``t`` the row's OWN step count: each peer's
      bias correction counts its own steps, as on a networked peer (one torch Adam over all
      rows would share one count between all rows).

    State (``momentum_buffer``; Adam's ``exp_avg``, ``exp_avg_sq`` and ``step [n]``) is one
    ``[n, d]`` tensor per kind, allocated at the first step. Per peer, equal to a torch
    optimizer of that peer alone (``tests/sim/test_row_optimizer.py``).

    With a ``schedule`` (a :class:`workloads.optimizers.LocalOptimizer`), each row's gradient
    is clipped to its ``clip_norm`` and each row steps at ``lr_at(t)`` of its OWN step count
    t: every update above is η times the update at η = 1 (AdamW's decay ``η λ x`` too), so
    the rows step at η = 1 and each row's change is scaled by its η, vectorized
    (``tests/sim/test_optimizers_schedule.py``: equal to torch's LambdaLR per peer).

    Args:
        shape: ``(n, d)`` of the stacked leaf.
        name: ``"sgd"``, ``"adam"`` or ``"adamw"`` (Adam with decoupled weight decay).
        lr, momentum, weight_decay, nesterov: as :func:`build_optimizer`.
        betas, eps: Adam's.
        dtype, device: of the state (the leaf's).
        schedule: the learning-rate schedule and clipping (``lr`` above is its peak).
    """

    def __init__(
        self,
        shape: tuple[int, int],
        name: str = "sgd",
        *,
        lr: float = 0.1,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        schedule: LocalOptimizer | None = None,
    ) -> None:
        _check_hyperparameters(lr, momentum, weight_decay)
        if name not in OPTIMIZERS:
            raise ValueError(f"optimizer: got {name!r}; allowed: {', '.join(OPTIMIZERS)}")
        if name == "sgd" and nesterov and momentum == 0:
            raise ValueError("nesterov: Nesterov momentum needs momentum > 0, got momentum 0")
        if not all(0 <= beta < 1 for beta in betas):
            raise ValueError(f"betas: each must be in [0, 1), got {betas}")
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"shape: must be (n, d) with n, d >= 1, got {tuple(shape)}")
        self.shape = (int(shape[0]), int(shape[1]))
        self.name = name
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.nesterov = nesterov
        self.betas, self.eps = betas, eps
        self.dtype, self.device = dtype, torch.device(device)
        self.state: dict[str, Tensor] = {}
        self.fused: bool | None = None  # decided at the first step
        self.schedule = schedule if schedule is not None and schedule.scheduled else None
        self.clip_norm = None if schedule is None else schedule.clip_norm
        self._lrs = torch.empty(0, dtype=torch.float64)  # lr_at(t) for t < len, grown on use
        self._counts = torch.zeros(self.shape[0], dtype=torch.int64)  # each row's steps

    def _state(self, key: str, shape: tuple[int, ...]) -> Tensor:
        if key not in self.state:
            self.state[key] = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return self.state[key]

    @torch.no_grad()
    def step(self, rows: Tensor, values: Tensor, grads: Tensor) -> Tensor:
        """One step of peers ``rows [m]`` (distinct), in place on their parameters
        ``values [m, d]`` with gradients ``grads [m, d]``; returns ``values``."""
        m = rows.shape[0]
        if rows.dim() != 1 or values.shape != (m, self.shape[1]) or grads.shape != values.shape:
            raise ValueError(
                f"rows, values, grads: need [m], [m, {self.shape[1]}] and [m, {self.shape[1]}], "
                f"got {tuple(rows.shape)}, {tuple(values.shape)} and {tuple(grads.shape)}"
            )
        if m == 0:
            return values
        if self.clip_norm is not None:
            clip_rows_(grads, self.clip_norm)
        peers = rows.tolist()
        params, gradients = list(values.unbind(0)), list(grads.unbind(0))
        if self.fused is None:  # torch's choice for this device and dtype, as build_optimizer
            self.fused = True
            try:
                self._update(params[:1], gradients[:1], peers[:1], self.lr, probe=True)
            except (RuntimeError, TypeError, ValueError):
                self.fused = False
        if self.schedule is None:
            self._update(params, gradients, peers, self.lr)
            return values
        # each row at its own step's lr: every update is lr times the update at lr 1 (SGD,
        # Nesterov, Adam; AdamW's decay too), so step at lr 1 and scale the change per row
        counts = self._counts[rows.cpu()]
        lrs = self._lr_table(int(counts.max()) + 1)[counts]
        before = values.clone()
        self._update(params, gradients, peers, 1.0)
        scale = lrs.to(values.device, values.dtype).unsqueeze(1)
        values.sub_(before).mul_(scale).add_(before)
        self._counts[rows.cpu()] += 1
        return values

    def _lr_table(self, length: int) -> Tensor:
        """``lr_at(t)`` for ``t < length`` (at least), computed once per step index."""
        assert self.schedule is not None
        if self._lrs.numel() < length:
            more = max(length, 2 * self._lrs.numel())
            self._lrs = torch.tensor(
                [self.schedule.lr_at(t) for t in range(more)], dtype=torch.float64
            )
        return self._lrs

    def _update(
        self,
        params: list[Tensor],
        grads: list[Tensor],
        peers: list[int],
        lr: float,
        probe: bool = False,
    ) -> None:
        """torch's functional update over one parameter per row (``probe``: on copies, to
        learn whether the fused kernel runs here)."""
        options = {"fused": True} if self.fused else {"foreach": False}
        if self.name == "sgd":
            buffers: list[Tensor | None] = [None] * len(peers)
            if self.momentum != 0:
                state = self._state("momentum_buffer", self.shape)
                buffers = [state[peer] for peer in peers]
            if probe:
                params = [p.clone() for p in params]
                buffers = [None if b is None else b.clone() for b in buffers]
            sgd_update(
                params,
                grads,
                buffers,
                weight_decay=self.weight_decay,
                momentum=self.momentum,
                lr=lr,
                dampening=0.0,
                nesterov=self.nesterov,
                maximize=False,
                **options,  # type: ignore[arg-type]
            )
            return
        exp_avg = self._state("exp_avg", self.shape)
        exp_avg_sq = self._state("exp_avg_sq", self.shape)
        counts = self._state("step", (self.shape[0],))
        first = [exp_avg[peer] for peer in peers]
        second = [exp_avg_sq[peer] for peer in peers]
        steps = [counts[peer] for peer in peers]
        if probe:
            params = [p.clone() for p in params]
            first, second = [t.clone() for t in first], [t.clone() for t in second]
            steps = [t.clone() for t in steps]
        adam_update(
            params,
            grads,
            first,
            second,
            [],
            steps,
            amsgrad=False,
            beta1=self.betas[0],
            beta2=self.betas[1],
            lr=lr,
            weight_decay=self.weight_decay,
            eps=self.eps,
            maximize=False,
            decoupled_weight_decay=self.name == "adamw",
            **options,  # type: ignore[arg-type]
        )


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
        self._grads: Tensor | None = None
        # one block's gradients, reused by every block and step (no [n, d] buffer for them)
        self._block_grads = params.new_empty(
            (min(self.block_rows, params.shape[0]), params.shape[1])
        )

    @property
    def grads(self) -> Tensor:
        """An ``[n, d]`` gradient buffer reused every step, allocated on first use (only a
        plan that keeps all gradients across an exchange needs it: :meth:`step` does not)."""
        if self._grads is None or self._grads.shape != self.params.shape:
            self._grads = torch.empty_like(self.params)
        return self._grads

    def step(
        self, x: Tensor, y: Tensor, active: Tensor | None = None, *, at: Tensor | None = None
    ) -> Tensor:
        """One local step of every peer on its batch ``x [n, B, ...]``, ``y [n, B]`` (rows
        where ``active [n]`` is False keep their parameters and state); returns losses ``[n]``.

        ``at [n, d]``: take each block's gradients at these rows instead of the parameters
        and step the parameters with them: combine-then-adapt's ``x <- mix(x) − η ∇f(x)``
        with the mixed models already in the parameters and the pre-mixing ones in ``at``
        (one block of gradients in flight instead of an ``[n, d]`` buffer of them)."""
        n = self.params.shape[0]
        if x.shape[0] != n or y.shape[0] != n:
            raise ValueError(
                f"x, y: leading dimension must be the number of peers {n}, "
                f"got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        if at is not None and at.shape != self.params.shape:
            raise ValueError(
                f"at: must have the parameters' shape {tuple(self.params.shape)}, "
                f"got {tuple(at.shape)}"
            )
        losses = torch.empty(n, dtype=self.params.dtype, device=self.params.device)
        for index, (block, optimizer) in enumerate(zip(self.blocks, self.optimizers)):
            rows = slice(index * self.block_rows, index * self.block_rows + block.shape[0])
            grads = self._block_grads[: block.shape[0]]
            if active is not None and not bool(active[rows].any()):
                # no gradient for an all-idle block, but its optimizer still steps (and
                # restores every row) so that shared scalar state (Adam's step count)
                # advances exactly as in one optimizer over all rows
                block.grad = grads.zero_()
                masked_step(optimizer, block, active[rows])
                block.grad = None
                continue
            source = block if at is None else at[rows]
            loss, block.grad = self.peers.gradients(
                x[rows], y[rows], source, block_rows=block.shape[0], out=grads
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
