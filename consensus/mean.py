"""Plain gossip averaging: THE weighted mean the whole project calls."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from consensus._inputs import Neighbourhood, check_shapes, prepare, sum_is_finite
from consensus.base import Rule


def weighted_mean(
    own: Tensor,
    neighbours: Tensor,
    weights: Tensor,
    mask: Tensor | None = None,
    *,
    out: Tensor | None = None,
) -> Tensor:
    """Gossip averaging x_i <- w_ii x_i + sum_j W_ij x_j with w_ii = 1 - sum_j W_ij.

    Xiao & Boyd, "Fast linear iterations for distributed averaging" (2004);
    Lian et al., "Can decentralized algorithms outperform centralized
    algorithms?" (NeurIPS 2017, D-PSGD). One scaling of the own vector into
    the result, then one in-place batched matrix product
    ``out[*, 1, d] += weights[*, 1, k] @ neighbours[*, k, d]``: no loop over
    nodes or parameters and no temporary of the inputs' size.

    A non-finite neighbour row is masked out (its weight folds into the self
    weight); this costs one sum over the result (no [*, d] bool temporary)
    unless the result comes out non-finite, and only then runs the exact
    row-by-row masking of :func:`consensus._inputs.prepare`. A non-finite
    ``own`` raises ``ValueError`` (the own vector is trusted).

    Example::

        >>> import torch
        >>> own = torch.zeros(4)
        >>> neighbours = torch.ones(2, 4)
        >>> weighted_mean(own, neighbours, torch.tensor([0.25, 0.25]))
        tensor([0.5000, 0.5000, 0.5000, 0.5000])
    """
    weights, mask = check_shapes(own, neighbours, weights, mask)
    d, k, batch = own.shape[-1], neighbours.shape[-2], math.prod(own.shape[:-1])
    if out is not None and (
        out.shape != own.shape
        or out.dtype != own.dtype
        or not out.is_contiguous()
        or out.data_ptr() in (own.data_ptr(), neighbours.data_ptr())
    ):
        raise ValueError(
            f"out: must be a contiguous {own.dtype} tensor of own's shape {tuple(own.shape)}, "
            f"separate from own and neighbours, got {out.dtype} {tuple(out.shape)}"
        )
    w = weights if mask is None else torch.where(mask, weights, 0.0)
    target = None if out is None else out.view(batch, d)
    result = _combine(
        own.reshape(batch, d), neighbours.reshape(batch, k, d), w.reshape(batch, k), target
    )
    if not sum_is_finite(result):
        hood = prepare(own, neighbours, weights, mask)
        result = _combine(hood.own, hood.neighbours, hood.weights, target)
    return result.view(own.shape) if out is None else out


def _combine(own: Tensor, neighbours: Tensor, w: Tensor, out: Tensor | None = None) -> Tensor:
    """[B, d] w_ii own + w @ neighbours for ``own [B, d]``, ``neighbours [B, k, d]``, ``w [B, k]``.

    Two passes over the result and one over the inputs: ``out = w_ii * own``,
    then ``out += w @ neighbours`` in place (``baddbmm_``, beta = 1); into ``out`` when given
    (no temporary of the result's size).
    """
    self_weight = 1.0 - w.sum(-1, keepdim=True)
    out = torch.mul(own, self_weight, out=out) if out is not None else torch.mul(own, self_weight)
    out.unsqueeze(1).baddbmm_(w.unsqueeze(1), neighbours)
    return out


class WeightedMean(Rule):
    """Plain gossip averaging, spec name ``mean``: x_i <- w_ii x_i + sum_j W_ij x_j.

    Xiao & Boyd (2004); Lian et al. (NeurIPS 2017). No Byzantine tolerance: a
    single neighbour can move the result anywhere. See :func:`weighted_mean`.
    """

    name = "mean"

    def __call__(
        self,
        own: Tensor,
        neighbours: Tensor,
        weights: Tensor,
        mask: Tensor | None = None,
        *,
        out: Tensor | None = None,
    ) -> Tensor:
        return weighted_mean(own, neighbours, weights, mask, out=out)

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        return _combine(hood.own, hood.neighbours, hood.weights)
