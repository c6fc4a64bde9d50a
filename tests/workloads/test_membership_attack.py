"""The membership-inference attack's measures (workloads.membership): the ROC AUC and the
advantage on known cases, and against their definitions over every pair and threshold."""

from __future__ import annotations

import pytest
import torch

from workloads.membership import membership_advantage, roc_auc


def pairwise_auc(members: torch.Tensor, others: torch.Tensor) -> float:
    """P(member > non-member) + 1/2 P(tie), over every pair: the definition."""
    greater = (members[:, None] > others[None, :]).double().mean()
    ties = (members[:, None] == others[None, :]).double().mean()
    return float(greater + 0.5 * ties)


def every_threshold_advantage(members: torch.Tensor, others: torch.Tensor) -> float:
    """max over tau in the scores (and above them) of TPR - FPR of "score >= tau"."""
    thresholds = torch.cat([members, others, torch.tensor([float("inf")])]).unique()
    return max(
        float((members >= t).double().mean() - (others >= t).double().mean()) for t in thresholds
    )


def test_known_cases() -> None:
    high = torch.tensor([3.0, 4.0, 5.0])
    low = torch.tensor([0.0, 1.0, 2.0])
    assert float(roc_auc(high, low)) == 1.0 and float(membership_advantage(high, low)) == 1.0
    assert float(roc_auc(low, high)) == 0.0 and float(membership_advantage(low, high)) == 0.0
    same = torch.ones(4)
    assert float(roc_auc(same, same)) == 0.5 and float(membership_advantage(same, same)) == 0.0
    # members 1, 3 against non-members 2, 2: pairs (1,2) lose, (3,2) win -> 1/2; the threshold
    # 3 takes one member and no non-member -> advantage 1/2
    members, others = torch.tensor([1.0, 3.0]), torch.tensor([2.0, 2.0])
    assert float(roc_auc(members, others)) == 0.5
    assert float(membership_advantage(members, others)) == 0.5
    # one tie between a member and a non-member counts a half
    assert float(roc_auc(torch.tensor([1.0, 2.0]), torch.tensor([1.0]))) == 0.75


def test_batched_rows_match_the_definitions_with_ties() -> None:
    generator = torch.Generator().manual_seed(0)
    members = torch.randint(0, 6, (5, 9), generator=generator).double()  # many ties
    others = torch.randint(0, 5, (5, 7), generator=generator).double()
    aucs, advantages = roc_auc(members, others), membership_advantage(members, others)
    assert aucs.shape == advantages.shape == (5,)
    for row in range(5):
        assert float(aucs[row]) == pytest.approx(pairwise_auc(members[row], others[row]))
        assert float(advantages[row]) == pytest.approx(
            every_threshold_advantage(members[row], others[row])
        )


@pytest.mark.parametrize(
    ("members", "others", "message"),
    [
        (torch.zeros(2, 3), torch.zeros(3, 3), "must share their leading dimensions"),
        (torch.zeros(0), torch.zeros(3), "at least one member"),
        (torch.tensor([float("nan")]), torch.zeros(1), "must be finite"),
    ],
)
def test_bad_scores_are_refused(members: torch.Tensor, others: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        roc_auc(members, others)
