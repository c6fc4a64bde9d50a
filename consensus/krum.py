"""Distance-based selection rules: Krum, Multi-Krum and Bulyan.

All three score the set {x_i} + {x_j : j present} (the own vector is a
candidate like any other, so with no attack Krum may well pick it). Pairwise
distances come from one Gram matrix product per node (no loop over pairs or
coordinates).
"""

from __future__ import annotations

import torch
from torch import Tensor

from consensus._inputs import (
    Neighbourhood,
    fill_rows_,
    pairwise_squared_distances,
    renormalised_average,
)
from consensus._sorting import sort_rows
from consensus.base import Rule, bound_error, check_int
from consensus.order_statistics import sort_with_weights, uniform_weights

_LARGE = float(torch.finfo(torch.float64).max)


def krum_scores(distances: Tensor, candidates: Tensor, f: Tensor) -> Tensor:
    """score(c) = sum of squared distances from c to its n - f - 2 nearest other candidates.

    ``distances [B, n, n]`` (inf where absent), ``candidates [B, n]`` bool,
    ``f [B]`` -> ``[B, n]``, +inf for non-candidates. The count is clamped to
    at least 1 (Bulyan's last selection steps run Krum on fewer than 2f+3).
    """
    n = candidates.sum(-1)
    pair = candidates[:, :, None] & candidates[:, None, :]
    eye = torch.eye(distances.shape[1], dtype=torch.bool, device=distances.device)
    others = distances.masked_fill(~pair | eye, float("inf"))
    nearest = others.sort(dim=-1).values.cumsum(dim=-1)
    count = (n - f - 2).clamp_min(1).clamp_max(distances.shape[1] - 1)
    index = (count - 1).view(-1, 1, 1).expand(-1, distances.shape[1], 1)
    scores = nearest.gather(-1, index).squeeze(-1)
    return scores.masked_fill(~candidates, float("inf"))


def best_candidate(scores: Tensor, distances: Tensor, candidates: Tensor) -> Tensor:
    """[B] index of the lowest score; exact ties go to the smallest total distance to the set.

    The tie-break depends only on the vectors, not on the order of the
    neighbours, so the choice is permutation invariant (Bulyan's last steps
    and symmetric configurations produce exact ties).
    """
    scores = torch.where(candidates, scores.nan_to_num(posinf=_LARGE), float("inf"))
    lowest = scores == scores.min(-1, keepdim=True).values
    total = distances.nan_to_num(posinf=0.0).sum(-1)
    return torch.where(lowest, total, float("inf")).argmin(-1)


class Krum(Rule):
    """Krum, spec name ``krum:f=F``: x_i <- x_c with c = argmin_c sum_{j in N_c} ||x_c - x_j||^2.

    N_c holds the n - f - 2 vectors closest to x_c. Blanchard et al.,
    "Machine learning with adversaries: Byzantine tolerant gradient descent"
    (NeurIPS 2017). Needs n > 2f+2. Mixing weights play no part in the
    choice (selection returns one input unchanged); exact ties go to the
    candidate with the smallest total distance to the whole set.
    """

    name = "krum"

    def __init__(self, f: int = 1, n: int | None = None) -> None:
        self.f = check_int(self.name, "f", f, 0)
        super().__init__(n)

    def check_size(self, n: int) -> None:
        if n <= 2 * self.f + 2:
            raise bound_error(self.name, "n > 2f+2", n=n, f=self.f)

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        distances = pairwise_squared_distances(hood)
        present = hood.set_mask()
        scores = krum_scores(distances, present, hood.budget(self.f))
        best = best_candidate(scores, distances, present)
        slot = (best - 1).clamp_min(0).view(-1, 1, 1).expand(-1, 1, hood.dim)
        chosen = hood.neighbours.gather(1, slot).squeeze(1)
        return torch.where((best == 0)[:, None], hood.own, chosen)


class MultiKrum(Krum):
    """Multi-Krum, spec name ``multi-krum:f=F,m=M``: average the m inputs with the best Krum scores.

    x_i <- sum_{c in best m} w_c x_c / sum_{c in best m} w_c (mixing weights
    renormalised over the selected set). Blanchard et al. (NeurIPS 2017).
    Needs n > 2f+2; m defaults to n - f per node.
    """

    name = "multi-krum"

    def __init__(self, f: int = 1, m: int | None = None, n: int | None = None) -> None:
        self.m = None if m is None else check_int(self.name, "m", m, 1)
        super().__init__(f, n)

    def check_size(self, n: int) -> None:
        super().check_size(n)
        if self.m is not None and self.m > n:
            raise bound_error(self.name, "m <= n", n=n, m=self.m)

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        distances = pairwise_squared_distances(hood)
        f = hood.budget(self.f)
        scores = krum_scores(distances, hood.set_mask(), f)
        # rank by score, exact ties by total distance to the set (order-independent)
        by_total = distances.nan_to_num(posinf=0.0).sum(-1).argsort(dim=-1, stable=True)
        by_score = scores.gather(-1, by_total).argsort(dim=-1, stable=True)
        rank = by_total.gather(-1, by_score).argsort(-1)
        m = hood.size - f if self.m is None else torch.clamp(hood.size, max=self.m)
        chosen = rank < m[:, None]
        return renormalised_average(hood, chosen)


