"""Graph builders, user-supplied graphs and the name registry."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

import topologies
from topologies import TOPOLOGIES, TopologyError, build, from_graph


@pytest.mark.parametrize("name", list(TOPOLOGIES))
@pytest.mark.parametrize("n", [16, 64])
def test_every_builder_gives_a_valid_connected_graph_on_0_to_n_minus_1(name: str, n: int) -> None:
    graph = build(name, n)
    assert list(graph.nodes()) == list(range(n))
    assert nx.number_of_selfloops(graph) == 0
    assert graph.is_directed() == TOPOLOGIES[name].directed
    connected = nx.is_strongly_connected if graph.is_directed() else nx.is_connected
    assert connected(graph)
    assert nx.utils.graphs_equal(from_graph(graph), graph)


def test_ring_torus_complete_star_shapes() -> None:
    assert sorted(d for _, d in topologies.ring(9).degree()) == [2] * 9
    assert topologies.ring(2).number_of_edges() == 1
    torus = topologies.torus(20)  # near-square: 4 x 5
    assert {d for _, d in torus.degree()} == {4}
    assert torus.number_of_edges() == 40
    assert torus.has_edge(0, 4) and torus.has_edge(0, 15)  # wrap along a row and a column
    assert nx.is_isomorphic(torus, nx.grid_2d_graph(4, 5, periodic=True))
    thin = topologies.torus(8, rows=2)
    assert {d for _, d in thin.degree()} == {3}
    assert nx.utils.graphs_equal(topologies.torus(12, rows=3), topologies.torus(12, cols=4))
    assert topologies.complete(7).number_of_edges() == 21
    star = topologies.star(6)
    assert dict(star.degree()) == {0: 5, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}


@pytest.mark.parametrize("n", [2, 4, 32, 256])
def test_hypercube_is_the_log2_n_cube(n: int) -> None:
    graph = topologies.hypercube(n)
    dimension = int(math.log2(n))
    assert {d for _, d in graph.degree()} == {dimension}
    assert all(bin(u ^ v).count("1") == 1 for u, v in graph.edges())
    assert nx.is_isomorphic(graph, nx.hypercube_graph(dimension))


def test_random_builders_are_seeded_and_have_their_degrees() -> None:
    a = topologies.random_regular(40, 3, seed=5)
    assert nx.utils.graphs_equal(a, topologies.random_regular(40, 3, seed=5))
    assert not nx.utils.graphs_equal(a, topologies.random_regular(40, 3, seed=6))
    assert {d for _, d in a.degree()} == {3}
    er = topologies.erdos_renyi(50, 0.1, seed=2)
    assert nx.utils.graphs_equal(er, topologies.erdos_renyi(50, 0.1, seed=2))
    assert nx.is_connected(er)
    sw = topologies.small_world(30, 4, 0.2, seed=1)
    assert nx.utils.graphs_equal(sw, topologies.small_world(30, 4, 0.2, seed=1))
    assert sw.number_of_edges() == 60
    lattice = topologies.small_world(12, 4, 0.0)
    assert {d for _, d in lattice.degree()} == {4} and lattice.has_edge(0, 2)


def test_random_regular_degree_two_is_retried_until_connected() -> None:
    graph = topologies.random_regular(30, 2, seed=0)
    assert nx.is_connected(graph) and {d for _, d in graph.degree()} == {2}


@pytest.mark.parametrize("n", [2, 5, 8, 12, 64])
def test_exponential_sends_to_i_plus_powers_of_two(n: int) -> None:
    graph = topologies.exponential(n)
    tau = math.ceil(math.log2(n))
    expected = {(i, (i + 2**k) % n) for i in range(n) for k in range(tau)}
    assert set(graph.edges()) == expected
    assert {d for _, d in graph.out_degree()} == {tau}
    assert {d for _, d in graph.in_degree()} == {tau}


def test_exponential_undirected_degree() -> None:
    graph = topologies.exponential_undirected(64)
    assert {d for _, d in graph.degree()} == {2 * 6 - 1}
    assert set(map(frozenset, graph.edges())) == {
        frozenset(e) for e in topologies.exponential(64).edges()
    }


@pytest.mark.parametrize("n", [6, 9, 16])
def test_dumbbell_is_two_cliques_and_one_bridge(n: int) -> None:
    graph = topologies.dumbbell(n)
    a, b = n // 2, n - n // 2
    assert graph.number_of_edges() == a * (a - 1) // 2 + b * (b - 1) // 2 + 1
    assert nx.edge_connectivity(graph) == 1
    assert list(nx.bridges(graph)) == [(a - 1, a)]


@pytest.mark.parametrize(
    ("call", "parameter", "fragment"),
    [
        (lambda: topologies.ring(1), "n", "n >= 2"),
        (lambda: topologies.ring(2.5), "n", "integer"),  # type: ignore[arg-type]
        (lambda: topologies.ring(True), "n", "integer"),
        (lambda: topologies.hypercube(12), "n", "power of two"),
        (lambda: topologies.torus(13), "n", "prime"),
        (lambda: topologies.torus(12, rows=5), "rows", "divide"),
        (lambda: topologies.torus(12, rows=2, cols=3), "rows", "must equal n=12"),
        (lambda: topologies.random_regular(7, 3), "degree", "n * degree even"),
        (lambda: topologies.random_regular(8, 8), "degree", "1 <= degree <= 7"),
        (lambda: topologies.random_regular(8, 1), "degree", "never connected"),
        (lambda: topologies.erdos_renyi(10, 0.0), "p", "(0, 1]"),
        (lambda: topologies.erdos_renyi(10, 1.5), "p", "(0, 1]"),
        (lambda: topologies.erdos_renyi(200, 0.001), "p", "raise p above"),
        (lambda: topologies.small_world(10, 3), "degree", "even degree"),
        (lambda: topologies.small_world(10, 4, p=-0.1), "p", "[0, 1]"),
        (lambda: topologies.random_regular(10, 4, seed=-1), "seed", "non-negative"),
        (lambda: topologies.dumbbell(5), "n", "n >= 6"),
    ],
)
def test_bad_parameters_raise_naming_the_parameter(
    call: object, parameter: str, fragment: str
) -> None:
    with pytest.raises(TopologyError) as info:
        call()  # type: ignore[operator]
    assert info.value.parameter == parameter
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_from_graph_rejects_bad_graphs_with_a_reason() -> None:
    disconnected = nx.Graph([(0, 1), (2, 3)])
    with pytest.raises(TopologyError, match="connected; it has 2 components"):
        from_graph(disconnected)
    with pytest.raises(TopologyError, match=r"integers 0\.\.2.*'a'"):
        from_graph(nx.Graph([(0, 1), (1, "a")]))
    with pytest.raises(TopologyError, match="self-loops at nodes \\[1\\]"):
        from_graph(nx.Graph([(0, 1), (1, 1)]))
    with pytest.raises(TopologyError, match="multigraph"):
        from_graph(nx.MultiGraph([(0, 1)]))
    with pytest.raises(TopologyError, match="strongly connected"):
        from_graph(nx.DiGraph([(0, 1), (1, 2)]))
    with pytest.raises(TopologyError, match="n >= 2"):
        from_graph(nx.empty_graph(1))
    with pytest.raises(TopologyError, match="networkx Graph"):
        from_graph([(0, 1)])  # type: ignore[arg-type]


def test_from_graph_orders_nodes_and_keeps_edges() -> None:
    graph = nx.Graph()
    graph.add_edges_from([(2, 0), (0, 1), (1, 2), (3, 2)])
    checked = from_graph(graph)
    assert list(checked.nodes()) == [0, 1, 2, 3]
    assert set(map(frozenset, checked.edges())) == set(map(frozenset, graph.edges()))
    cycle = from_graph(nx.DiGraph([(0, 1), (1, 2), (2, 0)]))
    assert cycle.is_directed() and set(cycle.edges()) == {(0, 1), (1, 2), (2, 0)}


def test_registry_build_names_parameters_and_errors() -> None:
    assert set(TOPOLOGIES) == {
        "ring",
        "torus",
        "complete",
        "star",
        "hypercube",
        "random-regular",
        "erdos-renyi",
        "small-world",
        "exponential",
        "exponential-undirected",
        "dumbbell",
    }
    assert dict(TOPOLOGIES["small-world"].params) == {"degree": 4, "p": 0.1, "seed": 0}
    assert nx.utils.graphs_equal(
        build("random_regular", 20, degree=3, seed=4), topologies.random_regular(20, 3, seed=4)
    )
    with pytest.raises(TopologyError, match="unknown topology 'mesh'; choose one of: ring, torus"):
        build("mesh", 8)
    with pytest.raises(
        TopologyError, match="ring takes no parameter 'degree'; its parameters: none"
    ):
        build("ring", 8, degree=3)


def test_erdos_renyi_default_p_gives_mean_degree_near_two_log_n() -> None:
    n = 400
    graph = topologies.erdos_renyi(n, seed=3)
    mean_degree = 2 * graph.number_of_edges() / n
    assert abs(mean_degree - 2 * np.log(n)) < 0.15 * 2 * np.log(n)
