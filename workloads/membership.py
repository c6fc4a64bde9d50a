"""Membership inference by a loss threshold, written once: the attack's scores and its
success (Yeom, Giacomelli, Fredrikson & Jha 2018, "Privacy Risk in Machine Learning:
Analyzing the Connection to Overfitting", CSF).

The attacker holds a model and an example and guesses "member" (the example was in the
model's training data) when the model's loss on it is low: the score of an example is
``−ℓ(f(x), y)``, and the guess at threshold τ is ``score ≥ τ``. Its success over every τ:

- :func:`roc_auc`: the area under the ROC curve, ``P(s_member > s_non) + ½ P(s_member =
  s_non)`` over a member and a non-member drawn uniformly (0.5: no better than chance; 1:
  every member scores above every non-member), by ranks with ties averaged
  (Mann-Whitney U / (M N)), O((M + N) log(M + N)).
- :func:`membership_advantage`: ``max_τ (TPR(τ) − FPR(τ))``, Yeom et al.'s membership
  advantage at the best threshold (≥ 0; 0 at τ above every score). The attacker here picks τ
  knowing who is a member, so this is an upper bound on what a threshold set in advance gets.

Both take scores with any leading batch (``[..., M]`` and ``[..., N]``), so the simulator
scores all its peers in one call and a single peer its own row. Under (ε, δ)-DP of the
training data any test's ``TPR − FPR`` is at most ``(e^ε − 1 + 2δ) / (e^ε + 1)`` (DP as
hypothesis testing: Kairouz, Oh & Viswanath 2015), so a model trained with a small ε must
score close to chance.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["membership_advantage", "roc_auc"]


def _check(members: Tensor, others: Tensor) -> None:
    if members.shape[:-1] != others.shape[:-1]:
        raise ValueError(
            f"scores: members {tuple(members.shape)} and non-members {tuple(others.shape)} "
            "must share their leading dimensions"
        )
    if members.shape[-1] == 0 or others.shape[-1] == 0:
        raise ValueError("scores: need at least one member and one non-member")
    if not (bool(torch.isfinite(members).all()) and bool(torch.isfinite(others).all())):
        raise ValueError("scores: must be finite (a model whose loss is not finite)")


def roc_auc(members: Tensor, others: Tensor) -> Tensor:
    """The ROC AUC ``[...]`` of scores ``members [..., M]`` (positives) against ``others
    [..., N]`` (negatives): ``(R_M − M(M+1)/2) / (M N)``, ``R_M`` the sum of the members'
    ranks (1-based, ties averaged) among all ``M + N`` scores. float64."""
    _check(members, others)
    m = members.shape[-1]
    n = others.shape[-1]
    scores = torch.cat([members, others], dim=-1).to(torch.float64)
    ordered = scores.sort(dim=-1).values.contiguous()
    below = torch.searchsorted(ordered, scores[..., :m].contiguous(), side="left")
    upto = torch.searchsorted(ordered, scores[..., :m].contiguous(), side="right")
    ranks = (below + upto + 1).to(torch.float64) / 2.0  # average 1-based rank of a tie block
    return (ranks.sum(dim=-1) - m * (m + 1) / 2.0) / (m * n)


def membership_advantage(members: Tensor, others: Tensor) -> Tensor:
    """``max_τ (TPR(τ) − FPR(τ))`` ``[...]`` of the guess "member when score ≥ τ", over every
    threshold τ (between distinct scores, and above all of them: so it is ≥ 0). float64."""
    _check(members, others)
    m = members.shape[-1]
    n = others.shape[-1]
    scores = torch.cat([members, others], dim=-1).to(torch.float64)
    is_member = torch.zeros_like(scores, dtype=torch.bool)
    is_member[..., :m] = True
    ordered, order = scores.sort(dim=-1, descending=True)
    labels = is_member.gather(-1, order).to(torch.float64)
    tpr = labels.cumsum(dim=-1) / m
    fpr = (1.0 - labels).cumsum(dim=-1) / n
    # a threshold sits only after the last of a block of equal scores
    last = torch.ones_like(ordered, dtype=torch.bool)
    last[..., :-1] = ordered[..., :-1] != ordered[..., 1:]
    gap = torch.where(last, tpr - fpr, torch.zeros_like(tpr))
    return gap.max(dim=-1).values.clamp(min=0.0)