class Bulyan(Rule):
    """Bulyan, spec name ``bulyan:f=F`` (El Mhamdi, Guerraoui & Rouault, ICML 2018).

    Select theta = n - 2f vectors by repeated Krum (pick the best-scored, take
    it out, rescore the rest), then per coordinate keep the beta = theta - 2f
    selected values closest to the selected values' median and average them
    with their mixing weights renormalised. Needs n >= 4f+3.
    """

    name = "bulyan"

    def __init__(self, f: int = 1, n: int | None = None) -> None:
        self.f = check_int(self.name, "f", f, 0)
        super().__init__(n)

    def check_size(self, n: int) -> None:
        if n < 4 * self.f + 3:
            raise bound_error(self.name, "n >= 4f+3", n=n, f=self.f)

    def _aggregate(self, hood: Neighbourhood) -> Tensor:
        f = hood.budget(self.f)
        size = hood.size
        theta = size - 2 * f
        beta = theta - 2 * f
        distances = pairwise_squared_distances(hood)
        remaining = hood.set_mask()
        selected = torch.zeros_like(remaining)
        rows = torch.arange(hood.batch, device=remaining.device)
        for step in range(int(theta.max())):
            active = step < theta
            # a lone remaining candidate scores inf (no one left to compare): still pick it
            best = best_candidate(krum_scores(distances, remaining, f), distances, remaining)
            pick = torch.zeros_like(remaining)
            pick[rows, best] = active
            selected |= pick
            remaining &= ~pick
        values = fill_rows_(hood.stacked(float("inf")), ~selected, float("inf"))
        if uniform_weights(hood) and bool((theta == theta[0]).all() & (beta == beta[0]).all()):
            return _closest_to_median_uniform(sort_rows(values), int(theta[0]), int(beta[0]))
        return _closest_to_median(values, hood.set_weights(), theta, beta)


def _closest_to_median_uniform(rows: list[Tensor], theta: int, beta: int) -> Tensor:
    """Mean of the beta of the theta sorted rows closest to their median, per coordinate.

    The beta closest values form a window [a, a + beta) of the sorted ones; a
    is the number of window starts where moving right brings a closer value
    in (m - s_a > s_{a+beta} - m; on a tie the lower value stays). Row j is
    in the window exactly when j - beta < a <= j; rows that every start in
    0..theta-beta keeps are added without a comparison.
    """
    median = (rows[(theta - 1) // 2] + rows[theta // 2]) / 2
    start = torch.zeros_like(median)
    for a in range(theta - beta):
        start += ((median - rows[a]) > (rows[a + beta] - median)).to(median.dtype)
    total = torch.zeros_like(median)
    for j in range(theta):
        first, last = max(0, j - beta + 1), min(j, theta - beta)  # the starts that keep row j
        if first == 0 and last == theta - beta:
            total += rows[j]
        else:
            total += ((start >= first) & (start <= last)).to(median.dtype) * rows[j]
    return total / beta


def _closest_to_median(values: Tensor, set_weights: Tensor, theta: Tensor, beta: Tensor) -> Tensor:
    """Weighted mean of the beta selected values closest to the selected values' median."""
    ordered, weights = sort_with_weights(values, set_weights)
    d = values.shape[2]
    low = ((theta - 1) // 2).view(-1, 1, 1).expand(-1, 1, d)
    high = (theta // 2).view(-1, 1, 1).expand(-1, 1, d)
    median = (ordered.gather(1, low) + ordered.gather(1, high)) / 2
    spread = (ordered - median).abs()  # inf for the unselected, which sort last
    order = spread.argsort(dim=1, stable=True)  # ties: the lower value first
    position = torch.arange(values.shape[1], device=values.device).view(1, -1, 1)
    keep = position < beta.view(-1, 1, 1)
    closest = ordered.gather(1, order)
    kept_weights = torch.where(keep, weights.gather(1, order), 0.0)
    total = kept_weights.sum(1)
    out = torch.where(keep, closest * kept_weights, 0.0).sum(1) / total.clamp_min(
        torch.finfo(total.dtype).tiny
    )
    if bool((total > 0).all()):
        return out
    uniform = torch.where(keep, closest, 0.0).sum(1) / beta.view(-1, 1).clamp_min(1)
    return torch.where(total > 0, out, uniform)
