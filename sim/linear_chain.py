"""Batched forward and backward for chains of ``nn.Linear`` layers and elementwise activations.

The general engine (:class:`sim.batched.BatchedPeers`) differentiates any model with
``vmap(grad(loss))``. For the models a simulation trains most (an MLP, logistic regression,
any ``nn.Sequential`` of ``Linear`` and activations) under the default cross-entropy loss,
this module computes the same gradients with a handful of batched matrix products per layer,
written straight into rows of the flat ``[n, d]`` gradient buffer:

    forward   z_l = h_{l-1} W_l^T + b_l,      h_l = σ(z_l)                (one baddbmm)
    loss      ℓ = mean_b −log softmax(z_L)[y_b],   g_L = (softmax(z_L) − onehot(y)) / B
    backward  ∂W_l = g_l^T h_{l-1},  ∂b_l = Σ_b g_l,  g_{l-1} = σ'(z_{l-1}) ⊙ (g_l W_l)

for every peer at once (one matrix per peer in each ``bmm``). Compared with ``vmap(grad)``:
no per-call tracing of the module (about 1 ms per call), no fresh ``[n, out, in]`` gradient
tensors that the kernel must zero-fill page by page and ``torch.cat`` must copy again; each
weight gradient is written once, into its place in the caller's buffer. This is the
per-layer approach Opacus takes for per-sample gradients of ``Linear`` layers (Yousefpour et
al., 2021), here per peer instead of per sample. The activation derivatives are ATen's own
backward kernels (``threshold_backward``, ``tanh_backward``, ...), those autograd runs.

:meth:`LinearChain.from_module` decides whether a model qualifies, by exact module types
(:func:`workloads.layer_chain`); anything else stays on ``vmap(grad)``. ``tests/sim``
checks both paths agree for every supported layer.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gossip.flat import LayoutEntry, ParameterLayout
from workloads.models import layer_chain

__all__ = ["ACTIVATIONS", "SCRATCH_MAX", "LinearChain", "NotALinearChainError"]

#: weights of at most this many entries get their gradients through a contiguous scratch
#: (measured on 64 peers at batch 8 and 32: 2,910 and 11,640 entries gain 1.3-3.9x per
#: gemm, 30,000 break even, 84,681 lose 20% at batch 32)
SCRATCH_MAX = 16384


class NotALinearChainError(ValueError):
    """The model is not a chain of ``Linear`` layers and supported activations."""


@dataclass(frozen=True)
class _Dense:
    name: str
    weight: int  # offset of the [out, in] weight in the flat vector
    bias: int | None  # offset of the [out] bias, None without one
    out_features: int
    in_features: int


@dataclass(frozen=True)
class _Activation:
    name: str
    kind: str
    slope: float = 0.0  # LeakyReLU's negative slope
    approximate: str = "none"  # GELU's


@dataclass(frozen=True)
class _Flatten:
    name: str


_Step = _Dense | _Activation | _Flatten

#: activation module types the chain runs, by exact type
ACTIVATIONS: dict[type[nn.Module], str] = {
    nn.ReLU: "relu",
    nn.LeakyReLU: "leaky_relu",
    nn.Tanh: "tanh",
    nn.Sigmoid: "sigmoid",
    nn.GELU: "gelu",
    nn.SiLU: "silu",
    nn.Identity: "identity",
}


def _in_place(step: _Activation) -> bool:
    """Whether the activation may overwrite its input: its derivative needs only its output."""
    return step.kind in ("relu", "tanh", "sigmoid", "identity") or (
        step.kind == "leaky_relu" and step.slope >= 0
    )


def _activate(step: _Activation, z: Tensor, out: Tensor) -> None:
    """``out = σ(z)`` (``out`` is ``z`` itself for an in-place activation)."""
    nn_ops = torch._C._nn
    if step.kind == "relu":
        torch.relu_(out)
    elif step.kind == "leaky_relu":
        if out is not z:
            out.copy_(z)
        nn_ops.leaky_relu_(out, step.slope)
    elif step.kind == "tanh":
        torch.tanh_(out)
    elif step.kind == "sigmoid":
        torch.sigmoid_(out)
    elif step.kind == "gelu":
        torch.ops.aten.gelu.out(z, approximate=step.approximate, out=out)
    elif step.kind == "silu":
        torch.ops.aten.silu.out(z, out=out)
    elif out is not z:  # identity
        out.copy_(z)


def _activation_backward(step: _Activation, grad: Tensor, z: Tensor, a: Tensor) -> None:
    """``grad <- σ'(z) ⊙ grad`` in place, for ``a = σ(z)``, by the kernel autograd itself runs."""
    aten = torch.ops.aten
    if step.kind == "relu":
        aten.threshold_backward.grad_input(grad, a, 0.0, grad_input=grad)
    elif step.kind == "leaky_relu":
        if step.slope >= 0:
            aten.leaky_relu_backward.grad_input(grad, a, step.slope, True, grad_input=grad)
        else:
            aten.leaky_relu_backward.grad_input(grad, z, step.slope, False, grad_input=grad)
    elif step.kind == "tanh":
        aten.tanh_backward.grad_input(grad, a, grad_input=grad)
    elif step.kind == "sigmoid":
        aten.sigmoid_backward.grad_input(grad, a, grad_input=grad)
    elif step.kind == "gelu":
        aten.gelu_backward.grad_input(grad, z, approximate=step.approximate, grad_input=grad)
    elif step.kind == "silu":
        aten.silu_backward.grad_input(grad, z, grad_input=grad)


