"""The k largest scores of each row, exactly, without sorting or copying the row.

**The definition** both sparsifiers share: keep the k coordinates of largest score (top-k:
``|x_i|``, a NaN ranking as +inf; rand-k: a U[0, 1) key per coordinate), ties broken
towards the lower index, and list them in increasing index order. ``torch.topk`` leaves the
order of ties unspecified; this makes them part of the definition, so the simulator's
batched rows and a peer's vector select the same coordinates on any machine.

**How.** :func:`exact_largest` computes it for a whole score matrix: the k-th largest value
of each row, every score above it, and the first ties in index order; the positions come
out of ``nonzero`` already in increasing order (no sort). On the CPU it runs in numpy,
whose introselect (``np.partition``) and comparisons are an order of magnitude faster than
``torch.kthvalue``/``torch.topk`` and torch's bool kernels there; elsewhere in torch.
:func:`largest_above` does the same for one long row without materializing it: ``fill``
writes the row's scores one slab at a time into a reused workspace, and only the
candidates that reach a ``threshold`` are kept (from a sample for top-k, from the keys'
known distribution for rand-k, chosen so that fewer than k reach it with negligible
probability). Every score below the threshold is below at least k candidates, so the k
largest of the candidates are the k largest of the row: the same answer, in a few passes
over the row and a selection among ``k (1 + o(1))`` candidates. Scores equal to the
threshold are kept apart, the first k only: a row with many equal scores (a delta that is
mostly zeros) costs no array of all their positions. When fewer than k reach
the threshold it returns None and the caller runs :func:`largest_in_row`, which
materializes the row once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from gossip.compression import slabs as layout
from gossip.compression.slabs import slabs

__all__ = [
    "exact_largest",
    "largest_above",
    "largest_in_row",
    "margin_count",
]


def exact_largest(scores: Tensor, k: int) -> Tensor:
    """Positions ``[g, k]`` (int64), increasing, of the k largest of each row of
    ``scores [g, m]`` (no NaN), ties to the lower position. ``1 <= k``; ``k >= m`` keeps
    every position."""
    g, m = scores.shape
    if k >= m:
        return torch.arange(m, device=scores.device).repeat(g, 1)
    if scores.device.type == "cpu":
        return torch.from_numpy(_largest_numpy(scores.numpy(), k))
    return _largest_torch(scores, k)


def _largest_numpy(scores: np.ndarray, k: int) -> np.ndarray:
    """:func:`exact_largest` in numpy, for ``k < m``."""
    g, m = scores.shape
    if g == 1:
        return _largest_one_row(scores[0], k)[None]
    kth = np.partition(scores, m - k, axis=-1)[:, m - k, None]  # each row's k-th largest
    keep = scores > kth
    need = k - keep.sum(axis=-1)  # >= 1 per row: the k-th largest itself is a tie
    ties = np.flatnonzero(scores == kth)  # row by row, positions increasing (flat indices:
    rows = ties // m  # np.nonzero of a 2-D array is several times slower)
    counts = np.bincount(rows, minlength=g)
    first = np.cumsum(counts) - counts  # where each row's ties start
    rank = np.arange(ties.size) - first[rows]
    keep.reshape(-1)[ties[rank < need[rows]]] = True
    return (np.flatnonzero(keep) % m).reshape(g, k)


def _largest_one_row(scores: np.ndarray, k: int) -> np.ndarray:
    """One row: everything above the k-th largest, then its first ties (found slab by slab,
    so a row of equal scores costs no array of all their positions)."""
    m = scores.shape[0]
    kth = np.partition(scores, m - k)[m - k]
    above = np.flatnonzero(scores > kth)
    ties = _first_equal(scores, kth, k - above.shape[0])
    return np.sort(np.concatenate([above, ties]))


def _first_equal(scores: np.ndarray, value: float, count: int) -> np.ndarray:
    """The first ``count`` positions (increasing) where ``scores == value``."""
    found: list[np.ndarray] = []
    total = 0
    for start in range(0, scores.shape[0], layout.SLAB):
        if total >= count:
            break
        hits = np.flatnonzero(scores[start : start + layout.SLAB] == value)[: count - total]
        found.append(hits + start)
        total += hits.shape[0]
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


def _largest_torch(scores: Tensor, k: int) -> Tensor:
    """:func:`exact_largest` in torch (an accelerator's tensors), for ``k < m``."""
    g, m = scores.shape
    kth = torch.kthvalue(scores, m - k + 1, dim=-1, keepdim=True).values  # the k-th largest
    keep = scores > kth
    need = k - keep.sum(dim=-1)
    ties = (scores == kth).nonzero()  # [t, 2] (row, position), row by row
    row = ties[:, 0]
    counts = torch.bincount(row, minlength=g)
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(row.numel(), device=scores.device) - first[row]
    chosen = ties[rank < need[row]]
    keep[chosen[:, 0], chosen[:, 1]] = True
    return keep.nonzero()[:, 1].view(g, k)


def margin_count(expected: float) -> float:
    """A count that a Binomial (or, approximately, a sample's rank) of mean ``expected``
    falls short of with negligible probability: mean + 6 standard deviations + 16."""
    return expected + 6 * math.sqrt(expected) + 16


def largest_in_row(
    fill: Callable[[Tensor, int, int], Tensor],
    d: int,
    k: int,
    *,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Indices ``[k]``, increasing, of the k largest of one CPU row's d scores (the
    definition above), the row's scores materialized once: ``fill(out, 0, d)`` writes them
    (no NaN, of ``dtype``) into ``out`` and returns it."""
    scores = fill(torch.empty(d, dtype=dtype, device="cpu"), 0, d)
    return exact_largest(scores.unsqueeze(0), k)[0]


def largest_above(
    fill: Callable[[Tensor, int, int], Tensor],
    d: int,
    k: int,
    threshold: float,
    *,
    dtype: torch.dtype = torch.float32,
    size: int | None = None,
) -> Tensor | None:
    """What :func:`largest_in_row` gives, from the candidates that reach ``threshold`` only,
    or None when fewer than k reach it (a CPU row: the candidates are gathered in numpy).

    ``fill(out, start, stop)`` writes scores ``start:stop`` (no NaN, of ``dtype``) into
    ``out`` and returns it; it is called once per slab of ``size`` coordinates (default
    :data:`gossip.compression.slabs.SLAB`), in order, so it may draw the scores from a
    generator.
    """
    size = layout.SLAB if size is None else size
    workspace = torch.empty(min(d, size), dtype=dtype, device="cpu")
    positions: list[np.ndarray] = []  # scores above the threshold: every one may count
    values: list[np.ndarray] = []
    ties: list[np.ndarray] = []  # scores equal to it: only the first k may count
    tied = 0
    for slab in slabs(1, d, size=size):
        scores = fill(workspace[: slab.col_end - slab.col], slab.col, slab.col_end).numpy()
        hits = np.flatnonzero(scores > threshold)
        values.append(scores[hits])
        positions.append(hits + slab.col)
        if tied < k:
            equal = np.flatnonzero(scores == threshold)[: k - tied]
            ties.append(equal + slab.col)
            tied += equal.shape[0]
    above = np.concatenate(positions)
    if above.shape[0] >= k:
        best = exact_largest(torch.from_numpy(np.concatenate(values)[None]), k)[0]
        return torch.from_numpy(above[best.numpy()])
    if above.shape[0] + tied < k:
        return None
    # the threshold is the k-th largest score: all above it, then its first ties
    first_ties = np.concatenate(ties)[: k - above.shape[0]]
    return torch.from_numpy(np.sort(np.concatenate([above, first_ties])))
