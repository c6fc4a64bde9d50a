"""The language model's forward pass written over a leading peer dimension, for gradients of
every peer at once by one ordinary backward pass.

The general engine (:class:`sim.batched.BatchedPeers`) differentiates any model with
``vmap(grad(loss))``. For :class:`workloads.gpt.GPT` (exactly that class) under the default
cross-entropy loss, this module runs the same arithmetic with each parameter held as
``[m, *shape]`` (a view of the rows of the flat ``[m, d]`` buffer) and each activation as
``[m, B, L, ...]``:

    h = E[x] + P[:L]                                   embedding: one gather over the peers
    h = h + proj(attention(LN1(h)))                    per block; linear: one baddbmm
    h = h + fc2(GELU(fc1(LN2(h))))
    logits = LN(h) E^T                                 tied output layer: one bmm

and ``Σ_i ℓ_i`` is differentiated once: peer i's parameters reach only peer i's loss, so the
gradient of the sum with respect to them is peer i's own gradient. One autograd graph of
about 150 operations serves all m peers, where a loop over models runs 150 per peer and
``vmap`` adds its batching rules' overhead to each; the matrix products themselves cost the
same (docs/benchmarks.md, "Simulator throughput"). Each parameter's view is a leaf of its
own (not slices of one flat leaf, whose backward would zero-fill an ``[m, d]`` buffer per
parameter), and the gradients are written into the caller's ``[m, d]`` buffer by one
``torch.cat``.

:meth:`BatchedGPT.from_module` accepts a :class:`~workloads.gpt.GPT` by exact type (a
subclass may change ``forward``); ``tests/sim/test_gpt_kernel.py`` checks this path against
``vmap(grad)`` and against each peer's own module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gossip.flat import ParameterLayout
from workloads.gpt import GPT, Block, causal_attention

__all__ = ["BatchedGPT", "NotAGPTError"]


class NotAGPTError(ValueError):
    """The model is not a :class:`workloads.gpt.GPT` this kernel can run."""


@dataclass(frozen=True)
class _Shape:
    layers: int
    width: int
    heads: int
    context: int
    vocabulary: int


class BatchedGPT:
    """Loss and gradients of m GPTs (one per row of ``[m, d]``) on their own token batches."""

    def __init__(self, layout: ParameterLayout, shape: _Shape) -> None:
        self.layout = layout
        self.shape = shape
        self.dim = layout.numel

    @classmethod
    def from_module(cls, module: nn.Module, layout: ParameterLayout) -> BatchedGPT:
        """The kernel for ``module``, or :class:`NotAGPTError` saying why it does not apply."""
        if type(module) is not GPT:
            raise NotAGPTError(f"{type(module).__name__} is not workloads.gpt.GPT")
        blocks = [b for b in module.blocks if type(b) is Block]
        if not blocks or len(blocks) != len(module.blocks):
            raise NotAGPTError("its blocks are not workloads.gpt.Block")
        for block in blocks:
            gelu = block.mlp[1]
            if type(gelu) is not nn.GELU or gelu.approximate != "none":
                raise NotAGPTError("its MLP activation is not the exact GELU")
        heads = {block.attention.heads for block in blocks}
        if len(heads) != 1:
            raise NotAGPTError(f"its blocks have different numbers of heads {sorted(heads)}")
        if any(e.kind != "parameter" for e in layout.entries):
            raise NotAGPTError("it has frozen parameters or buffers in its layout")
        if any(not p.requires_grad for p in module.parameters()):
            raise NotAGPTError("some of its parameters are frozen")
        width = module.embedding.embedding_dim
        shape = _Shape(
            layers=len(blocks),
            width=width,
            heads=heads.pop(),
            context=module.context,
            vocabulary=module.embedding.num_embeddings,
        )
        return cls(layout, shape)

    def accepts(self, params: Tensor, x: Tensor, y: Tensor) -> bool:
        """Whether :meth:`gradients` computes what ``vmap(grad(cross_entropy ∘ f))`` would:
        floating ``params [m, d]``, integer tokens ``x [m, B, L]`` (``L`` within the context)
        and next-token targets ``y`` of the same shape in ``[0, V)``, on one device. Anything
        else goes to ``vmap(grad)``, which also raises the errors for malformed input."""
        if params.dim() != 2 or params.shape[1] != self.dim or not params.is_floating_point():
            return False
        if x.dim() != 3 or y.shape != x.shape or x.shape[0] != params.shape[0]:
            return False
        if x.device != params.device or y.device != params.device:
            return False
        if x.is_floating_point() or y.is_floating_point() or x.dtype == torch.bool:
            return False
        if x.numel() == 0 or x.shape[2] > self.shape.context:
            return False
        low = torch.minimum(x.min(), y.min().to(x.dtype))
        high = torch.maximum(x.max(), y.max().to(x.dtype))
        return bool((low >= 0) & (high < self.shape.vocabulary))  # one read of the device

    def _views(self, params: Tensor) -> dict[str, Tensor]:
        """Each parameter as ``[m, *shape]``: a view of its columns of ``params``, made a
        leaf of its own for the backward pass."""
        m = params.shape[0]
        return {
            e.name: params[:, e.offset : e.offset + e.numel]
            .reshape(m, *e.shape)
            .detach()
            .requires_grad_(True)
            for e in self.layout.entries
        }

    def losses(self, views: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        """Each peer's mean next-token cross entropy ``[m]``."""
        s = self.shape
        m, batch, length = x.shape
        peers = torch.arange(m, device=x.device).view(m, 1, 1)
        h = views["embedding.weight"][peers, x] + views["position"][:, None, :length, :]
        for i in range(s.layers):
            p = f"blocks.{i}."
            a = _norm(h, views[p + "norm1.weight"], views[p + "norm1.bias"])
            qkv = _linear(a, views[p + "attention.qkv.weight"], views[p + "attention.qkv.bias"])
            out = causal_attention(qkv, s.heads)  # the model's own, over [m, B, L, 3w]
            h = h + _linear(
                out, views[p + "attention.proj.weight"], views[p + "attention.proj.bias"]
            )
            a = _norm(h, views[p + "norm2.weight"], views[p + "norm2.bias"])
            a = F.gelu(_linear(a, views[p + "mlp.0.weight"], views[p + "mlp.0.bias"]))
            h = h + _linear(a, views[p + "mlp.2.weight"], views[p + "mlp.2.bias"])
        h = _norm(h, views["norm.weight"], views["norm.bias"])
        logits = torch.bmm(
            h.reshape(m, batch * length, s.width), views["embedding.weight"].transpose(1, 2)
        )
        token_losses = F.cross_entropy(
            logits.reshape(-1, s.vocabulary), y.reshape(-1), reduction="none"
        )
        return token_losses.view(m, batch * length).mean(dim=1)

    def gradients(self, params: Tensor, x: Tensor, y: Tensor, *, out: Tensor) -> Tensor:
        """Each peer's loss ``[m]``; its gradient is written into ``out [m, d]``."""
        with torch.enable_grad():
            views = self._views(params.detach())
            losses = self.losses(views, x, y)
            leaves = list(views.values())
            grads = torch.autograd.grad(losses.sum(), leaves)
        m = params.shape[0]
        torch.cat([g.reshape(m, -1) for g in grads], dim=1, out=out)
        return losses.detach()


def _linear(h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``h W^T + b`` for each peer: ``h [m, ..., in]``, ``weight [m, out, in]``, ``bias
    [m, out]``, as one ``baddbmm`` over the peers."""
    m, *middle, features = h.shape
    flat = torch.baddbmm(bias.unsqueeze(1), h.reshape(m, -1, features), weight.transpose(1, 2))
    return flat.reshape(m, *middle, weight.shape[1])


def _norm(h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """LayerNorm over the last dimension with each peer's own scale and shift ``[m, w]``."""
    shape = (h.shape[0],) + (1,) * (h.dim() - 2) + (h.shape[-1],)
    normed = F.layer_norm(h, (h.shape[-1],))
    return torch.addcmul(bias.view(shape), normed, weight.view(shape))
