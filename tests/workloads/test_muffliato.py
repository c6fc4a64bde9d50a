"""The pairwise network account of noisy gossip (workloads.network_privacy): the paper's sum
against a direct evaluation of its definition, the exact view against the Gaussian
divergence computed from the view's covariance, closed forms, and where the two differ."""

from __future__ import annotations

import numpy as np
import pytest

from workloads.network_privacy import (
    ORDERS,
    muffliato_coefficient,
    pair_epsilon,
    rdp_to_epsilon,
    view_coefficient,
)


def ring(n: int) -> np.ndarray:
    """The ring's Metropolis-Hastings W: 1/3 to each neighbour and to itself."""
    w = np.zeros((n, n))
    for i in range(n):
        w[i, (i - 1) % n] = w[i, (i + 1) % n] = w[i, i] = 1 / 3
    return w


def paper_sum_by_definition(w: np.ndarray, u: int, v: int, rounds: int, k: int) -> float:
    """Σ over noisy steps t, over every later gossip step j, over v's senders s, of
    (W^{j - tK})²_{su} / ‖row s of W^{j - tK}‖², with matrix powers taken one by one."""
    senders = [s for s in range(len(w)) if s != v and w[v, s] > 0]
    total = 0.0
    for t in range(rounds):
        for j in range(t * k, rounds * k):
            power = np.linalg.matrix_power(w, j - t * k)
            for s in senders:
                total += power[s, u] ** 2 / np.sum(power[s] ** 2)
    return total


def view_by_covariance(w: np.ndarray, u: int, v: int, rounds: int, k: int) -> float:
    """Σ_{t,t'} |a_tᵀ Σ⁺ a_t'|: a_t the mean shift of v's messages when u's step t moves by
    one, Σ their noise covariance (every node's noise but v's), by simulating x <- W x."""
    n = len(w)
    senders = [s for s in range(n) if s != v and w[v, s] > 0]
    x = np.zeros((n, rounds * n))  # x as a function of every (step, node) input
    messages = []
    for t in range(rounds):
        x[:, t * n : (t + 1) * n] -= np.eye(n)
        for _ in range(k):
            messages.append(x[senders].copy())
            x = w @ x
    m = np.concatenate(messages)
    others = [c for c in range(rounds * n) if c % n != v]
    covariance = m[:, others] @ m[:, others].T
    shifts = m[:, [t * n + u for t in range(rounds)]]
    gram = shifts.T @ np.linalg.pinv(covariance, rcond=1e-12) @ shifts
    return float(np.abs(gram).sum())


@pytest.mark.parametrize(("rounds", "k"), [(1, 1), (1, 3), (2, 2), (3, 3)])
def test_both_coefficients_equal_their_definitions_on_a_ring_of_six(rounds: int, k: int) -> None:
    w = ring(6)
    for v in range(1, 6):
        paper = muffliato_coefficient(w, 0, v, rounds=rounds, gossip_steps=k)
        assert paper == pytest.approx(paper_sum_by_definition(w, 0, v, rounds, k), rel=1e-12)
        view = view_coefficient(w, 0, v, rounds=rounds, gossip_steps=k)
        expected = min(rounds, view_by_covariance(w, 0, v, rounds, k))
        assert view == pytest.approx(expected, rel=1e-6, abs=1e-9)


def test_closed_forms() -> None:
    w = ring(8)
    # one noisy step, one gossip step: a neighbour sees u's noisy value (local DP, S = 1),
    # anyone else nothing
    for coefficient in (muffliato_coefficient, view_coefficient):
        assert coefficient(w, 0, 1, rounds=1, gossip_steps=1) == pytest.approx(1.0)
        assert coefficient(w, 0, 3, rounds=1, gossip_steps=1) == 0.0
    # the complete graph with W = J/n: v receives u's noisy value at step 0, then n-1
    # copies of the mean per later step, each (1/n)² / (n/n²) = 1/n in the paper's sum
    n, k = 5, 4
    complete = np.full((n, n), 1 / n)
    assert muffliato_coefficient(complete, 0, 1, rounds=1, gossip_steps=k) == pytest.approx(
        1 + (k - 1) * (n - 1) / n
    )
    # a Gaussian mechanism of sensitivity 1 and noise sigma: RDP alpha / (2 sigma²)
    alphas = np.asarray(ORDERS)
    assert pair_epsilon(1.0, 2.0, 1e-5) == rdp_to_epsilon(alphas / 8, 1e-5)
    assert pair_epsilon(0.0, 2.0, 1e-5) == 0.0


def test_rdp_conversion_is_opacus() -> None:
    from opacus.accountants.analysis.rdp import get_privacy_spent

    alphas = np.asarray(ORDERS)
    curve = alphas * 30 / (2 * 1.5**2)
    expected, _ = get_privacy_spent(orders=list(alphas), rdp=curve, delta=1e-5)
    assert rdp_to_epsilon(curve, 1e-5) == pytest.approx(float(expected), rel=1e-12)


def test_the_paper_sum_is_below_what_the_view_reveals() -> None:
    """Why epsilon_pair is the exact view's: on a ring of 8, one noisy step and K = 3, node 2
    (distance 2) can solve its messages for u's noisy value (S = 1, local DP), while the
    paper's sum, which treats the messages as independent, gives S = 0.54."""
    w = ring(8)
    assert view_coefficient(w, 0, 2, rounds=1, gossip_steps=3) == pytest.approx(1.0)
    assert muffliato_coefficient(w, 0, 2, rounds=1, gossip_steps=3) == pytest.approx(
        0.5439, abs=1e-4
    )


def test_privacy_grows_with_distance_over_many_rounds() -> None:
    w = ring(16)
    view = [view_coefficient(w, 0, d, rounds=30, gossip_steps=3) for d in (1, 4, 8)]
    assert view[0] == pytest.approx(30.0)  # a neighbour: every noisy step, local DP
    assert view[0] > view[1] > view[2] > 0
    # heavy-ball momentum is a different linear map, still within the composition bound
    assert 0 < view_coefficient(w, 0, 8, rounds=30, gossip_steps=3, momentum=0.9) <= 30


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"u": 0, "v": 0}, "u, v: must be two different nodes"),
        ({"u": 0, "v": 6}, "v: must be a node in 0..5"),
        ({"rounds": 0}, "rounds: must be an integer >= 1"),
        ({"gossip_steps": 0}, "gossip_steps: must be an integer >= 1"),
    ],
)
def test_bad_arguments_are_one_line(kwargs: dict[str, int], message: str) -> None:
    arguments = {"u": 0, "v": 1, "rounds": 1, "gossip_steps": 1} | kwargs
    u, v = arguments.pop("u"), arguments.pop("v")
    with pytest.raises(ValueError, match=message):
        view_coefficient(ring(6), u, v, **arguments)
