"""Mixing weights and the validator."""

from __future__ import annotations

import math
import re

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

import topologies
from topologies import (
    TOPOLOGIES,
    WEIGHT_SCHEMES,
    MixingMatrixError,
    TopologyError,
    build,
    mixing_matrix,
    validate_mixing,
)


@pytest.mark.parametrize("weights", WEIGHT_SCHEMES)
@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_every_builder_and_weight_scheme_passes_the_validator(name: str, weights: str) -> None:
    graph = build(name, 24 if name != "hypercube" else 32)
    if graph.is_directed() and weights != "uniform":
        with pytest.raises(TopologyError, match="needs an undirected graph") as info:
            mixing_matrix(graph, weights)
        assert info.value.parameter == "weights"
        return
    W = mixing_matrix(graph, weights)
    assert isinstance(W, sp.csr_array) and W.shape == (graph.number_of_nodes(),) * 2
    if weights == "uniform":
        validate_mixing(W, row_stochastic=False, column_stochastic=True, tol=1e-12)
        regular = len({d for _, d in graph.degree()}) == 1
        if regular:  # regular graphs (and the exponential graph): doubly stochastic too
            validate_mixing(W, row_stochastic=True, column_stochastic=True, tol=1e-12)
    else:
        validate_mixing(W, symmetric=True, row_stochastic=True, column_stochastic=True, tol=1e-12)
    # the sparsity pattern is exactly the graph plus the diagonal
    pattern = {(i, j) for i, j in zip(*W.nonzero()) if i != j}
    if graph.is_directed():
        assert pattern == {(v, u) for u, v in graph.edges()}  # row v receives from u
    else:
        assert pattern == {(u, v) for u, v in graph.edges()} | {(v, u) for u, v in graph.edges()}


def test_metropolis_hastings_on_a_star_uses_the_larger_degree() -> None:
    W = topologies.metropolis_hastings(topologies.star(5)).toarray()
    # hub degree 4, leaves degree 1: every edge weight 1/(1 + 4)
    assert np.allclose(W[0, 1:], 0.2) and np.allclose(W[1:, 0], 0.2)
    assert W[0, 0] == pytest.approx(0.2) and np.allclose(np.diag(W)[1:], 0.8)


def test_ring_metropolis_weights_are_one_third() -> None:
    W = topologies.metropolis_hastings(topologies.ring(10)).toarray()
    assert np.allclose(W[W > 0], 1 / 3) and np.count_nonzero(W) == 30


def test_max_degree_weights_on_an_irregular_graph() -> None:
    graph = nx.path_graph(4)  # degrees 1, 2, 2, 1; max degree 2
    W = topologies.max_degree(graph).toarray()
    expected = np.array(
        [
            [2 / 3, 1 / 3, 0, 0],
            [1 / 3, 1 / 3, 1 / 3, 0],
            [0, 1 / 3, 1 / 3, 1 / 3],
            [0, 0, 1 / 3, 2 / 3],
        ]
    )
    np.testing.assert_allclose(W, expected, rtol=0, atol=1e-15)


def test_lazy_is_half_identity_plus_half_w() -> None:
    W = topologies.metropolis_hastings(topologies.dumbbell(8))
    L = topologies.lazy(W)
    np.testing.assert_allclose(L.toarray(), 0.5 * (np.eye(8) + W.toarray()), rtol=0, atol=1e-15)
    np.testing.assert_allclose(mixing_matrix(topologies.dumbbell(8), "lazy").toarray(), L.toarray())


@pytest.mark.parametrize("n", [2, 7, 16, 100])
def test_directed_exponential_uniform_weights(n: int) -> None:
    W = mixing_matrix(topologies.exponential(n))  # default for directed: uniform
    tau = math.ceil(math.log2(n))
    np.testing.assert_allclose(W.data, 1.0 / (1 + tau), rtol=0, atol=1e-15)
    assert W.nnz == n * (1 + tau)
    validate_mixing(W, row_stochastic=True, column_stochastic=True, tol=1e-12)


def test_uniform_push_weights_on_an_irregular_digraph_are_column_stochastic() -> None:
    graph = nx.DiGraph([(0, 1), (0, 2), (1, 2), (2, 0)])
    W = topologies.uniform(graph).toarray()
    # node 0 sends to 1 and 2 and keeps a share: each 1/3; node 1 sends to 2: halves
    np.testing.assert_allclose(W[:, 0], [1 / 3, 1 / 3, 1 / 3])
    np.testing.assert_allclose(W[:, 1], [0, 1 / 2, 1 / 2])
    np.testing.assert_allclose(W[:, 2], [1 / 2, 0, 1 / 2])
    with pytest.raises(MixingMatrixError, match=re.escape("row 0 sums to 0.8333")):
        validate_mixing(W)


def test_unknown_weight_scheme_lists_the_choices() -> None:
    with pytest.raises(TopologyError, match="unknown weights 'boyd'; choose one of: metropolis"):
        mixing_matrix(topologies.ring(4), "boyd")


def test_validator_names_the_offending_row_column_or_entry() -> None:
    W = np.eye(4)
    W[2, 3] = 0.1
    with pytest.raises(MixingMatrixError, match=re.escape("row 2 sums to 1.1, not 1")):
        validate_mixing(W)
    with pytest.raises(MixingMatrixError, match=re.escape("column 3 sums to 1.1, not 1")):
        validate_mixing(W, row_stochastic=False, column_stochastic=True)
    with pytest.raises(
        MixingMatrixError, match=re.escape("not symmetric: row 2 has W[2, 3] = 0.1")
    ):
        validate_mixing(W, row_stochastic=False, symmetric=True)
    validate_mixing(W, tol=0.2)  # within tolerance
    negative = np.array([[1.5, -0.5], [-0.5, 1.5]])
    with pytest.raises(MixingMatrixError, match=re.escape("entry (0, 1) = -0.5 is negative")):
        validate_mixing(negative)
    validate_mixing(negative, nonnegative=False, symmetric=True, column_stochastic=True)
    with pytest.raises(MixingMatrixError, match="square"):
        validate_mixing(np.ones((2, 3)) / 3)
    with pytest.raises(MixingMatrixError, match="non-finite"):
        validate_mixing(np.array([[np.nan, 1.0], [0.0, 1.0]]))
