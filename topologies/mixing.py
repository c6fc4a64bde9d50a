"""Mixing matrices: how much of each neighbour's value a node keeps in one gossip round.

All matrices are ``scipy.sparse.csr_array`` [n, n] in the row convention
``x_i <- sum_j W_ij x_j`` (row i says what node i receives). They are built directly in
sparse form from the graph's edge array: no dense n x n intermediate, no per-edge Python loop.
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx
import numpy as np
import scipy.sparse as sp

from topologies.errors import MixingMatrixError, TopologyError

#: The weight schemes :func:`mixing_matrix` understands. ``lazy-metropolis`` is the spelled-out
#: name of (I + W_metropolis) / 2; ``lazy`` is the same matrix under its older, shorter name.
WEIGHT_SCHEMES = ("metropolis", "max-degree", "lazy-metropolis", "lazy", "uniform")


def _edge_array(graph: nx.Graph) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, senders, receivers) for every edge, self-loops dropped; checks nodes are 0..n-1."""
    n = graph.number_of_nodes()
    if set(graph.nodes()) != set(range(n)):
        raise TopologyError(
            "graph", f"graph nodes must be the integers 0..{n - 1} (see topologies.from_graph)"
        )
    edges = np.asarray(list(graph.edges()), dtype=np.int64).reshape(-1, 2)
    edges = edges[edges[:, 0] != edges[:, 1]]
    return n, edges[:, 0], edges[:, 1]


def assemble_matrix(
    n: int, receivers: np.ndarray, senders: np.ndarray, weights: np.ndarray, diagonal: np.ndarray
) -> sp.csr_array:
    """W with W[receivers, senders] = weights and diag(W) = diagonal, duplicates summed."""
    node = np.arange(n, dtype=np.int64)
    matrix = sp.coo_array(
        (
            np.concatenate([weights, diagonal]),
            (np.concatenate([receivers, node]), np.concatenate([senders, node])),
        ),
        shape=(n, n),
    ).tocsr()
    matrix.sum_duplicates()
    matrix.sort_indices()
    return matrix


