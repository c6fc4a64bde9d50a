"""Plain gossip averaging: THE weighted mean the whole project calls."""

from __future__ import annotations

import torch
from torch import Tensor

from consensus._inputs import Neighbourhood, check_shapes, prepare
from consensus.base import Rule


def weighted_mean(
    own: Tensor, neighbours: Tensor, weights: Tensor, mask: Tensor | None = None
) -> Tensor:
    """Gossip averaging x_i <- w_ii x_i + sum_j W_ij x_j with w_ii = 1 - sum_j W_ij.

    Xiao & Boyd, "Fast linear iterations for distributed averaging" (2004);
    Lian et al., "Can decentralized algorithms outperform centralized
    algorithms?" (NeurIPS 2017, D-PSGD). One batched matrix product
    ``weights[*, 1, k] @ neighbours[*, k, d]`` plus one fused multiply-add of
    the own vector; no loop over nodes or parameters.

    A non-finite neighbour row is masked out (its weight folds into the self
    weight); this costs nothing unless the result comes out non-finite.

    Example::

        >>> import torch
        >>> own = torch.zeros(4)
        >>> neighbours = torch.ones(2, 4)
        >>> weighted_mean(own, neighbours, torch.tensor([0.25, 0.25]))
        tensor([0.5000, 0.5000, 0.5000, 0.5000])
    """
    weights, mask = check_shapes(own, neighbours, weights, mask)
    w = weights if mask is None else torch.where(mask, weights, 0.0)
    out = _combine(own, neighbours, w)
    if bool(torch.isfinite(out).all()):
        return out
    hood = prepare(own, neighbours, weights, mask)
    return _combine(hood.own, hood.neighbours, hood.weights).reshape(own.shape)


def _combine(own: Tensor, neighbours: Tensor, w: Tensor) -> Tensor:
    self_weight = 1.0 - w.sum(-1, keepdim=True)
    out = torch.matmul(w.unsqueeze(-2), neighbours).squeeze(-2)
    return out.addcmul_(own, self_weight)


class WeightedMean(Rule):
    """Plain gossip averaging, spec name ``mean``: x_i <- w_ii x_i + sum_j W_ij x_j.

    Xiao & Boyd (2004); Lian et al. (NeurIPS 2017). No Byzantine tolerance: a
    single neighbour can move the result anywhere. See :func:`weighted_mean`.
    """

    name = "mean"

    def __call__(
        self, own: Tensor, neighbours: Tensor, weights: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        return weighted_mean(own, neighbours, weights, mask)

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        return _combine(hood.own, hood.neighbours, hood.weights)
