"""Graph builders: who may talk to whom.

Every builder returns a networkx graph on the nodes ``0 .. n-1`` (inserted in that order).
Undirected builders return :class:`networkx.Graph`; the static exponential graph of Ying et
al. (2021) is directed and returns :class:`networkx.DiGraph` where an edge ``u -> v`` means
"u sends to v". Random builders take an explicit ``seed`` and retry (from the same seeded
stream) until the graph is connected, so the same seed always gives the same graph.

Bad input raises :class:`~topologies.errors.TopologyError` naming the parameter and the
allowed values.
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from topologies.errors import TopologyError

if TYPE_CHECKING:  # networkx is imported where a graph is built (``import topologies`` stays light)
    import networkx as nx

#: How many seeded draws a random builder makes before giving up on connectivity.
CONNECT_TRIES = 200


def _integer(parameter: str, value: object) -> int:
    if isinstance(value, bool):
        raise TopologyError(parameter, f"{parameter} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TopologyError(parameter, f"{parameter} must be an integer, got {value!r}") from None


def _nodes(n: object, minimum: int = 2) -> int:
    count = _integer("n", n)
    if count < minimum:
        raise TopologyError(
            "n", f"n={count} is too small: this topology needs n >= {minimum} nodes"
        )
    return count


def _probability(parameter: str, p: object, *, allow_zero: bool) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating, np.integer)):
        raise TopologyError(parameter, f"{parameter} must be a number in [0, 1], got {p!r}")
    value = float(p)
    low_ok = value >= 0.0 if allow_zero else value > 0.0
    if not (low_ok and value <= 1.0):
        allowed = "[0, 1]" if allow_zero else "(0, 1]"
        raise TopologyError(parameter, f"{parameter}={value} is out of range: allowed {allowed}")
    return value


def _seed(seed: object) -> int:
    value = _integer("seed", seed)
    if value < 0:
        raise TopologyError("seed", f"seed={value} must be a non-negative integer")
    return value


def _from_edges(n: int, edges: np.ndarray, *, directed: bool = False) -> nx.Graph:
    """Graph on nodes 0..n-1 (in order) from an [m, 2] integer edge array; self-loops dropped."""
    import networkx as nx

    graph: nx.Graph = nx.DiGraph() if directed else nx.Graph()
    graph.add_nodes_from(range(n))
    edges = edges[edges[:, 0] != edges[:, 1]]
    graph.add_edges_from(edges.tolist())
    return graph


def _ordered(graph: nx.Graph) -> nx.Graph:
    """Copy of ``graph`` whose nodes are inserted in the order 0..n-1."""
    ordered: nx.Graph = graph.__class__()
    ordered.add_nodes_from(range(graph.number_of_nodes()))
    ordered.add_edges_from(graph.edges())
    return ordered


def _exponential_offsets(n: int) -> np.ndarray:
    """The offsets 2^k for k < ceil(log2 n): all distinct and in 1..n-1."""
    return 2 ** np.arange(max(1, math.ceil(math.log2(n))), dtype=np.int64)


def ring(n: int) -> nx.Graph:
    """Cycle 0 - 1 - ... - (n-1) - 0; degree 2 (n = 2: a single edge).

    ::

        0 - 1 - 2
        |       |
        5 - 4 - 3
    """
    import networkx as nx

    return nx.cycle_graph(_nodes(n))


def _near_square(n: int) -> tuple[int, int]:
    rows = math.isqrt(n)
    while n % rows:
        rows -= 1
    return rows, n // rows


def torus(n: int, rows: int | None = None, cols: int | None = None) -> nx.Graph:
    """2-D torus (grid with wrap-around), node ``r * cols + c`` at row r, column c; degree 4.

    ``n = rows * cols``; by default the near-square factorisation (rows the largest divisor of n
    at most sqrt(n)). Needs rows, cols >= 2 (a 2-wide side has degree 3, since both wrap-around
    neighbours coincide). ::

        0 - 1 - 2 -(0)
        |   |   |
        3 - 4 - 5 -(3)
        |   |   |
       (0) (1) (2)
    """
    count = _nodes(n, 4)
    if rows is None and cols is None:
        rows, cols = _near_square(count)
    elif rows is None:
        cols = _integer("cols", cols)
        if cols < 2 or count % cols:
            raise TopologyError("cols", f"cols={cols} must divide n={count} and be >= 2")
        rows = count // cols
    elif cols is None:
        rows = _integer("rows", rows)
        if rows < 2 or count % rows:
            raise TopologyError("rows", f"rows={rows} must divide n={count} and be >= 2")
        cols = count // rows
    else:
        rows, cols = _integer("rows", rows), _integer("cols", cols)
        if rows * cols != count:
            raise TopologyError("rows", f"rows * cols = {rows * cols} must equal n={count}")
    if rows < 2 or cols < 2:
        raise TopologyError(
            "n",
            f"torus needs n = rows * cols with rows, cols >= 2; n={count} has no such "
            "factorisation (it is prime): use ring",
        )
    node = np.arange(count, dtype=np.int64).reshape(rows, cols)
    right = np.stack([node.ravel(), np.roll(node, -1, axis=1).ravel()], axis=1)
    down = np.stack([node.ravel(), np.roll(node, -1, axis=0).ravel()], axis=1)
    return _from_edges(count, np.concatenate([right, down]))


def complete(n: int) -> nx.Graph:
    """Every pair connected; degree n - 1. One round of Metropolis weights is exact averaging."""
    import networkx as nx

    return nx.complete_graph(_nodes(n))


def star(n: int) -> nx.Graph:
    """Hub 0 joined to leaves 1..n-1; hub degree n - 1, leaf degree 1. ::

      1   2
       \\ /
    4 - 0 - 3
    """
    import networkx as nx

    return nx.star_graph(_nodes(n) - 1)


def hypercube(n: int) -> nx.Graph:
    """Hypercube of dimension log2 n: i ~ i XOR 2^k for k < log2 n; degree log2 n.

    n must be a power of two.
    """
    count = _nodes(n)
    if count & (count - 1):
        low = 1 << (count.bit_length() - 1)
        raise TopologyError(
            "n",
            f"hypercube needs n a power of two (2, 4, 8, 16, ...); got n={count} "
            f"(nearest: {low} or {2 * low})",
        )
    dimension = count.bit_length() - 1
    node = np.arange(count, dtype=np.int64)
    bits = np.int64(1) << np.arange(dimension, dtype=np.int64)
    partner = node[:, None] ^ bits[None, :]
    edges = np.stack([np.repeat(node, dimension), partner.ravel()], axis=1)
    return _from_edges(count, edges[edges[:, 0] < edges[:, 1]])


def _connected_draw(name: str, parameter: str, draw: Callable[[], nx.Graph], hint: str) -> nx.Graph:
    import networkx as nx

    for _ in range(CONNECT_TRIES):
        graph = draw()
        if nx.is_connected(graph):
            return _ordered(graph)
    raise TopologyError(
        parameter, f"{name}: no connected graph in {CONNECT_TRIES} seeded draws; {hint}"
    )


def random_regular(n: int, degree: int = 4, seed: int = 0) -> nx.Graph:
    """Uniformly random connected d-regular graph (every node has exactly ``degree`` neighbours).

    Needs 1 <= degree <= n - 1 and n * degree even; degree 1 is connected only for n = 2.
    """
    import networkx as nx

    count = _nodes(n)
    d = _integer("degree", degree)
    if not 1 <= d <= count - 1 or (count * d) % 2:
        raise TopologyError(
            "degree",
            f"degree={d} is impossible for n={count}: need 1 <= degree <= {count - 1} "
            "and n * degree even",
        )
    if d == 1 and count > 2:
        raise TopologyError(
            "degree", f"degree=1 gives a perfect matching, never connected for n={count} > 2"
        )
    rng = random.Random(_seed(seed))
    return _connected_draw(
        "random-regular",
        "degree",
        lambda: nx.random_regular_graph(d, count, seed=rng),
        "use a larger degree (2-regular graphs are unions of cycles)",
    )


def erdos_renyi(n: int, p: float | None = None, seed: int = 0) -> nx.Graph:
    """Erdős–Rényi G(n, p), redrawn until connected; default p = min(1, 2 ln(n) / n).

    The graph is connected with high probability when p > ln(n) / n (Erdős & Rényi, 1960).
    """
    import networkx as nx

    count = _nodes(n)
    prob = min(1.0, 2.0 * math.log(count) / count) if p is None else p
    prob = _probability("p", prob, allow_zero=False)
    rng = random.Random(_seed(seed))
    sampler = nx.fast_gnp_random_graph if prob < 0.2 else nx.gnp_random_graph
    return _connected_draw(
        "erdos-renyi",
        "p",
        lambda: sampler(count, prob, seed=rng),
        f"raise p above ln(n)/n = {math.log(count) / count:.4g}",
    )


def small_world(n: int, degree: int = 4, p: float = 0.1, seed: int = 0) -> nx.Graph:
    """Watts–Strogatz small world (Watts & Strogatz, 1998), redrawn until connected.

    Start from a ring lattice where each node links to its ``degree`` nearest nodes (degree even),
    then rewire each edge with probability ``p``. Mean degree stays ``degree``.
    """
    import networkx as nx

    count = _nodes(n, 3)
    d = _integer("degree", degree)
    if d < 2 or d >= count or d % 2:
        raise TopologyError(
            "degree",
            f"degree={d} is impossible for a small world on n={count}: need an even degree "
            f"with 2 <= degree <= {count - 1}",
        )
    prob = _probability("p", p, allow_zero=True)
    rng = random.Random(_seed(seed))
    return _connected_draw(
        "small-world",
        "p",
        lambda: nx.watts_strogatz_graph(count, d, prob, seed=rng),
        "lower p",
    )


def exponential(n: int) -> nx.DiGraph:
    """Static exponential graph (Ying et al., 2021, "Exponential graph is provably efficient for
    decentralized deep training"): directed, node i sends to i + 2^k mod n for k < ceil(log2 n).

    Out- and in-degree ceil(log2 n). Its mixing weights are uniform, 1 / (1 + ceil(log2 n)),
    both row- and column-stochastic; for n a power of two the spectral gap is 2 / (1 + log2 n).
    """
    count = _nodes(n)
    node = np.arange(count, dtype=np.int64)
    offsets = _exponential_offsets(count)
    edges = np.stack(
        [np.repeat(node, offsets.size), ((node[:, None] + offsets[None, :]) % count).ravel()],
        axis=1,
    )
    return _from_edges(count, edges, directed=True)


def exponential_undirected(n: int) -> nx.Graph:
    """Undirected static exponential graph: i ~ i ± 2^k mod n for k < ceil(log2 n).

    Degree at most 2 ceil(log2 n) (2 log2 n - 1 for n a power of two, where +n/2 = -n/2).
    """
    import networkx as nx

    directed = exponential(n)
    return nx.Graph(directed)


def dumbbell(n: int) -> nx.Graph:
    """Two cliques (of floor(n/2) and ceil(n/2) >= 3 nodes, so n >= 6) joined by a single edge.

    The bottleneck edge makes consensus slow: the textbook bad case for gossip. ::

        0 - 1         4 - 5
        | X | - ... - | X |
        2 - 3         6 - 7
    """
    import networkx as nx

    count = _nodes(n, 6)
    half = count // 2
    graph = nx.complete_graph(half)
    graph.add_nodes_from(range(half, count))
    right = nx.complete_graph(range(half, count))
    graph.add_edges_from(right.edges())
    graph.add_edge(half - 1, half)
    return graph


def from_graph(graph: nx.Graph) -> nx.Graph:
    """Validate a user-supplied graph and return a copy with nodes inserted in order 0..n-1.

    Requirements: a :class:`networkx.Graph` or :class:`networkx.DiGraph` (not a multigraph), at
    least 2 nodes labelled exactly 0..n-1 (relabel with
    :func:`networkx.convert_node_labels_to_integers`), no self-loops (self weights are implicit),
    and connected (strongly connected when directed).
    """
    import networkx as nx

    if not isinstance(graph, nx.Graph) or graph.is_multigraph():
        raise TopologyError(
            "graph",
            f"graph must be a networkx Graph or DiGraph (not a multigraph), got {type(graph).__name__}",
        )
    count = graph.number_of_nodes()
    if count < 2:
        raise TopologyError("graph", f"graph has {count} node(s); a topology needs n >= 2 nodes")
    nodes = set(graph.nodes())
    if nodes != set(range(count)):
        stray = sorted(map(repr, nodes - set(range(count))))[:5]
        raise TopologyError(
            "graph",
            f"graph nodes must be the integers 0..{count - 1}; found {', '.join(stray)} "
            "(relabel with networkx.convert_node_labels_to_integers)",
        )
    loops = sorted(nx.nodes_with_selfloops(graph))
    if loops:
        raise TopologyError(
            "graph",
            f"graph has self-loops at nodes {loops[:5]}; self weights are implicit, remove them",
        )
    if graph.is_directed():
        if not nx.is_strongly_connected(graph):
            parts = nx.number_strongly_connected_components(graph)
            raise TopologyError(
                "graph", f"directed graph must be strongly connected; it has {parts} components"
            )
    elif not nx.is_connected(graph):
        parts = nx.number_connected_components(graph)
        raise TopologyError("graph", f"graph must be connected; it has {parts} components")
    return _ordered(graph)
