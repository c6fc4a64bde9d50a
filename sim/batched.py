"""The batched model: n copies of one model as a single ``[n, d]`` tensor, and its gradients.

All peers' parameters live in one stacked leaf ``params [n, d]``; gradients for every
peer come from one call over per-peer batches ``x [n, B, ...]``, ``y [n, B]``, by one of three
kernels (:class:`BatchedPeers` picks): the hand-derived batched kernels of
:mod:`sim.linear_chain` for chains of ``Linear`` layers and activations, the language
model's forward over a peer dimension with one backward pass (:mod:`sim.gpt_kernel`), and
``torch.func.vmap(torch.func.grad(loss))`` for every other model. All write each block of
peers' gradients straight into the flat ``[n, d]`` buffer, a cache-sized block at a time.

Dropout layers (``nn.Dropout``, ``nn.Dropout1d/2d/3d``) are seeded by :class:`BatchedPeers`'
``seed``, not by torch's global generator (:class:`workloads.dropout.SeededDropout`): the
mask of row r in the k-th :meth:`BatchedPeers.gradients` call is a counter-based hash
(SplitMix64) of (seed, k, r, which dropout call, element), so it is the same however the rows
are split into blocks, on every device, and whatever else the process draws. Any other
random operation of a model (``AlphaDropout``, ``RReLU``, ``torch.rand`` in a ``forward``)
draws from torch's global generator under vmap's ``randomness="different"``, which
:func:`sim.build.build` seeds for a run.

The optimizers over the stacked leaf live in :mod:`sim.optimizers`, mixing in
:mod:`sim.mixing`; :class:`sim.reference.ReferencePeers` (one ``nn.Module`` per peer) is what
``tests/sim`` checks them against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from gossip.flat import ParameterLayout
from sim.gpt_kernel import BatchedGPT, NotAGPTError
from sim.linear_chain import LinearChain, NotALinearChainError
from workloads.batching import splitmix64
from workloads.dropout import SeededDropout, has_dropout
from workloads.models import NotBatchableError, check_batchable
from workloads.task import cross_entropy

if TYPE_CHECKING:
    from sim.privacy import SimPrivacy

LossFunction = Callable[[Tensor, Tensor], Tensor]

#: values of :class:`BatchedPeers`' ``kernel`` argument
KERNELS = ("auto", "vmap", "linear", "gpt")


class ModelNotBatchableError(NotBatchableError):
    """A user model that ``torch.func.vmap`` cannot run over a stack of peers (a
    ``workloads.NotBatchableError``, itself a ``ValueError``)."""


def _flat(layout: ParameterLayout, module: nn.Module) -> Tensor:
    return layout.flatten({name: p.detach() for name, p in module.named_parameters()})


def _seeded_copy(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()


_BITS_63 = (1 << 63) - 1
_ROWS = 32
"""Bits of a key's row number (the call number sits above them)."""


