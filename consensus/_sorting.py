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


def sort_rows_with_weights(values: Tensor, weights: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """Sort ``values [B, n, d]`` along n by (value, weight), carrying ``weights [B, n]``, in place.

    Returns the n sorted rows and their weights, each a list of [B, d]. Values
    must be finite or +inf (+inf is clamped to the largest finite value, so
    absent members still sort last and no inf - inf appears). A comparator
    decides with signs, s = sign(a - b) or, on a tie, sign(w_a - w_b), and
    exchanges the weights arithmetically (exactly), in place on three scratch rows; on
    a tie in both, the two members are interchangeable. So the order of the
    inputs never matters. ``values`` is overwritten (pass a tensor you own).
    """
    values.clamp_(max=torch.finfo(values.dtype).max)
    rows = list(values.unbind(1))
    carried = [w[:, None].expand_as(rows[0]).clone() for w in weights.to(values.dtype).unbind(1)]
    if len(rows) < 2:
        return rows, carried
    swap, other, scratch = (torch.empty_like(rows[0]) for _ in range(3))
    for i, j in odd_even_merge_network(len(rows)):
        low, high, w_low, w_high = rows[i], rows[j], carried[i], carried[j]
        torch.sub(low, high, out=swap).sign_()
        torch.sub(w_low, w_high, out=other).sign_()
        # swap = max(0, s + (1 - |s|) * sign(w_a - w_b)): 1 where (a, w_a) > (b, w_b)
        torch.abs(swap, out=scratch).neg_().add_(1.0).mul_(other)
        swap.add_(scratch).clamp_(min=0.0)
        # exchange the weights exactly: w - w s + w' s is w' or w to the last bit
        torch.mul(w_high, swap, out=other)
        torch.mul(w_low, swap, out=scratch)
        w_low.sub_(scratch).add_(other)
        w_high.sub_(other).add_(scratch)
        torch.minimum(low, high, out=scratch)
        torch.maximum(low, high, out=high)
        rows[i], scratch = scratch, low
    return rows, carried
