"""Time-varying topologies behind the Schedule protocol."""

from __future__ import annotations

from functools import reduce

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import topologies
from topologies import (
    OnePeerExponential,
    RandomKOut,
    RandomMatching,
    Schedule,
    Static,
    TopologyError,
    validate_mixing,
)


def _product(schedule: Schedule, rounds: range) -> np.ndarray:
    """W_{t_last} ... W_{t_first}: the mixing over consecutive rounds (later rounds on the left)."""
    return reduce(lambda acc, t: schedule.mixing(t).toarray() @ acc, rounds, np.eye(schedule.n))


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64, 128])
def test_one_peer_exponential_rounds_average_exactly_for_powers_of_two(n: int) -> None:
    schedule = OnePeerExponential(n)
    assert schedule.period == n.bit_length() - 1
    np.testing.assert_allclose(
        _product(schedule, range(schedule.period)), 1 / n, rtol=0, atol=1e-15
    )
    # any window of period consecutive rounds works, not just the first
    np.testing.assert_allclose(_product(schedule, range(3, 3 + schedule.period)), 1 / n, atol=1e-15)


@pytest.mark.parametrize("n", [3, 5, 6, 12, 100])
def test_one_peer_exponential_is_not_exact_for_other_n(n: int) -> None:
    schedule = OnePeerExponential(n)
    error = np.abs(_product(schedule, range(schedule.period)) - 1 / n).max()
    assert error > 1e-3


def test_one_peer_exponential_round_structure() -> None:
    schedule = OnePeerExponential(16)
    for t in range(9):
        W = schedule.mixing(t)
        validate_mixing(W, row_stochastic=True, column_stochastic=True, tol=1e-15)
        offset = 2 ** (t % 4)
        assert schedule.offset(t) == offset
        table = schedule.neighbour_table(t)
        assert table.width == 1
        np.testing.assert_array_equal(table.index[:, 0], (np.arange(16) + offset) % 16)
        np.testing.assert_allclose(table.weight, 0.5)
        np.testing.assert_allclose(table.self_weight, 0.5)


@pytest.mark.parametrize("n", [10, 11])
def test_random_matching_rounds(n: int) -> None:
    schedule = RandomMatching(n, seed=7)
    for t in [0, 1, 5, 1000]:
        W = schedule.mixing(t)
        validate_mixing(W, symmetric=True, row_stochastic=True, column_stochastic=True, tol=0)
        table = schedule.neighbour_table(t)
        assert table.width == 1
        assert int(table.degree.sum()) == 2 * (n // 2)  # everyone matched but one when n is odd
        partner = table.index[:, 0]
        assert np.all(partner[partner] == np.arange(n))  # pairs are mutual
    # reproducible from (seed, t) alone, whatever was asked before
    other = RandomMatching(n, seed=7)
    assert (other.mixing(5) != schedule.mixing(5)).nnz == 0
    assert (schedule.mixing(5) != schedule.mixing(6)).nnz > 0
    assert (RandomMatching(n, seed=8).mixing(5) != schedule.mixing(5)).nnz > 0


def test_random_matching_mixes_to_consensus() -> None:
    schedule = RandomMatching(32, seed=0)
    x = np.random.default_rng(1).standard_normal(32)
    mean = x.mean()
    for t in range(200):
        x = schedule.mixing(t) @ x
    assert x.mean() == pytest.approx(mean, abs=1e-12)
    assert np.abs(x - mean).max() < 1e-6


@pytest.mark.parametrize(("n", "k"), [(50, 2), (30, 20), (6, 5)])
def test_random_k_out_targets_and_weights(n: int, k: int) -> None:
    schedule = RandomKOut(n, k, seed=3)
    targets = schedule.targets(4)
    assert targets.shape == (n, k)
    assert all(len(set(row)) == k for row in targets.tolist())
    assert np.all(targets != np.arange(n)[:, None]) and targets.min() >= 0 and targets.max() < n
    np.testing.assert_array_equal(targets, RandomKOut(n, k, seed=3).targets(4))
    assert not np.array_equal(targets, schedule.targets(5))
    average = schedule.mixing(4)
    validate_mixing(average, row_stochastic=True, tol=1e-12)
    table = schedule.neighbour_table(4)
    for i in range(n):
        senders = set(np.flatnonzero((targets == i).any(axis=1)).tolist())
        assert set(table.index[i][table.mask[i]].tolist()) == senders
    push = RandomKOut(n, k, seed=3, weights="push-sum").mixing(4)
    validate_mixing(push, row_stochastic=False, column_stochastic=True, tol=1e-12)
    assert (push != 0).toarray().tolist() == (average != 0).toarray().tolist()


def test_static_and_protocol() -> None:
    W = topologies.mixing_matrix(topologies.torus(16))
    static = Static(W)
    assert (static.mixing(0) != W).nnz == 0 and (static.mixing(99) != W).nnz == 0
    assert (static.neighbour_table(3).to_matrix() != W).nnz == 0
    assert isinstance(static, Schedule) and static.n == 16
    for schedule in [OnePeerExponential(8), RandomMatching(8), RandomKOut(8, 2)]:
        assert isinstance(schedule, Schedule) and schedule.n == 8
        assert schedule.neighbour_table(2).n == 8 and schedule.mixing(2).shape == (8, 8)
    assert not isinstance(W, Schedule)


def test_schedules_reject_bad_input() -> None:
    with pytest.raises(TopologyError, match="round t=-1 must be >= 0"):
        OnePeerExponential(8).mixing(-1)
    with pytest.raises(
        TopologyError, match="k=8 out-peers is impossible for n=8: need 1 <= k <= 7"
    ):
        RandomKOut(8, 8)
    with pytest.raises(
        TopologyError, match="weights='pull' is not one of: receiver-average, push-sum"
    ):
        RandomKOut(8, 2, weights="pull")
    with pytest.raises(TopologyError, match="n=1 is too small"):
        RandomMatching(1)
    with pytest.raises(ValueError, match="square"):
        Static(np.ones((2, 3)))


@given(st.integers(2, 40), st.integers(0, 2**32 - 1), st.integers(0, 10**6))
def test_random_rounds_depend_only_on_seed_and_t(n: int, seed: int, t: int) -> None:
    matching = RandomMatching(n, seed=seed)
    W = matching.mixing(t)
    validate_mixing(W, symmetric=True, row_stochastic=True, column_stochastic=True, tol=0)
    assert (RandomMatching(n, seed=seed).mixing(t) != W).nnz == 0
    k = 1 + seed % (n - 1)
    kout = RandomKOut(n, k, seed=seed)
    np.testing.assert_array_equal(kout.targets(t), RandomKOut(n, k, seed=seed).targets(t))
    validate_mixing(kout.mixing(t), row_stochastic=True, tol=1e-12)
    one_peer = OnePeerExponential(n).mixing(t)
    validate_mixing(one_peer, row_stochastic=True, column_stochastic=True, tol=0)