class _RowMasks:
    """Uniform numbers for the dropout masks of one row under ``vmap``: a SplitMix64 hash
    of the row's ``key`` (an int64 scalar, batched over the rows), the dropout call's index
    in the forward pass and the element's index, two 24-bit numbers per hash (integer
    arithmetic only, so the same on every device)."""

    def __init__(self, key: Tensor) -> None:
        self.key = key
        self.calls = 0

    def __call__(self, shape: Sequence[int], device: torch.device) -> Tensor:
        self.calls += 1
        numel = math.prod(shape)
        pairs = torch.arange((numel + 1) // 2, dtype=torch.int64, device=device)
        bits = splitmix64(pairs ^ splitmix64(self.key + self.calls * _GOLDEN_GAMMA))
        # two 24-bit numbers from each 64-bit hash: bits 40..63 and 8..31
        halves = torch.stack(((bits >> 40) & 0xFFFFFF, (bits >> 8) & 0xFFFFFF), dim=-1)
        uniform = halves.flatten()[:numel].to(torch.float32) * 2.0**-24
        return uniform.reshape(list(shape))


_GOLDEN_GAMMA = 0x61C88647
"""An odd 32-bit step between the dropout calls' streams of one row."""


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
        seed: seeds the initial weights and the dropout masks of :meth:`gradients`.
        loss: ``loss(logits [B, C], targets [B]) -> scalar``; by default cross entropy over
            every target (:func:`workloads.task.cross_entropy`: a classifier's ``[B, C]``
            logits and ``[B]`` labels, or a language model's ``[B, L, V]`` and ``[B, L]``).
        kernel: how gradients are computed. ``"auto"`` (default): by the hand-derived
            batched kernels of :class:`sim.linear_chain.LinearChain` when the model is a
            chain of ``Linear`` layers and activations (an MLP, logistic regression, such an
            ``nn.Sequential``) under the default loss, by the stacked forward of
            :class:`sim.gpt_kernel.BatchedGPT` (one backward pass for all peers) when it is a
            :class:`workloads.gpt.GPT` under the default loss, else by ``vmap(grad)``;
            ``"vmap"``: always ``vmap(grad)``; ``"linear"`` and ``"gpt"``: that kernel, and a
            ``ValueError`` saying why when the model does not qualify. All give the same
            gradients up to float rounding (tested); :attr:`kernel` says which one is in use.
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
            raise ValueError(f"init: got {init!r}; allowed: same, independent")
        if kernel not in KERNELS:
            raise ValueError(f"kernel: got {kernel!r}; allowed: {', '.join(KERNELS)}")
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
        # static checks (BatchNorm running statistics...); random layers draw a different
        # mask for every peer (dropout from the seed, see the module docstring, anything else
        # under vmap's randomness='different') and are off when models are evaluated
        check_batchable(template, randomness="different")
        self.seed = seed
        self._dropout = has_dropout(template)
        self._seed_key = int(splitmix64(torch.tensor(seed & _BITS_63, dtype=torch.int64)))
        self._calls = 0
        self.layout = ParameterLayout.from_module(template)
        if self.layout.numel == 0:
            raise ValueError("model: has no parameters to train (numel 0)")
        self.loss: LossFunction = loss if loss is not None else cross_entropy
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
        self._grad_fn = vmap(
            grad_and_value(self._loss_of_views),
            in_dims=(0, 0, 0, 0 if self._dropout else None),
            randomness="different",
        )
        self._forward_shared = vmap(self._forward_views, in_dims=(0, None))
        self._checked = False
        self.privacy: SimPrivacy | None = None
        """DP-SGD (an experiment's ``[privacy]``): when set, :meth:`gradients` returns every
        peer's private gradient of the batch it drew last (:meth:`sim.privacy.SimPrivacy.gradients`)
        instead of the plain one, for all n peers at once."""
        self.chain: LinearChain | None = None
        if kernel in ("auto", "linear"):
            try:
                if loss is not None:
                    raise NotALinearChainError(
                        "a custom loss is given (the kernels compute cross entropy)"
                    )
                self.chain = LinearChain.from_module(template, self.layout)
            except NotALinearChainError as error:
                if kernel == "linear":
                    raise ValueError(f"kernel: 'linear' cannot run this model: {error}") from error
        self.gpt: BatchedGPT | None = None
        if kernel in ("auto", "gpt"):
            try:
                if loss is not None:
                    raise NotAGPTError("a custom loss is given (the kernel computes cross entropy)")
                self.gpt = BatchedGPT.from_module(template, self.layout)
            except NotAGPTError as error:
                if kernel == "gpt":
                    raise ValueError(f"kernel: 'gpt' cannot run this model: {error}") from error

    @property
    def kernel(self) -> str:
        """``"linear"`` when gradients come from :class:`sim.linear_chain.LinearChain`,
        ``"gpt"`` from :class:`sim.gpt_kernel.BatchedGPT` (each for the inputs it
        ``accepts``), else ``"vmap"``."""
        if self.chain is not None:
            return "linear"
        return "vmap" if self.gpt is None else "gpt"

    @property
    def dim(self) -> int:
        """d, the number of parameters of one peer's model."""
        return self.layout.numel

    def _forward_views(self, views: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(self.template, (views, self.buffers), (x,))

    def _loss_of_views(
        self, views: dict[str, Tensor], x: Tensor, y: Tensor, key: Tensor | None
    ) -> Tensor:
        if key is None:
            return self.loss(self._forward_views(views, x), y)
        with SeededDropout(_RowMasks(key)):
            return self.loss(self._forward_views(views, x), y)

    def _row_keys(self, m: int, device: torch.device) -> Tensor | None:
        """Row r's dropout key for this call: SplitMix64 of (call number, r) and the seed, a
        bijection, so no two (call, row) share one; None for a model without dropout."""
        if not self._dropout:
            return None
        self._calls += 1
        rows = torch.arange(m, dtype=torch.int64, device=device)
        return splitmix64((rows + (self._calls << _ROWS)) ^ self._seed_key)

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
        Dropout masks depend on ``seed``, the number of calls so far and the row, not on
        ``block_rows`` (see the module docstring).
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
        if self.privacy is not None:
            return self._private_gradients(flat, x, y, out)
        kernels = [k for k in (self.chain, self.gpt) if k is not None]
        kernel = next((k for k in kernels if k.accepts(flat, x, y)), None)
        if kernel is not None:  # a hand-written kernel writes each block into ``out``
            out = torch.empty_like(flat) if out is None else out
            losses = torch.empty(m, dtype=flat.dtype, device=flat.device)
            for start in range(0, m, block):
                rows = slice(start, start + block)
                losses[rows] = kernel.gradients(flat[rows], x[rows], y[rows], out=out[rows])
            return losses, out
        keys = self._row_keys(m, flat.device)
        if m <= block:
            views = self.layout.unflatten(flat)
            grads, losses = self._batchable_guard(self._grad_fn, views, x, y, keys)
            if out is None:
                return losses.detach(), self.layout.flatten(grads).detach()
            self._flatten_into(grads, out)
            return losses.detach(), out
        out = torch.empty_like(flat) if out is None else out
        losses = torch.empty(m, dtype=flat.dtype, device=flat.device)
        for start in range(0, m, block):
            rows = slice(start, start + block)
            views = self.layout.unflatten(flat[rows])
            grads, loss = self._batchable_guard(
                self._grad_fn, views, x[rows], y[rows], None if keys is None else keys[rows]
            )
            self._flatten_into(grads, out[rows])
            losses[rows] = loss.detach()
        return losses, out

    def _private_gradients(
        self, flat: Tensor, x: Tensor, y: Tensor, out: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """DP-SGD's gradients of all n peers (the linear-chain kernels are not used: they
        give no per-sample gradients)."""
        assert self.privacy is not None
        if flat.shape[0] != self.n:
            raise ValueError(
                f"privacy: DP-SGD takes every peer's gradient at once ({self.n} rows), "
                f"got {flat.shape[0]}"
            )
        out = torch.empty_like(flat) if out is None else out
        losses = self._batchable_guard(
            self.privacy.gradients,
            self.template,
            [e.name for e in self.layout.entries if e.kind == "parameter"],
            self.layout.unflatten(flat),
            self.buffers,
            self.loss,
            x,
            y,
            out,
        )
        return losses, out

    def _flatten_into(self, grads: dict[str, Tensor], out: Tensor) -> None:
        """``layout.flatten(grads)`` written into ``out [b, d]`` by one ``torch.cat``."""
        rows = out.shape[0]
        parts = [grads[e.name].detach().reshape(rows, e.numel) for e in self.layout.entries]
        torch.cat(parts, dim=1, out=out)

    def default_block_rows(self) -> int:
        """Peers per gradient call: as many as keep ~32 MiB of gradients in flight, split
        evenly (64 peers of 100k parameters: one block; 100 peers: two of 50). With DP-SGD
        all n (its gradients block their per-sample gradients themselves)."""
        if self.privacy is not None:
            return self.n
        limit = max(1, (32 << 20) // (self.params.element_size() * self.dim))
        return even_blocks(self.n, limit)

    @torch.no_grad()
    def logits(self, x: Tensor, params: Tensor | None = None) -> Tensor:
        """Outputs ``[m, N, C]`` of models ``params [m, d]`` on one shared input ``x [N, ...]``."""
        flat = self.params if params is None else params
        views = self.layout.unflatten(flat)
        training = self.template.training
        self.template.eval()  # dropout off, as a trained model is used
        try:
            return self._batchable_guard(self._forward_shared, views, x)
        finally:
            self.template.train(training)

    @torch.no_grad()
    def evaluate(
        self, x: Tensor, y: Tensor, params: Tensor | None = None, *, batch_size: int = 4096
    ) -> tuple[Tensor, Tensor]:
        """Accuracy ``[m]`` and mean loss ``[m]`` per target of models ``params [m, d]`` on
        ``(x, y)``: a classifier's labels ``y [N]``, or a language model's next tokens
        ``y [N, L]`` (accuracy is then next-token top-1, the loss the mean over all N·L
        positions; :func:`workloads.task.metrics` names them for the task).

        One vmap over the models per chunk of ``batch_size`` targets (examples of a
        classifier, ``batch_size // L`` contexts of a language model).
        """
        flat = self.params if params is None else params
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        correct = torch.zeros(flat.shape[0], dtype=torch.float64, device=flat.device)
        total_loss = torch.zeros(flat.shape[0], dtype=torch.float64, device=flat.device)
        loss_per_model = vmap(self.loss, in_dims=(0, None))
        per_sample = max(math.prod(y.shape[1:]), 1)
        rows = max(batch_size // per_sample, 1)
        for start in range(0, x.shape[0], rows):
            xb, yb = x[start : start + rows], y[start : start + rows]
            out = self.logits(xb, flat)
            correct += (out.argmax(dim=-1) == yb).flatten(1).sum(dim=1).double()
            total_loss += loss_per_model(out, yb).double() * yb.numel()
        count = max(int(y.numel()), 1)
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
