"""Coordinate-wise sorting of a small set of long vectors with a sorting network.

``torch.sort`` along a short axis of n ~ 17 values for each of d ~ 10^6
coordinates spends its time on per-column bookkeeping. A sorting network
instead does O(n log^2 n) compare-exchange steps, each one elementwise
operation over whole [B, d] rows, so it runs at memory speed: the Python loop
is over the network's comparators (a fixed list for each n), never over
coordinates. Batcher, "Sorting networks and their applications" (AFIPS 1968),
odd-even merge sort, in the iterative form that works for any n.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor


@lru_cache(maxsize=64)
def odd_even_merge_network(n: int) -> tuple[tuple[int, int], ...]:
    """Comparators (i, j), i < j, of Batcher's odd-even merge sort for n inputs."""
    pairs = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return tuple(pairs)


def sort_rows(values: Tensor) -> list[Tensor]:
    """Sort ``values [B, n, d]`` ascending along n, in place; returns the n sorted [B, d] rows.

    Each comparator is one ``torch.minimum`` into a scratch row and one
    ``torch.maximum`` in place, so the whole sort allocates a single row.
    Equal values are interchangeable, so the result does not depend on the
    order of the inputs. ``values`` is overwritten (pass a tensor you own).
    """
    rows = list(values.unbind(1))
    if len(rows) < 2:
        return rows
    scratch = torch.empty_like(rows[0])
    for i, j in odd_even_merge_network(len(rows)):
        low, high = rows[i], rows[j]
        torch.minimum(low, high, out=scratch)
        torch.maximum(low, high, out=high)
        rows[i], scratch = scratch, low
    return rows