class _Workspace:
    """Every intermediate of one block shape ``(b, B)``, allocated once and reused: a fresh
    activation tensor per step would be handed new pages by the allocator (a few hundred KB
    each, zero-filled by the kernel page by page), which costs more than the arithmetic."""

    def __init__(self, chain: LinearChain, b: int, batch: int, like: Tensor) -> None:
        def buffer(width: int) -> Tensor:
            return like.new_empty(b, batch, width)

        self.outputs: list[Tensor | None] = []  # None: the step writes into its input
        self.grads: list[Tensor | None] = []  # grad w.r.t. a Dense layer's input
        for step, width in zip(chain.steps, chain.widths):
            if isinstance(step, _Dense) or (isinstance(step, _Activation) and not _in_place(step)):
                self.outputs.append(buffer(width))
            else:
                self.outputs.append(None)
            self.grads.append(buffer(step.in_features) if isinstance(step, _Dense) else None)
        self.log_probs = buffer(chain.classes)
        # a small layer's weight gradient goes through a contiguous scratch (see
        # _weight_gradient); None: written straight into the strided view of ``out``
        self.scratch: list[Tensor | None] = [
            like.new_empty(b, step.out_features, step.in_features)
            if isinstance(step, _Dense) and step.out_features * step.in_features <= SCRATCH_MAX
            else None
            for step in chain.steps
        ]
        self.minus_one = like.new_full((b, batch, 1), -1.0)


