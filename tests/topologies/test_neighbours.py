"""NeighbourTable: W as padded per-node arrays, and hypothesis properties of the weights."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st

import topologies
from topologies import mixing_matrix, neighbour_table, validate_mixing


@st.composite
def connected_graphs(draw: st.DrawFn, max_nodes: int = 14) -> nx.Graph:
    """A random connected graph on 0..n-1: a random spanning tree plus random extra edges."""
    n = draw(st.integers(2, max_nodes))
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((node, draw(st.integers(0, node - 1))) for node in range(1, n))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    graph.add_edges_from(draw(st.lists(st.sampled_from(pairs), max_size=2 * n)))
    return graph


@st.composite
def strongly_connected_digraphs(draw: st.DrawFn, max_nodes: int = 12) -> nx.DiGraph:
    """A random strongly connected digraph: a directed cycle in random order plus random arcs."""
    n = draw(st.integers(2, max_nodes))
    order = draw(st.permutations(list(range(n))))
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from(zip(order, [*order[1:], order[0]]))
    arcs = [(i, j) for i in range(n) for j in range(n) if i != j]
    graph.add_edges_from(draw(st.lists(st.sampled_from(arcs), max_size=2 * n)))
    return graph


@given(connected_graphs())
def test_metropolis_hastings_is_symmetric_doubly_stochastic_with_the_formula(
    graph: nx.Graph,
) -> None:
    W = topologies.metropolis_hastings(topologies.from_graph(graph))
    validate_mixing(W, symmetric=True, row_stochastic=True, column_stochastic=True, tol=1e-12)
    dense = W.toarray()
    degree = dict(graph.degree())
    for i, j in graph.edges():
        assert dense[i, j] == pytest.approx(1 / (1 + max(degree[i], degree[j])), abs=1e-15)
    assert np.all(np.diag(dense) > 0)
    assert np.count_nonzero(dense - np.diag(np.diag(dense))) == 2 * graph.number_of_edges()
    assert topologies.spectral_gap(W) > 0  # connected graph: it contracts


@given(connected_graphs(), st.sampled_from(["metropolis", "max-degree", "lazy", "uniform"]))
def test_neighbour_table_reconstructs_w_exactly(graph: nx.Graph, weights: str) -> None:
    W = mixing_matrix(graph, weights)
    table = neighbour_table(W)
    assert (table.to_matrix() != W).nnz == 0
    n = graph.number_of_nodes()
    assert table.width == max(d for _, d in graph.degree())
    np.testing.assert_array_equal(table.degree, [graph.degree(i) for i in range(n)])
    rows = np.broadcast_to(np.arange(n)[:, None], table.index.shape)
    assert np.all(table.index[~table.mask] == rows[~table.mask])  # padding points at itself
    assert np.all(table.weight[~table.mask] == 0)


@given(strongly_connected_digraphs())
def test_neighbour_table_of_push_sum_weights_lists_what_each_node_receives(
    graph: nx.DiGraph,
) -> None:
    W = mixing_matrix(graph)  # uniform, column-stochastic
    validate_mixing(W, row_stochastic=False, column_stochastic=True, tol=1e-12)
    table = neighbour_table(W)
    assert (table.to_matrix() != W).nnz == 0
    for i in range(graph.number_of_nodes()):
        assert set(table.index[i][table.mask[i]].tolist()) == set(graph.predecessors(i))


@given(connected_graphs(), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_gather_with_the_table_is_w_times_x(graph: nx.Graph, d: int, seed: int) -> None:
    """The vector convention own*w_ii + sum_j w_ij x_j over the table equals W @ X."""
    W = mixing_matrix(graph)
    table = neighbour_table(W, width=graph.number_of_nodes())
    x = np.random.default_rng(seed).standard_normal((graph.number_of_nodes(), d))
    implicit_self = 1.0 - (table.weight * table.mask).sum(axis=1)
    np.testing.assert_allclose(implicit_self, table.self_weight, atol=1e-12)
    mixed = table.self_weight[:, None] * x + np.einsum(
        "nk,nkd->nd", table.weight * table.mask, x[table.index]
    )
    np.testing.assert_allclose(mixed, W @ x, atol=1e-12)


def test_neighbour_table_layout_on_a_path() -> None:
    W = topologies.metropolis_hastings(nx.path_graph(3))
    table = neighbour_table(W, width=3)
    np.testing.assert_array_equal(table.index, [[1, 0, 0], [0, 2, 1], [1, 2, 2]])
    np.testing.assert_array_equal(table.mask, [[1, 0, 0], [1, 1, 0], [1, 0, 0]])
    np.testing.assert_allclose(table.weight, [[1 / 3, 0, 0], [1 / 3, 1 / 3, 0], [1 / 3, 0, 0]])
    np.testing.assert_allclose(table.self_weight, [2 / 3, 1 / 3, 2 / 3])
    assert table.index.dtype == np.int64 and table.mask.dtype == bool and table.n == 3
    with pytest.raises(ValueError, match="width=1 is too small: row 1 has 2 neighbours"):
        neighbour_table(W, width=1)
    with pytest.raises(ValueError, match="square"):
        neighbour_table(sp.csr_array(np.ones((2, 3))))
