"""One-line facts about a topology: size, degrees, diameter, spectral gap, rounds to consensus."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from topologies.mixing import _edge_array, mixing_matrix
from topologies.spectral import contraction_factor, rounds_from_contraction

#: Breadth-first searches per batch when computing the diameter (bounds memory to batch x n).
_DIAMETER_BATCH = 256


def diameter(graph: nx.Graph) -> int:
    """Longest shortest path (hops, along edge directions for a DiGraph); inf-free graphs only.

    Runs scipy's C breadth-first search from every node in batches, so a 1,024-node graph takes
    milliseconds and memory stays at batch x n, never n x n.
    """
    n, senders, receivers = _edge_array(graph)
    adjacency = sp.csr_array(
        (np.ones(senders.size), (senders, receivers)), shape=(n, n), dtype=np.float64
    )
    directed = graph.is_directed()
    longest = 0.0
    for start in range(0, n, _DIAMETER_BATCH):
        rows = np.arange(start, min(n, start + _DIAMETER_BATCH))
        distances = shortest_path(adjacency, directed=directed, unweighted=True, indices=rows)
        longest = max(longest, float(distances.max()))
    if not np.isfinite(longest):
        raise ValueError("graph is not connected: its diameter is infinite")
    return int(longest)


@dataclass(frozen=True)
class TopologySummary:
    """What ``gossipnet topology`` prints."""

    topology: str
    directed: bool
    nodes: int
    edges: int
    min_degree: int
    max_degree: int
    diameter: int
    weights: str
    spectral_gap: float
    rounds_to_consensus: int | None
    factor: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def summarize(
    graph: nx.Graph, *, name: str, weights: str | None = None, factor: float = 1e-3
) -> TopologySummary:
    """Build W under ``weights`` (default: metropolis, or uniform when directed) and describe it.

    ``rounds_to_consensus`` is None when ||W - 11ᵀ/n||_2 >= 1 (no worst-case contraction).
    Degrees are out-degrees for a directed graph.
    """
    scheme = ("uniform" if graph.is_directed() else "metropolis") if weights is None else weights
    matrix = mixing_matrix(graph, scheme)
    rho = contraction_factor(matrix)
    rounds: int | None
    try:
        rounds = rounds_from_contraction(rho, factor)
    except ValueError:
        if not 0.0 < factor < 1.0:
            raise
        rounds = None
    degrees = np.fromiter(
        (d for _, d in (graph.out_degree() if graph.is_directed() else graph.degree())),
        dtype=np.int64,
        count=graph.number_of_nodes(),
    )
    return TopologySummary(
        topology=name,
        directed=graph.is_directed(),
        nodes=graph.number_of_nodes(),
        edges=graph.number_of_edges(),
        min_degree=int(degrees.min()),
        max_degree=int(degrees.max()),
        diameter=diameter(graph),
        weights=scheme,
        spectral_gap=1.0 - rho,
        rounds_to_consensus=rounds,
        factor=factor,
    )
