"""A user's graph from an edge list: parsing, the checks, and lazy Metropolis weights on it."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
import pytest

import topologies
from topologies import TopologyError, mixing_matrix, validate_mixing
from topologies.edgelist import graph_from_edges, parse_edge_list, read_edge_list

RING_WITH_LEAVES = """
# a ring of 3 with one leaf each
0 1
1,2
2 0   # back to the start

0 3
1 4
2 5
"""


def test_an_edge_list_file_gives_its_graph(tmp_path: Path) -> None:
    file = tmp_path / "graph.edges"
    file.write_text(RING_WITH_LEAVES, encoding="utf-8")
    edges = read_edge_list(file)
    assert edges.tolist() == [[0, 1], [1, 2], [2, 0], [0, 3], [1, 4], [2, 5]]
    graph = graph_from_edges(6, edges)
    assert not graph.is_directed()
    assert list(graph.nodes()) == list(range(6))
    assert sorted(map(sorted, graph.edges())) == sorted(map(sorted, edges.tolist()))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0 1\n1 2 3\n", r"line 2: expected two node ids 'u v'"),
        ("0 1\n1 x\n", r"line 2: expected two node ids"),
        ("0 -1\n", r"line 1: expected two node ids"),
        ("# only a comment\n\n", "no edges"),
    ],
)
def test_a_bad_line_is_named_with_its_number(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message) as info:
        parse_edge_list(text, source="g.edges")
    assert info.value.parameter == "file"
    assert "g.edges" in str(info.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="no such edge-list file") as info:
        read_edge_list(tmp_path / "absent.edges")
    assert info.value.parameter == "file"


@pytest.mark.parametrize(
    ("n", "edges", "directed", "message"),
    [
        (4, [(0, 1), (1, 2), (2, 4)], False, r"edge 2 \(2, 4\) names a node outside 0\.\.3"),
        (3, [(0, 1), (1, 1), (1, 2)], False, r"edge 1 \(1, 1\) is a self-loop"),
        (3, [(0, 1), (1, 2), (1, 0)], False, r"edge 2 \(1, 0\) repeats edge 0 \(0, 1\)"),
        (3, [(0, 1), (1, 2), (0, 1), (2, 0)], True, r"edge 2 \(0, 1\) repeats directed edge 0"),
        (4, [(0, 1), (1, 2), (2, 0)], False, r"not connected: it has 2 components.*\[3\]"),
        (3, [(0, 1), (1, 2)], True, "not strongly connected"),
        (3, [], False, "no edges"),
        (3, [(0, 1, 2)], False, r"edge 0 must be a pair of node ids"),
        (3, [(0, True)], False, r"edge 0 must be a pair of node ids"),
    ],
)
def test_bad_edges_are_refused_naming_the_edge(
    n: int, edges: list[tuple[int, ...]], directed: bool, message: str
) -> None:
    with pytest.raises(TopologyError, match=message) as info:
        graph_from_edges(n, edges, directed=directed)
    assert info.value.parameter == "edges"


def test_directed_edges_mean_sender_to_receiver() -> None:
    graph = graph_from_edges(3, [(0, 1), (1, 2), (2, 0), (1, 0)], directed=True)
    assert graph.is_directed()
    W = mixing_matrix(graph).toarray()  # uniform push weights: row v receives from u
    assert W[1, 0] > 0 and W[0, 1] > 0 and W[0, 2] > 0 and W[2, 0] == 0
    validate_mixing(W, row_stochastic=False, column_stochastic=True, tol=1e-12)


def test_a_user_graph_equals_the_builder_it_copies() -> None:
    built = topologies.dumbbell(8)
    copied = graph_from_edges(8, np.asarray(list(built.edges())))
    for weights in topologies.WEIGHT_SCHEMES:
        np.testing.assert_array_equal(
            mixing_matrix(copied, weights).toarray(), mixing_matrix(built, weights).toarray()
        )


def test_lazy_metropolis_is_half_identity_half_metropolis() -> None:
    graph = graph_from_edges(6, parse_edge_list(RING_WITH_LEAVES))
    lazy = mixing_matrix(graph, "lazy-metropolis").toarray()
    metropolis = mixing_matrix(graph, "metropolis").toarray()
    np.testing.assert_allclose(lazy, (np.eye(6) + metropolis) / 2, atol=1e-15)
    np.testing.assert_array_equal(lazy, mixing_matrix(graph, "lazy").toarray())
    validate_mixing(lazy, symmetric=True, row_stochastic=True, column_stochastic=True)
    assert np.diag(lazy).min() >= 0.5  # every node keeps at least half
    # ring nodes have degree 3: W_ij = 1 / (1 + 3) for every edge, halved
    assert lazy[0, 1] == pytest.approx(1 / 8) and lazy[0, 3] == pytest.approx(1 / 8)
    eigenvalues = np.linalg.eigvalsh(lazy)
    assert eigenvalues.min() >= -1e-12  # lazy: a non-negative spectrum


def test_lazy_metropolis_refuses_a_directed_graph() -> None:
    directed = nx.DiGraph([(0, 1), (1, 2), (2, 0)])
    with pytest.raises(TopologyError, match="'lazy-metropolis' needs an undirected graph") as info:
        mixing_matrix(directed, "lazy-metropolis")
    assert info.value.parameter == "weights"
