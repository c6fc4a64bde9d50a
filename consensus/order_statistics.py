"""Coordinate-wise order-statistic rules: weighted median and weighted trimmed mean.

Both work on the set {x_i} + {x_j : j present}: the node's own vector is a
trusted member of the set (it is honest by definition, so including it can
only help), and every member carries its mixing weight (w_ii for the own
vector, W_ij for neighbour j). With uniform weights they reduce exactly to the
classical unweighted rules.
"""

from __future__ import annotations

import torch
from torch import Tensor

from consensus._inputs import Neighbourhood
from consensus._sorting import sort_rows, sort_rows_with_weights
from consensus.base import Rule, bound_error, check_int

#: Set weights equal to the self weight within this relative tolerance count as uniform.
UNIFORM_TOLERANCE = 1e-5


def uniform_weights(hood: Neighbourhood) -> bool:
    """True when every present member of every node's set carries the same (positive) weight.

    Metropolis-Hastings weights on a regular graph are uniform; then the
    classical unweighted rule applies and the values alone are sorted with a
    sorting network (several times faster than ``torch.sort`` along a short axis).
    """
    reference = hood.self_weight[:, None]
    close = (hood.set_weights() - reference).abs() <= UNIFORM_TOLERANCE * reference
    return bool((reference > 0).all()) and bool((close | ~hood.set_mask()).all())


def pick(rows: list[Tensor], position: Tensor) -> Tensor:
    """Row ``position[b]`` of node b from sorted rows [B, d] (one index for all: no copy)."""
    first = int(position[0])
    if bool((position == first).all()):
        return rows[first]
    stacked = torch.stack(rows, dim=1)
    index = position.view(-1, 1, 1).expand(-1, 1, stacked.shape[2])
    return stacked.gather(1, index).squeeze(1)


def sort_with_weights(values: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Per-coordinate ascending ``values [B, n, d]`` and the matching ``weights [B, n]`` as [B, n, d].

    Sorted by (value, weight) with a sorting network, so which of two tied
    members gets trimmed does not depend on the order of the neighbours.
    ``values`` is overwritten; absent members (+inf) come back as the largest
    finite value, still last.
    """
    rows, carried = sort_rows_with_weights(values, weights)
    return torch.stack(rows, dim=1), torch.stack(carried, dim=1)


def _sorted_set(hood: Neighbourhood) -> tuple[Tensor, Tensor]:
    """The set {own} + neighbours sorted per coordinate (absent = +inf, last), with weights."""
    return sort_with_weights(hood.stacked(float("inf")), hood.set_weights())


class CoordinateWiseMedian(Rule):
    """Weighted coordinate-wise median, spec name ``median``.

    Per coordinate, [x_i]_c <- the value v at which the cumulative mixing
    weight of the sorted values first reaches 1/2; if it lands exactly on 1/2,
    the mean of v and the next value. With uniform weights this is the
    ordinary median (even n: mean of the two middle values). Yin et al.,
    "Byzantine-robust distributed learning: towards optimal statistical rates"
    (ICML 2018); weighted form as in Fang, Yang & Bajwa, "BRIDGE" (2022).

    Robust while the Byzantine neighbours carry less than half of node i's
    mixing weight.
    """

    name = "median"

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        if uniform_weights(hood):
            rows = sort_rows(hood.stacked(float("inf")))
            size = hood.size
            return (pick(rows, (size - 1) // 2) + pick(rows, size // 2)) / 2
        values, weights = _sorted_set(hood)
        cumulative = weights.cumsum(dim=1)
        half = cumulative[:, -1:, :] / 2
        tol = 16 * torch.finfo(values.dtype).eps * values.shape[1]
        last = values.shape[1] - 1
        low = (cumulative < half - tol).sum(1, keepdim=True).clamp_max(last)
        high = (cumulative <= half + tol).sum(1, keepdim=True).clamp_max(last)
        # high may point past the present values only when low is the last present one
        high = torch.minimum(high, hood.size.view(-1, 1, 1) - 1).maximum(low)
        lower = values.gather(1, low).squeeze(1)
        upper = values.gather(1, high).squeeze(1)
        return (lower + upper) / 2


class TrimmedMean(Rule):
    """Weighted coordinate-wise trimmed mean, spec name ``trimmed-mean:b=B``.

    Per coordinate, sort the n values, drop the b smallest and the b largest,
    and average the rest with their mixing weights renormalised:
    [x_i]_c <- sum_{kept} w_j x_jc / sum_{kept} w_j (uniformly if the kept
    weights are all zero). Yin et al. (ICML 2018); decentralized form in
    Fang, Yang & Bajwa, "BRIDGE" (2022). Needs n > 2b.
    """

    name = "trimmed-mean"

    def __init__(self, b: int = 1, n: int | None = None) -> None:
        self.b = check_int(self.name, "b", b, 0)
        super().__init__(n)

    def check_size(self, n: int) -> None:
        if n <= 2 * self.b:
            raise bound_error(self.name, "n > 2b", n=n, b=self.b)

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        budget, size = hood.budget(self.b), hood.size
        if uniform_weights(hood) and bool((budget == budget[0]).all() & (size == size[0]).all()):
            rows = sort_rows(hood.stacked(float("inf")))
            low, high = int(budget[0]), int(size[0] - budget[0])
            total = rows[low].clone()
            for row in rows[low + 1 : high]:
                total.add_(row)
            return total / (high - low)
        values, weights = _sorted_set(hood)
        b = budget.view(-1, 1, 1)
        position = torch.arange(values.shape[1], device=values.device).view(1, -1, 1)
        keep = (position >= b) & (position < size.view(-1, 1, 1) - b)
        kept_weights = torch.where(keep, weights, 0.0)
        total = kept_weights.sum(1)
        weighted = torch.where(keep, values * kept_weights, 0.0).sum(1)
        out = weighted / total.clamp_min(torch.finfo(total.dtype).tiny)
        if bool((total > 0).all()):
            return out
        uniform = torch.where(keep, values, 0.0).sum(1) / keep.sum(1).clamp_min(1)
        return torch.where(total > 0, out, uniform)
