"""Spectral gap and rounds to consensus, against closed forms and dense references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

import topologies
from topologies import (
    DENSE_LIMIT,
    build,
    contraction_factor,
    mixing_matrix,
    rounds_to_consensus,
    spectral_gap,
)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64, 128, 256, 512])
def test_directed_exponential_gap_is_two_over_one_plus_log2_n(n: int) -> None:
    W = mixing_matrix(topologies.exponential(n))
    assert spectral_gap(W) == pytest.approx(2 / (1 + math.log2(n)), abs=1e-10)


@pytest.mark.parametrize("n", [5, 8, 16, 100, 256])
def test_ring_with_weights_one_third_has_lambda2_closed_form(n: int) -> None:
    W = topologies.metropolis_hastings(topologies.ring(n))
    lambda2 = 1 / 3 + (2 / 3) * math.cos(2 * math.pi / n)
    assert 1 - spectral_gap(W) == pytest.approx(lambda2, abs=1e-12)
    assert spectral_gap(W, method="dense") == pytest.approx(1 - lambda2, abs=1e-12)


def _dense_reference(W: sp.csr_array) -> float:
    """||W - 11ᵀ/n||_2 by a full dense SVD (independent of the library's code path)."""
    n = W.shape[0]
    return float(np.linalg.svd(W.toarray() - np.full((n, n), 1 / n), compute_uv=False)[0])


@pytest.mark.parametrize(
    ("name", "params", "weights"),
    [
        ("random-regular", {"degree": 3}, None),
        ("erdos-renyi", {}, None),
        ("small-world", {"p": 0.3}, None),
        ("torus", {}, "max-degree"),
        ("dumbbell", {}, "lazy"),
        ("exponential", {}, None),  # not symmetric: singular values
        ("star", {}, "uniform"),  # neither symmetric nor doubly stochastic
    ],
)
def test_sparse_solver_matches_dense_reference_at_256(
    name: str, params: dict[str, object], weights: str | None
) -> None:
    assert DENSE_LIMIT < 256  # so that "auto" takes the sparse path here
    W = mixing_matrix(build(name, 256, **params), weights)
    reference = _dense_reference(W)
    assert contraction_factor(W) == pytest.approx(reference, abs=1e-9)
    assert contraction_factor(W, method="sparse") == pytest.approx(reference, abs=1e-9)
    assert contraction_factor(W, method="dense") == pytest.approx(reference, abs=1e-12)


def test_spectral_gap_accepts_dense_arrays_and_is_deterministic() -> None:
    W = mixing_matrix(build("random-regular", 200, degree=4, seed=3))
    assert spectral_gap(W) == spectral_gap(W)
    assert spectral_gap(W.toarray()) == pytest.approx(spectral_gap(W), abs=1e-12)
    with pytest.raises(ValueError, match="method='fast' is not one of: auto, dense, sparse"):
        spectral_gap(W, method="fast")


def test_rounds_to_consensus_is_the_smallest_sufficient_t() -> None:
    for name in ["ring", "torus", "exponential", "small-world"]:
        W = mixing_matrix(build(name, 64))
        rho = contraction_factor(W)
        for factor in [1e-1, 1e-3, 1e-6]:
            t = rounds_to_consensus(W, factor)
            assert rho**t <= factor * (1 + 1e-9) and rho ** (t - 1) > factor
    assert rounds_to_consensus(mixing_matrix(topologies.complete(10))) == 1


def test_rounds_to_consensus_bounds_actual_disagreement() -> None:
    W = mixing_matrix(build("small-world", 64, seed=2))
    t = rounds_to_consensus(W, 1e-3)
    x = np.random.default_rng(0).standard_normal(64)
    start = np.linalg.norm(x - x.mean())
    for _ in range(t):
        x = W @ x
    assert np.linalg.norm(x - x.mean()) <= 1e-3 * start


def test_rounds_to_consensus_rejects_non_contracting_matrices_and_bad_factors() -> None:
    split = sp.block_diag([np.full((2, 2), 0.5), np.full((2, 2), 0.5)], format="csr")
    assert spectral_gap(split) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="does not contract disagreement"):
        rounds_to_consensus(split)
    W = mixing_matrix(topologies.ring(8))
    for factor in [0.0, 1.0, 2.0]:
        with pytest.raises(ValueError, match=f"factor={factor} must lie in \\(0, 1\\)"):
            rounds_to_consensus(W, factor)
