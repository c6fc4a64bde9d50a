"""Padded per-node neighbour lists: the form in which the simulator and the peer consume W."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse as sp

    from topologies.schedules import Schedule


@dataclass(frozen=True)
class NeighbourTable:
    """Row i of a mixing matrix W as padded arrays (k = the widest row, or a requested width).

    - ``index [n, k] int64``: the nodes j != i that node i receives from (W_ij != 0); padding
      entries point at i itself.
    - ``weight [n, k] float64``: W_ij for those entries, 0 at padding.
    - ``mask [n, k] bool``: True where an entry is a real neighbour.
    - ``self_weight [n] float64``: W_ii. For a row-stochastic W it equals
      1 - sum_j weight_ij (the convention the aggregators use); for a column-stochastic push-sum
      matrix the table still says exactly what node i receives, W_ii included.

    A gather ``x[index]`` of shape [n, k, d] with ``weight`` and ``mask`` is the vector
    convention ``own [n, d], neighbours [n, k, d], weights [n, k], mask [n, k]``.
    """

    index: np.ndarray
    weight: np.ndarray
    mask: np.ndarray
    self_weight: np.ndarray

    @property
    def n(self) -> int:
        """Number of nodes."""
        return int(self.index.shape[0])

    @property
    def width(self) -> int:
        """Padded number of neighbour slots per node (k)."""
        return int(self.index.shape[1])

    @property
    def degree(self) -> np.ndarray:
        """Number of real neighbours of each node, [n] int64."""
        return self.mask.sum(axis=1).astype(np.int64)

    def to_matrix(self) -> sp.csr_array:
        """Rebuild W as a csr_array: W_ij = weight at (i, slot of j), W_ii = self_weight_i."""
        import scipy.sparse as sp

        rows = np.broadcast_to(np.arange(self.n)[:, None], self.index.shape)[self.mask]
        node = np.arange(self.n)
        matrix = sp.coo_array(
            (
                np.concatenate([self.weight[self.mask], self.self_weight]),
                (np.concatenate([rows, node]), np.concatenate([self.index[self.mask], node])),
            ),
            shape=(self.n, self.n),
        ).tocsr()
        matrix.sum_duplicates()
        matrix.eliminate_zeros()
        matrix.sort_indices()
        return matrix


def neighbour_table(matrix: sp.sparray | np.ndarray, *, width: int | None = None) -> NeighbourTable:
    """Turn W into a :class:`NeighbourTable`: row i lists every j != i with W_ij != 0.

    ``width`` pads every row to that many slots (useful to keep one shape across the rounds of
    a time-varying schedule); it must be at least the widest row. Vectorized over the CSR arrays.
    """
    import scipy.sparse as sp  # here, not at the top: ``import topologies`` stays light

    w = sp.csr_array(matrix, dtype=np.float64)
    n = w.shape[0]
    if w.shape != (n, n):
        raise ValueError(f"mixing matrix must be square, got shape {w.shape}")
    w.sum_duplicates()
    w.sort_indices()
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(w.indptr))
    cols = w.indices.astype(np.int64)
    keep = (rows != cols) & (w.data != 0)
    rows, cols, data = rows[keep], cols[keep], w.data[keep]
    counts = np.bincount(rows, minlength=n)
    widest = int(counts.max()) if n else 0
    k = widest if width is None else width
    if k < widest:
        raise ValueError(
            f"width={width} is too small: row {int(counts.argmax())} has {widest} neighbours"
        )
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(rows.size, dtype=np.int64) - starts[rows]
    index = np.repeat(np.arange(n, dtype=np.int64)[:, None], k, axis=1)
    weight = np.zeros((n, k), dtype=np.float64)
    mask = np.zeros((n, k), dtype=bool)
    index[rows, slot] = cols
    weight[rows, slot] = data
    mask[rows, slot] = True
    return NeighbourTable(index=index, weight=weight, mask=mask, self_weight=w.diagonal().copy())


def smallest_neighbourhood(schedule: Schedule, t: int = 0) -> int:
    """min_i (1 + |in-neighbours of i in round t|): the fewest vectors any node aggregates.

    A node combines its own vector with every present entry of its row of
    ``schedule.neighbour_table(t)``, so this is the n a robust aggregation rule's size check
    ("own + neighbours") sees at the worst-placed node: 3 on a ring, 2 on a star (the leaves)
    or on one-peer exponential, n on the complete graph.
    """
    table = schedule.neighbour_table(t)
    if table.n == 0:
        raise ValueError("schedule has no nodes: a neighbourhood needs at least one")
    return 1 + int(table.degree.min())