EdgeWeight = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""(degrees [n], u [m], v [m]) -> the weight of each undirected edge u ~ v, [m]."""


def _symmetric_weights(graph: nx.Graph, scheme: str, edge_weight: EdgeWeight) -> sp.csr_array:
    if graph.is_directed():
        raise TopologyError(
            "weights",
            f"weights={scheme!r} needs an undirected graph; a directed graph takes "
            "weights='uniform' (column-stochastic push-sum weights)",
        )
    n, u, v = _edge_array(graph)
    degree = np.bincount(np.concatenate([u, v]), minlength=n).astype(np.float64)
    w = edge_weight(degree, u, v)
    off_diagonal = np.bincount(u, w, minlength=n) + np.bincount(v, w, minlength=n)
    return assemble_matrix(
        n,
        np.concatenate([u, v]),
        np.concatenate([v, u]),
        np.concatenate([w, w]),
        1.0 - off_diagonal,
    )


def metropolis_hastings(graph: nx.Graph) -> sp.csr_array:
    """Metropolis–Hastings weights (Xiao, Boyd & Lall, 2005, "A scheme for robust distributed
    sensor fusion based on average consensus"):

    W_ij = 1 / (1 + max(d_i, d_j)) for each edge ij, W_ii = 1 - sum_{j != i} W_ij.

    Symmetric and doubly stochastic for any undirected graph, using only neighbours' degrees.
    """
    return _symmetric_weights(
        graph, "metropolis", lambda d, u, v: 1.0 / (1.0 + np.maximum(d[u], d[v]))
    )


def max_degree(graph: nx.Graph) -> sp.csr_array:
    """Uniform maximum-degree weights (Xiao & Boyd, 2004, "Fast linear iterations for distributed
    averaging"): W_ij = 1 / (1 + Δ) for each edge ij with Δ the maximum degree,
    W_ii = 1 - d_i / (1 + Δ) > 0. Symmetric and doubly stochastic.
    """

    def weight(d: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return np.full(u.shape, 1.0 / (1.0 + (d.max() if d.size else 0.0)))

    return _symmetric_weights(graph, "max-degree", weight)


def uniform(graph: nx.Graph) -> sp.csr_array:
    """Uniform push weights for push-sum (Kempe, Dobra & Gehrke, 2003): every node splits its
    value equally among itself and the nodes it sends to,

    W_ji = 1 / (1 + d_out(i)) for each edge i -> j and for j = i.

    Column-stochastic for any graph (directed or not); also row-stochastic when in-degrees equal
    out-degrees and all degrees are equal (e.g. the exponential graph: 1 / (1 + ceil(log2 n))).
    """
    n, senders, receivers = _edge_array(graph)
    if not graph.is_directed():
        senders, receivers = (
            np.concatenate([senders, receivers]),
            np.concatenate([receivers, senders]),
        )
    share = 1.0 / (1.0 + np.bincount(senders, minlength=n).astype(np.float64))
    return assemble_matrix(n, receivers, senders, share[senders], share)


def lazy(matrix: sp.sparray) -> sp.csr_array:
    """Lazy version of a mixing matrix: W' = (I + W) / 2 (keeps half, mixes half).

    Its eigenvalues (1 + λ) / 2 are non-negative for symmetric W, which removes the
    oscillation of bipartite graphs at the price of a gap roughly halved.
    """
    matrix = sp.csr_array(matrix, dtype=np.float64)
    n = matrix.shape[0]
    result = sp.csr_array((sp.eye_array(n, format="csr") + matrix) * 0.5)
    result.sort_indices()
    return result


def mixing_matrix(graph: nx.Graph, weights: str | None = None) -> sp.csr_array:
    """The mixing matrix of ``graph`` under a weight scheme.

    ``weights``: ``"metropolis"`` (:func:`metropolis_hastings`), ``"max-degree"``
    (:func:`max_degree`), ``"lazy-metropolis"`` or its short name ``"lazy"`` (lazy Metropolis
    weights (I + W_metropolis) / 2, :func:`lazy`: every node keeps at least half of its own
    value, the matrix He, Karimireddy & Jaggi 2022 normalize their malicious ring towards) or
    ``"uniform"`` (:func:`uniform`, column-stochastic push weights). Default: ``"metropolis"``
    for undirected graphs, ``"uniform"`` for directed ones (the only scheme a directed graph
    takes).

    >>> import topologies
    >>> mixing_matrix(topologies.ring(4), "lazy-metropolis").toarray()[0].round(4).tolist()
    [0.6667, 0.1667, 0.0, 0.1667]
    """
    scheme = ("uniform" if graph.is_directed() else "metropolis") if weights is None else weights
    if scheme == "metropolis":
        return metropolis_hastings(graph)
    if scheme == "max-degree":
        return max_degree(graph)
    if scheme in ("lazy-metropolis", "lazy"):
        if graph.is_directed():
            raise TopologyError(
                "weights",
                f"weights={scheme!r} needs an undirected graph; a directed graph takes 'uniform'",
            )
        return lazy(metropolis_hastings(graph))
    if scheme == "uniform":
        return uniform(graph)
    raise TopologyError(
        "weights", f"unknown weights {weights!r}; choose one of: {', '.join(WEIGHT_SCHEMES)}"
    )


def validate_mixing(
    matrix: sp.sparray | np.ndarray,
    *,
    symmetric: bool = False,
    row_stochastic: bool = True,
    column_stochastic: bool = False,
    nonnegative: bool = True,
    tol: float = 1e-9,
) -> None:
    """Check the properties asked for, within ``tol``; raise :class:`MixingMatrixError` naming
    the first offending row (its sum), column (its sum) or entry otherwise.
    """
    if not tol >= 0:
        raise ValueError(f"tol={tol} must be >= 0")
    w = sp.csr_array(matrix, dtype=np.float64)
    rows, cols = w.shape
    if rows != cols:
        raise MixingMatrixError(f"mixing matrix must be square, got shape {w.shape}")
    if not np.all(np.isfinite(w.data)):
        row = int(np.repeat(np.arange(rows), np.diff(w.indptr))[~np.isfinite(w.data)][0])
        raise MixingMatrixError(f"row {row} has a non-finite entry")
    if nonnegative and w.data.size and w.data.min() < -tol:
        coo = w.tocoo()
        k = int(np.argmin(coo.data))
        raise MixingMatrixError(
            f"entry ({int(coo.row[k])}, {int(coo.col[k])}) = {coo.data[k]:.6g} is negative"
        )
    for label, axis, wanted in (("row", 1, row_stochastic), ("column", 0, column_stochastic)):
        if not wanted:
            continue
        sums = np.asarray(w.sum(axis=axis)).ravel()
        bad = np.flatnonzero(np.abs(sums - 1.0) > tol)
        if bad.size:
            raise MixingMatrixError(
                f"{label} {int(bad[0])} sums to {sums[bad[0]]:.12g}, not 1 (tol {tol:g}); "
                f"{bad.size} {label}(s) off"
            )
    if symmetric:
        diff = sp.csr_array(w - w.T).tocoo()
        if diff.data.size and np.abs(diff.data).max() > tol:
            k = int(np.argmax(np.abs(diff.data)))
            i, j = int(diff.row[k]), int(diff.col[k])
            raise MixingMatrixError(
                f"not symmetric: row {i} has W[{i}, {j}] = {w[i, j]:.12g} but "
                f"W[{j}, {i}] = {w[j, i]:.12g}"
            )
