"""Small mixing matrices and padded neighbour tables built by hand with numpy (test helpers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gossip.algorithms import GossipAlgorithm, NeighbourTableLike


@dataclass(frozen=True)
class Table:
    index: Tensor
    weight: Tensor
    mask: Tensor
    self_weight: Tensor


def table_from_dense(w: np.ndarray) -> Table:
    """Row i lists every j != i with W_ij != 0, padded with i itself (mask False, weight 0)."""
    n = w.shape[0]
    rows = [[j for j in range(n) if j != i and w[i, j] != 0] for i in range(n)]
    k = max(1, max(len(r) for r in rows))
    index = np.tile(np.arange(n)[:, None], (1, k))
    weight = np.zeros((n, k))
    mask = np.zeros((n, k), dtype=bool)
    for i, r in enumerate(rows):
        index[i, : len(r)] = r
        weight[i, : len(r)] = w[i, r]
        mask[i, : len(r)] = True
    return Table(
        torch.as_tensor(index),
        torch.as_tensor(weight),
        torch.as_tensor(mask),
        torch.as_tensor(np.diag(w).copy()),
    )


def ring_metropolis(n: int) -> np.ndarray:
    """Ring with Metropolis-Hastings weights: 1/3 to each neighbour and to oneself."""
    w = np.zeros((n, n))
    for i in range(n):
        w[i, (i - 1) % n] = w[i, (i + 1) % n] = 1 / 3
        w[i, i] = 1 / 3
    return w


def complete_uniform(n: int) -> np.ndarray:
    return np.full((n, n), 1.0 / n)


def directed_exponential(n: int) -> np.ndarray:
    """Node j sends to j + 2^0, j + 2^1, ... (mod n); every node splits its mass uniformly
    over itself and its out-neighbours (column-stochastic; here also row-stochastic)."""
    offsets = [2**e for e in range(int(np.ceil(np.log2(n))))]
    p = np.zeros((n, n))
    for j in range(n):
        targets = [j] + [(j + o) % n for o in offsets]
        for i in targets:
            p[i, j] += 1.0 / len(targets)
    return p


def synchronous_exchange(
    algorithm: GossipAlgorithm[Any],
    state: Any,
    table: NeighbourTableLike,
    *,
    generator: torch.Generator | None = None,
    delivered: Tensor | None = None,
) -> int:
    """One synchronous exchange of all n nodes: message, compress, gather, combine (the
    reference driver these tests check rules with; the runners are sim.gossip_runner and
    peer, compared with each other in tests/parity).

    Args:
        algorithm, state: an algorithm and its batched state (leading dimension n).
        table: who receives whom: ``index [n, k]``, ``weight [n, k]``, ``mask [n, k]``,
            ``self_weight [n]``.
        generator: randomness of stochastic codecs.
        delivered: optional ``[n, k]`` bool, False for messages lost in transit (and-ed
            with ``table.mask``).
    Returns the bytes each node put on the wire (one payload per node, broadcast).
    """
    message = algorithm.message(state)
    n = message.shape[0]
    device = message.device
    index = torch.as_tensor(table.index, dtype=torch.int64, device=device)
    if index.dim() != 2 or index.shape[0] != n:
        raise ValueError(f"table.index must have shape [n={n}, k], got {tuple(index.shape)}")
    weights = torch.as_tensor(table.weight, dtype=message.dtype, device=device)
    mask = torch.as_tensor(table.mask, dtype=torch.bool, device=device)
    self_weight = torch.as_tensor(table.self_weight, dtype=message.dtype, device=device)
    if delivered is not None:
        mask = mask & torch.as_tensor(delivered, dtype=torch.bool, device=device)
    compressed = algorithm.compressor.compress(message, generator)
    sent = compressed.values
    algorithm.combine(state, sent, sent[index], weights, mask, self_weight)
    return compressed.wire_bytes