class LinearChain:
    """A model that is a chain of ``Linear`` layers and activations, trained for ``b`` peers
    at once from rows of a flat ``[b, d]`` parameter tensor laid out by ``layout``.

    Build it with :meth:`from_module`; :class:`sim.batched.BatchedPeers` does so by itself
    (``kernel="auto"``) and uses it whenever the loss is the default cross entropy and the
    batch fits (:meth:`accepts`).

    Example::

        from workloads import build_model
        model = build_model("mlp", (40,), 10, seed=0)
        chain = LinearChain.from_module(model, ParameterLayout.from_module(model))
        grads = torch.empty(16, chain.dim)
        losses = chain.gradients(params, x, y, out=grads)   # params [16, d], x [16, B, 40]
    """

    def __init__(self, steps: tuple[_Step, ...], dim: int, classes: int) -> None:
        self.steps = steps
        self.dim = dim
        self.classes = classes
        # position of the first Linear layer: no gradient flows below it
        self.first = next(i for i, s in enumerate(steps) if isinstance(s, _Dense))
        self.flattens_input = any(isinstance(s, _Flatten) for s in steps[: self.first])
        first = steps[self.first]
        assert isinstance(first, _Dense)  # by the line above
        self.in_features = first.in_features
        self.widths: list[int] = []  # features of every step's output
        width = first.in_features
        for step in steps:
            width = step.out_features if isinstance(step, _Dense) else width
            self.widths.append(width)
        self._workspaces: dict[tuple[int, int, torch.dtype, torch.device], _Workspace] = {}

    @classmethod
    def from_module(cls, model: nn.Module, layout: ParameterLayout) -> LinearChain:
        """The chain of ``model``, or :class:`NotALinearChainError` saying why it is not one."""
        chain = layer_chain(model)
        if chain is None:
            raise NotALinearChainError(
                f"{type(model).__name__} is not an nn.Sequential, workloads MLP or "
                "LogisticRegression (by exact type, without hooks)"
            )
        entries = {e.name: e for e in layout.entries}
        steps: list[_Step] = []
        used: set[str] = set()
        for name, module in chain:
            kind = type(module)
            if kind is nn.Linear:
                steps.append(_dense(name, module, entries, used))
            elif kind is nn.Flatten:
                if module.start_dim != 1 or module.end_dim != -1:
                    raise NotALinearChainError(
                        f"{name}: only Flatten(start_dim=1, end_dim=-1) is supported"
                    )
                steps.append(_Flatten(name))
            elif kind in ACTIVATIONS:
                steps.append(_activation(name, module))
            else:
                raise NotALinearChainError(
                    f"{name}: {kind.__name__} is not supported; allowed: Linear, Flatten, "
                    f"{', '.join(k.__name__ for k in ACTIVATIONS)}"
                )
        dense = [s for s in steps if isinstance(s, _Dense)]
        if not dense:
            raise NotALinearChainError("the chain has no Linear layer")
        unused = set(entries) - used
        if unused:
            raise NotALinearChainError(f"parameters outside the chain: {sorted(unused)}")
        for before, after in itertools.pairwise(dense):
            if after.in_features != before.out_features:
                raise NotALinearChainError(
                    f"{after.name}: takes {after.in_features} features, "
                    f"{before.name} gives {before.out_features}"
                )
        return cls(tuple(steps), layout.numel, dense[-1].out_features)

    def accepts(self, params: Tensor, x: Tensor, y: Tensor) -> bool:
        """Whether :meth:`gradients` computes exactly what ``vmap(grad(cross_entropy ∘ f))``
        would for these inputs: floating ``x [b, B, ...]`` of the parameters' dtype and device
        (``[b, B, in_features]`` unless the chain starts by flattening), class indices
        ``y [b, B]`` in ``[0, classes)``. Anything else goes to ``vmap(grad)``, which also
        raises the errors for malformed input."""
        if params.dim() != 2 or params.shape[1] != self.dim or not params.is_floating_point():
            return False
        if x.dtype != params.dtype or x.device != params.device or x.dim() < 3:
            return False
        if x.shape[0] != params.shape[0] or y.shape != x.shape[:2]:
            return False
        features = math.prod(x.shape[2:]) if self.flattens_input else x.shape[-1]
        if features != self.in_features or (not self.flattens_input and x.dim() != 3):
            return False
        if y.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            return False
        if y.numel() == 0:
            return False
        low, high = torch.aminmax(y)
        return bool(low >= 0) and bool(high < self.classes)

    def forward(self, params: Tensor, x: Tensor) -> Tensor:
        """Logits ``[b, B, classes]`` of models ``params [b, d]`` on ``x [b, B, ...]``."""
        return self._forward(params, x, self._workspace(x, params))[0].clone()

    def _workspace(self, x: Tensor, like: Tensor) -> _Workspace:
        key = (x.shape[0], x.shape[1], like.dtype, like.device)
        workspace = self._workspaces.get(key)
        if workspace is None:
            if len(self._workspaces) >= 4:  # a few block shapes in use at a time
                self._workspaces.pop(next(iter(self._workspaces)))
            workspace = self._workspaces[key] = _Workspace(self, key[0], key[1], like)
        return workspace

    def _forward(
        self, params: Tensor, x: Tensor, space: _Workspace
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        b, batch = x.shape[0], x.shape[1]
        h = x.reshape(b, batch, -1) if self.flattens_input else x
        saved: list[tuple[Tensor, Tensor]] = []  # (input, output) of every step
        for step, buffer in zip(self.steps, space.outputs):
            z = h if buffer is None else buffer
            if isinstance(step, _Dense):
                weight = _weight(params, step).transpose(1, 2)
                if step.bias is None:
                    torch.bmm(h, weight, out=z)
                else:
                    bias = params[:, step.bias : step.bias + step.out_features].unsqueeze(1)
                    torch.baddbmm(bias, h, weight, out=z)
            elif isinstance(step, _Activation):
                _activate(step, h, z)
            saved.append((h, z))
            h = z
        return h, saved

    def gradients(self, params: Tensor, x: Tensor, y: Tensor, *, out: Tensor) -> Tensor:
        """Per-peer mean cross-entropy losses ``[b]``; the gradient of each peer's loss with
        respect to its row of ``params [b, d]`` is written into ``out [b, d]`` (rows
        contiguous; every coordinate is written). Call :meth:`accepts` first.

        The intermediates live in a workspace kept per block shape (not thread-safe: one
        caller at a time)."""
        batch = x.shape[1]
        space = self._workspace(x, params)
        logits, saved = self._forward(params, x, space)
        log_probs = torch.ops.aten._log_softmax.out(logits, 2, False, out=space.log_probs)
        target = y.to(torch.int64).unsqueeze(2)
        losses = log_probs.gather(2, target).squeeze(2).mean(dim=1).neg_()
        grad = log_probs.exp_()  # softmax, in place of the log-probabilities
        grad.scatter_add_(2, target, space.minus_one)
        grad.mul_(1.0 / batch)
        first = self.first
        for position in range(len(self.steps) - 1, first - 1, -1):
            step = self.steps[position]
            h_in, z = saved[position]
            if isinstance(step, _Dense):
                _weight_gradient(out, step, h_in, grad, space.scratch[position])
                if position > first:
                    below = space.grads[position]
                    grad = torch.bmm(grad, _weight(params, step), out=below)
            elif isinstance(step, _Activation):
                _activation_backward(step, grad, h_in, z)
        return losses


def _weight(params: Tensor, step: _Dense) -> Tensor:
    size = step.out_features * step.in_features
    return params[:, step.weight : step.weight + size].view(-1, step.out_features, step.in_features)


def _weight_gradient(
    out: Tensor, step: _Dense, h_in: Tensor, grad: Tensor, scratch: Tensor | None
) -> None:
    """``∂W = gᵀ h`` and ``∂b = Σ g`` into their columns of ``out``.

    A large weight's gradient is computed as ``(hᵀ g)ᵀ`` straight into its strided view. A
    small one's (``scratch [b, out, in]`` given) goes into the contiguous scratch and is copied:
    MKL, two threads splitting a gemm whose output rows lie ``d`` apart, is up to 3x slower on
    a 10 x 291 or 40 x 291 output than on the same output contiguous, more than the copy costs;
    for a 291 x 291 output the copy costs more than it saves (``SCRATCH_MAX``)."""
    target = _weight(out, step)
    if scratch is None:
        torch.bmm(h_in.transpose(1, 2), grad, out=target.transpose(1, 2))
    else:
        torch.bmm(grad.transpose(1, 2), h_in, out=scratch)
        target.copy_(scratch)
    if step.bias is not None:
        torch.sum(grad, dim=1, out=out[:, step.bias : step.bias + step.out_features])


def _dense(name: str, module: nn.Module, entries: dict[str, LayoutEntry], used: set[str]) -> _Dense:
    if not isinstance(module, nn.Linear):  # the caller checked the exact type
        raise NotALinearChainError(f"{name}: not a Linear layer")
    weight = entries.get(f"{name}.weight")
    shape = (module.out_features, module.in_features)
    if weight is None or tuple(weight.shape) != shape:
        raise NotALinearChainError(f"{name}.weight: not found in the layout with shape {shape}")
    used.add(weight.name)
    bias_offset = None
    if module.bias is not None:
        bias = entries.get(f"{name}.bias")
        if bias is None or tuple(bias.shape) != (module.out_features,):
            raise NotALinearChainError(f"{name}.bias: not found in the layout")
        used.add(bias.name)
        bias_offset = bias.offset
    return _Dense(name, weight.offset, bias_offset, module.out_features, module.in_features)


def _activation(name: str, module: nn.Module) -> _Activation:
    kind = ACTIVATIONS[type(module)]
    if isinstance(module, nn.LeakyReLU):
        return _Activation(name, kind, slope=float(module.negative_slope))
    if isinstance(module, nn.GELU):
        return _Activation(name, kind, approximate=module.approximate)
    return _Activation(name, kind)
