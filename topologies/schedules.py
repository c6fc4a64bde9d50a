"""Time-varying topologies: for round t, who talks to whom and with which weights.

Every schedule has ``n``, ``mixing(t) -> csr_array`` and ``neighbour_table(t) -> NeighbourTable``.
Random schedules derive round t's generator from ``(seed, t)`` alone, so any round can be
reproduced on its own, in any order, by any process (the simulator and every peer agree).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from topologies.errors import TopologyError
from topologies.graphs import _integer, _nodes, _seed
from topologies.neighbours import NeighbourTable, neighbour_table

if TYPE_CHECKING:  # scipy comes with the first matrix built (``import topologies`` stays light)
    import scipy.sparse as sp


@runtime_checkable
class Schedule(Protocol):
    """A (possibly time-varying) topology: round t's mixing matrix W_t and its neighbour table."""

    n: int

    def mixing(self, t: int) -> sp.csr_array: ...

    def neighbour_table(self, t: int) -> NeighbourTable: ...


def _round(t: object) -> int:
    value = _integer("t", t)
    if value < 0:
        raise TopologyError("t", f"round t={value} must be >= 0")
    return value


class Static:
    """The same mixing matrix W every round."""

    def __init__(self, matrix: sp.sparray | np.ndarray) -> None:
        import scipy.sparse as sp

        w = sp.csr_array(matrix, dtype=np.float64)
        if w.shape[0] != w.shape[1]:
            raise ValueError(f"matrix must be square, got shape {w.shape}")
        w.sort_indices()
        self.n = int(w.shape[0])
        self._matrix = w
        self._table = neighbour_table(w)

    def mixing(self, t: int) -> sp.csr_array:
        _round(t)
        return self._matrix

    def neighbour_table(self, t: int) -> NeighbourTable:
        _round(t)
        return self._table


class OnePeerExponential:
    """One-peer exponential graph (Ying et al., 2021): in round t node i averages with node
    i + 2^(t mod τ) mod n, τ = ceil(log2 n):

    W_t = (I + P^(2^(t mod τ))) / 2, P the cyclic shift (P x)_i = x_{i+1}.

    Each W_t is doubly stochastic with a single neighbour per node; for n a power of two the
    product of τ consecutive rounds is exact averaging 11ᵀ/n.
    """

    def __init__(self, n: int) -> None:
        self.n = _nodes(n)
        self.period = max(1, math.ceil(math.log2(self.n)))

    def offset(self, t: int) -> int:
        """The node i receives from i + offset(t) in round t."""
        return 1 << (_round(t) % self.period)

    def mixing(self, t: int) -> sp.csr_array:
        from topologies.mixing import assemble_matrix

        node = np.arange(self.n, dtype=np.int64)
        half = np.full(self.n, 0.5)
        return assemble_matrix(self.n, node, (node + self.offset(t)) % self.n, half, half)

    def neighbour_table(self, t: int) -> NeighbourTable:
        return neighbour_table(self.mixing(t), width=1)


class RandomMatching:
    """A uniformly random (near-)perfect matching per round; matched pairs average:
    W_t = I - sum_{(i,j) in M_t} (e_i - e_j)(e_i - e_j)ᵀ / 2 (Boyd et al., 2006).

    With n odd, one node per round sits out (W_ii = 1). Symmetric and doubly stochastic.
    """

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n = _nodes(n)
        self.seed = _seed(seed)

    def pairs(self, t: int) -> np.ndarray:
        """Round t's matching as an [floor(n/2), 2] array of node pairs."""
        order = np.random.default_rng([self.seed, _round(t)]).permutation(self.n)
        half = self.n // 2
        return np.stack([order[:half], order[half : 2 * half]], axis=1)

    def mixing(self, t: int) -> sp.csr_array:
        from topologies.mixing import assemble_matrix

        pairs = self.pairs(t)
        diagonal = np.ones(self.n)
        diagonal[pairs.ravel()] = 0.5
        half = np.full(2 * pairs.shape[0], 0.5)
        return assemble_matrix(
            self.n,
            np.concatenate([pairs[:, 0], pairs[:, 1]]),
            np.concatenate([pairs[:, 1], pairs[:, 0]]),
            half,
            diagonal,
        )

    def neighbour_table(self, t: int) -> NeighbourTable:
        return neighbour_table(self.mixing(t), width=1)


_KOUT_WEIGHTS = ("receiver-average", "push-sum")


class RandomKOut:
    """Random k-out peer sampling: in round t every node sends to k distinct peers drawn
    uniformly from the others.

    ``weights="receiver-average"`` (default; Epidemic Learning, de Vos et al., 2023): each node
    averages its own value with everything it received, x_j <- (x_j + sum_{i -> j} x_i) / (1 +
    in-degree_j), a row-stochastic W_t. ``weights="push-sum"``: each sender splits its value
    into k + 1 equal shares, W_t[j, i] = 1 / (k + 1) for j in out(i) ∪ {i}, column-stochastic
    (for push-sum, Kempe et al., 2003).
    """

    def __init__(self, n: int, k: int, seed: int = 0, *, weights: str = "receiver-average") -> None:
        self.n = _nodes(n)
        self.k = _integer("k", k)
        if not 1 <= self.k <= self.n - 1:
            raise TopologyError(
                "k",
                f"k={self.k} out-peers is impossible for n={self.n}: need 1 <= k <= {self.n - 1}",
            )
        if weights not in _KOUT_WEIGHTS:
            raise TopologyError(
                "weights", f"weights={weights!r} is not one of: {', '.join(_KOUT_WEIGHTS)}"
            )
        self.seed = _seed(seed)
        self.weights = weights

    def targets(self, t: int) -> np.ndarray:
        """[n, k] array: row i lists the k distinct peers node i sends to in round t."""
        rng = np.random.default_rng([self.seed, _round(t)])
        others = self.n - 1
        if 4 * self.k > self.n:
            # dense regime: the k smallest of n - 1 uniform keys per row (cost ~ the n·k output)
            picks = np.argpartition(rng.random((self.n, others)), self.k - 1, axis=1)[:, : self.k]
        else:
            # sparse regime: draw with replacement, redraw the (rare) rows with a repeat
            picks = rng.integers(0, others, size=(self.n, self.k))
            while True:
                ordered = np.sort(picks, axis=1)
                repeated = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
                if not repeated.any():
                    break
                picks[repeated] = rng.integers(0, others, size=(int(repeated.sum()), self.k))
        node = np.arange(self.n, dtype=np.int64)[:, None]
        return np.where(picks >= node, picks + 1, picks).astype(np.int64)

    def mixing(self, t: int) -> sp.csr_array:
        from topologies.mixing import assemble_matrix

        targets = self.targets(t)
        senders = np.repeat(np.arange(self.n, dtype=np.int64), self.k)
        receivers = targets.ravel()
        if self.weights == "push-sum":
            share = np.full(senders.size, 1.0 / (self.k + 1))
            return assemble_matrix(
                self.n, receivers, senders, share, np.full(self.n, 1.0 / (self.k + 1))
            )
        inverse = 1.0 / (1.0 + np.bincount(receivers, minlength=self.n))
        return assemble_matrix(self.n, receivers, senders, inverse[receivers], inverse)

    def neighbour_table(self, t: int) -> NeighbourTable:
        return neighbour_table(self.mixing(t))
