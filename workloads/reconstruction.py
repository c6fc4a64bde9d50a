"""Exact input reconstruction from a one-step model delta of a batch of one, written once.

A model whose first layer is dense with a bias, ``h = W x + b`` (``W [H, K]``, ``x`` the
flattened input), has on one example ``∂ℓ/∂W = δ xᵀ`` and ``∂ℓ/∂b = δ``, ``δ = ∂ℓ/∂h``. So
every row i with ``δ_i ≠ 0`` gives the input exactly::

    x = (∂ℓ/∂W)[i, :] / (∂ℓ/∂b)[i]

A neighbour that receives a peer's model after one SGD step on a batch of one sees the delta
``−η ∇ℓ``; the ratio does not depend on η, so the delta gives ``x`` as well (the folklore
attack behind "deep leakage from gradients": Phong et al. 2017, Zhu, Liu & Han 2019; on
gossip neighbours: Pasquini, Raynal & Troncoso 2023). :func:`reconstruct_input` takes the row
with the largest ``|∂ℓ/∂b_i|`` (the attacker does not know δ, only the delta; under DP noise
that is also the row whose ratio the noise bends least). DP-SGD's clipping scales the row and
the bias alike (the ratio survives); its Gaussian noise does not, which is what
:func:`cosine_similarity` against the true input measures.

:func:`dense_input_layer` finds the layer in a module. Everything takes a leading batch, so the
simulator attacks all its peers' deltas in one call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["cosine_similarity", "dense_input_layer", "reconstruct_input"]


def dense_input_layer(module: nn.Module, input_shape: Sequence[int]) -> tuple[str, str]:
    """The names ``(weight, bias)`` of the dense layer the input meets first: the first
    submodule (in registration order) that holds parameters must be an ``nn.Linear`` with a
    bias over the whole flattened input (``in_features = prod(input_shape)``), as in the
    ``mlp`` and ``logistic`` models. Anything else (a convolution, an embedding, no bias) is a
    ``ValueError`` saying what the first layer is."""
    width = math.prod(input_shape)
    for name, child in module.named_modules():
        if not any(True for _ in child.parameters(recurse=False)):
            continue
        if not isinstance(child, nn.Linear) or child.bias is None:
            kind = type(child).__name__
            if isinstance(child, nn.Linear):
                kind += " without a bias"
            raise ValueError(
                f"the model's first layer {name or '(root)'!r} is {kind}; the attack needs a "
                "dense first layer with a bias (nn.Linear, as in the mlp and logistic models)"
            )
        if child.in_features != width:
            raise ValueError(
                f"the model's first layer {name!r} takes {child.in_features} features, not the "
                f"whole flattened input ({width})"
            )
        prefix = f"{name}." if name else ""
        return f"{prefix}weight", f"{prefix}bias"
    raise ValueError("the model has no parameters")


def reconstruct_input(weight_delta: Tensor, bias_delta: Tensor) -> Tensor:
    """The input ``[..., K]`` that the first layer's delta ``weight_delta [..., H, K]``,
    ``bias_delta [..., H]`` of one example gives: row ``i = argmax |bias_delta|`` of the
    weight delta divided by ``bias_delta[i]``. Zero where every bias delta is zero (the
    example reached no unit: nothing to recover)."""
    row = bias_delta.abs().argmax(dim=-1, keepdim=True)  # [..., 1]
    weights = weight_delta.gather(
        -2, row.unsqueeze(-1).expand(*row.shape, weight_delta.shape[-1])
    ).squeeze(-2)
    bias = bias_delta.gather(-1, row)  # [..., 1]
    safe = torch.where(bias == 0, torch.ones_like(bias), bias)
    return torch.where(bias == 0, torch.zeros_like(weights), weights / safe)


def cosine_similarity(estimate: Tensor, truth: Tensor) -> Tensor:
    """``⟨x̂, x⟩ / (‖x̂‖ ‖x‖)`` over the last dimension (0 when either is zero), float64."""
    a = estimate.to(torch.float64)
    b = truth.to(torch.float64)
    norms = torch.linalg.vector_norm(a, dim=-1) * torch.linalg.vector_norm(b, dim=-1)
    dot = (a * b).sum(dim=-1)
    return torch.where(norms > 0, dot / norms.clamp(min=1e-300), torch.zeros_like(dot))
