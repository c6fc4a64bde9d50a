"""Mixing every peer with its neighbours at once: gather, streaming, sparse product.

Plain gossip averaging is one sparse product ``X <- W X`` (:func:`sparse_mix`, with ``W``
from :func:`sparse_gossip_matrix`: the neighbour table, masks and self weights the rule
uses); other ``consensus`` rules read neighbours by gather, ``params[index] -> [k, d]`` per
receiver along a ``topologies.NeighbourTable`` (:func:`gather_rows`), streamed chunk by chunk
of receivers (:func:`rows_for_budget`) so that the ``[rows, k, d]`` gather stays in cache;
Byzantine messages enter each chunk's inbox as it is gathered (``inject``), so a round with
Byzantine peers streams too. :func:`gather_mix` chooses. The cost is O(n * k * d), never a
dense n x n product, and the memory one ``[rows, k, d]`` chunk beyond the result.

The sparse gossip matrix is built here, not beside the other matrices in ``topologies``:
it is a torch tensor on the run's device, and ``topologies`` depends on numpy, scipy and
networkx only (it never imports torch).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from consensus.base import Rule
from consensus.mean import WeightedMean, weighted_mean
from gossip.algorithms import NeighbourTableLike


class AggregatorLike(Protocol):
    """The ``consensus.Aggregator`` protocol (vector convention, batched over nodes)."""

    def __call__(
        self, own: Tensor, neighbours: Tensor, weights: Tensor, mask: Tensor | None = None
    ) -> Tensor: ...


Injection = Callable[[slice, Tensor], Tensor]
"""``(receivers, inbox [rows, k, d]) -> inbox``: what :func:`gather_mix` lets a runner put in
a chunk of receivers' inboxes before the rule reads them (Byzantine senders' messages)."""


def _on(values: Any, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A table's column (numpy from ``topologies``, or a tensor already on some device, as a
    runner's per-round table is) as a tensor of ``dtype`` on ``device``."""
    if isinstance(values, Tensor):
        return values.to(device=device, dtype=dtype)
    return torch.as_tensor(np.asarray(values), dtype=dtype, device=device)


def gather_mix(
    values: Tensor,
    table: NeighbourTableLike,
    aggregator: AggregatorLike,
    *,
    sent: Tensor | None = None,
    alive: Tensor | None = None,
    chunk_rows: int | None = None,
    out: Tensor | None = None,
    inject: Injection | None = None,
) -> Tensor:
    """Every peer i mixes ``own = values[i]`` with what its neighbours sent:
    ``x_i <- rule(x_i, {sent_j : j ∈ N(i)}, W_i·)``.

    Plain averaging (``consensus.WeightedMean``) of the peers' own vectors runs as one sparse
    product (:func:`sparse_mix`); other rules, or messages that differ from the senders'
    vectors (Byzantine peers, compression), gather the neighbours' rows.

    Args:
        values: each peer's own vector ``[n, d]``.
        table: who receives from whom, with the off-diagonal weights.
        aggregator: a ``consensus`` rule (``mean`` is plain gossip averaging).
        sent: what each peer sends ``[n, d]`` (default ``values``); Byzantine peers' rows differ.
        alive: ``[n]`` bool; a dead sender's entries are masked out (its weight folds into
            the receiver's self weight) and a dead receiver keeps its own vector.
        chunk_rows: mix this many receivers at a time to bound the ``[rows, k, d]`` gather;
            only for stateless rules (a rule that overrides ``reset()`` keeps batched state
            and is called once on all rows).
        out: an ``[n, d]`` buffer (not ``values`` or ``sent``) for the chunked result, reused
            between rounds so that no fresh ``[n, d]`` pages are faulted in every round.
        inject: ``(receivers, inbox) -> inbox``, called on each chunk's gathered inbox
            ``[rows, k, d]`` (``receivers`` the chunk's slice of rows) before the rule reads
            it: Byzantine senders' slots replaced (``consensus.byzantine_messages`` with
            ``receivers``), one chunk at a time like the honest inboxes. It may return a new
            tensor; the sparse product is skipped.
    """
    sent = values if sent is None else sent
    device = values.device
    index = _on(table.index, torch.long, device)
    weight = _on(table.weight, values.dtype, device)
    mask = _on(table.mask, torch.bool, device)
    n = values.shape[0]
    if index.shape[0] != n:
        raise ValueError(f"table: has {index.shape[0]} rows but there are {n} peers")
    if alive is not None:
        mask = mask & alive[index]
    if out is not None and (
        out.shape != values.shape or out.data_ptr() in (values.data_ptr(), sent.data_ptr())
    ):
        raise ValueError(
            f"out: must be a separate buffer of shape {tuple(values.shape)}, got {tuple(out.shape)}"
        )
    if type(aggregator) is WeightedMean and sent is values and inject is None:
        # plain gossip averaging of the peers' own vectors is one sparse product
        product = sparse_mix(values, index, weight, mask, alive=alive, out=out)
        if product is not None:
            return product
    stateful = keeps_state(aggregator)
    if chunk_rows is None or stateful or chunk_rows >= n:
        received = gather_rows(sent, index)
        if inject is not None:
            received = inject(slice(0, n), received)
        mixed = aggregator(values, received, weight, mask)
    else:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows: must be >= 1, got {chunk_rows}")
        mixed = torch.empty_like(values) if out is None else out
        # one gather buffer for every chunk: no fresh pages per chunk
        linear = type(aggregator) is WeightedMean and mixed.is_contiguous()
        scratch = sent.new_empty(chunk_rows * index.shape[1], sent.shape[1])
        for start in range(0, n, chunk_rows):
            rows = slice(start, min(start + chunk_rows, n))
            received = gather_rows(sent, index[rows], out=scratch)
            if inject is not None:
                received = inject(rows, received)
            if linear:  # straight into the result rows: no temporary, no copy
                weighted_mean(values[rows], received, weight[rows], mask[rows], out=mixed[rows])
            else:
                mixed[rows] = aggregator(values[rows], received, weight[rows], mask[rows])
    if alive is not None:
        mixed = torch.where(alive.unsqueeze(1), mixed, values)
    if out is not None and mixed is not out:
        out.copy_(mixed)
        return out
    return mixed


def sparse_gossip_matrix(
    index: Tensor, weight: Tensor, mask: Tensor, *, alive: Tensor | None = None
) -> Tensor:
    """The sparse ``[n, n]`` gossip matrix (CSR) of a neighbour table: ``W_ij`` at the
    neighbours a receiver hears from (``mask``), the self weight ``w_ii = 1 − Σ_j W_ij`` on
    the diagonal, so a masked neighbour's weight folds into the self weight as in
    :func:`consensus.weighted_mean`; a dead receiver (``alive`` False) gets the identity row.
    ``n · (k + 1)`` stored entries; a neighbour listed twice has its weights summed."""
    n, k = index.shape
    w = torch.where(mask, weight, 0.0)
    if alive is not None:
        w = torch.where(alive.unsqueeze(1), w, 0.0)
    self_weight = 1.0 - w.sum(dim=1)
    rows = torch.arange(n, device=index.device)
    coordinates = torch.stack(
        (torch.cat((rows, rows.repeat_interleave(k))), torch.cat((rows, index.reshape(-1))))
    )
    values = torch.cat((self_weight, w.reshape(-1)))
    matrix = torch.sparse_coo_tensor(
        coordinates, values, (n, n), check_invariants=True, device=values.device
    )
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return matrix.coalesce().to_sparse_csr()


def sparse_mix(
    values: Tensor,
    index: Tensor,
    weight: Tensor,
    mask: Tensor,
    *,
    alive: Tensor | None = None,
    out: Tensor | None = None,
) -> Tensor | None:
    """Gossip averaging of every peer at once as one sparse product, ``X <- W X`` with ``W``
    from :func:`sparse_gossip_matrix`: O(n · (k + 1) · d) work, one read of the neighbours' rows
    and one write of the result (into ``out`` when given), about half the memory traffic of a
    gather followed by a weighted sum.

    The product runs over blocks of receivers (rows of ``W``) whose result rows fill a few MiB,
    each block summed while it is still in cache: the finiteness check costs no second pass
    over ``[n, d]``, and each block reads its receivers' neighbours' whole rows (one streaming
    read per row, where column chunks of ``X`` would read ``n`` short strided pieces per chunk:
    2 to 3 times slower at n >= 1024). ``W`` and its row blocks are built once per distinct
    table (a static topology without losses reuses them every round; see
    :func:`cached_gossip_matrix`). A GPU takes the whole product in one call.

    Returns None where the exact :func:`consensus.weighted_mean` must run instead: a dtype
    torch's sparse product does not take, or a non-finite result (that rule masks a
    non-finite neighbour row and refuses a non-finite own vector, row by row).
    """
    if values.dim() != 2 or values.dtype not in (torch.float32, torch.float64):
        return None
    n, d = values.shape
    rows = (
        max(1, min(n, MIX_CHUNK_BYTES // max(1, d * values.element_size())))
        if values.device.type == "cpu"
        else n
    )
    blocks = _cache_entry(
        index, weight, mask, alive=alive, dtype=values.dtype, device=values.device
    ).row_blocks(rows)
    target = torch.empty_like(values) if out is None else out
    sums = values.new_empty(len(blocks))
    for number, (start, stop, block) in enumerate(blocks):
        part = target[start:stop]
        torch.addmm(part, block, values, beta=0, out=part)
        sums[number] = part.sum()
    # a NaN or Inf anywhere makes its block's sum non-finite; a finite sum proves the block
    # finite, and only an overflowing sum needs the exact elementwise check
    finite = bool(torch.isfinite(sums).all()) or bool(torch.isfinite(target).all())
    return target if finite else None


MIX_CHUNK_BYTES = 4 << 20
"""Bytes of result rows per block of :func:`sparse_mix` on the CPU (cache-sized); the result
does not depend on it."""
_MATRIX_CACHE_SIZE = 4


class _GossipMatrix:
    """A cached gossip matrix (CSR) and its row blocks, built on first use per block size."""

    def __init__(self, matrix: Tensor) -> None:
        self.matrix = matrix
        self.blocks: dict[int, list[tuple[int, int, Tensor]]] = {}

    def row_blocks(self, rows: int) -> list[tuple[int, int, Tensor]]:
        """``(start, stop, W[start:stop])`` covering every row, ``rows`` rows at a time."""
        blocks = self.blocks.get(rows)
        if blocks is not None:
            return blocks
        matrix = self.matrix
        n = matrix.shape[0]
        if rows >= n:
            blocks = [(0, n, matrix)]
        else:
            crow, column, value = (
                matrix.crow_indices(),
                matrix.col_indices(),
                matrix.values(),
            )
            offsets = crow.tolist()
            blocks = []
            with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
                warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
                for start in range(0, n, rows):
                    stop = min(start + rows, n)
                    first, last = offsets[start], offsets[stop]
                    block = torch.sparse_csr_tensor(
                        crow[start : stop + 1] - first,
                        column[first:last],
                        value[first:last],
                        (stop - start, matrix.shape[1]),
                        check_invariants=True,
                    )
                    blocks.append((start, stop, block))
        self.blocks[rows] = blocks
        return blocks


_matrix_cache: OrderedDict[tuple[object, ...], _GossipMatrix] = OrderedDict()
_matrix_cache_lock = threading.Lock()


def cached_gossip_matrix(
    index: Tensor,
    weight: Tensor,
    mask: Tensor,
    *,
    alive: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Tensor:
    """:func:`sparse_gossip_matrix` of the table, ``dtype`` and ``device``, reused while the
    same table comes again: the key is the tables' exact contents (n · k small entries), so a
    changed weight, mask or liveness builds a new matrix. The last few matrices are kept."""
    return _cache_entry(index, weight, mask, alive=alive, dtype=dtype, device=device).matrix


def _cache_entry(
    index: Tensor,
    weight: Tensor,
    mask: Tensor,
    *,
    alive: Tensor | None,
    dtype: torch.dtype,
    device: torch.device | str,
) -> _GossipMatrix:
    key = (
        str(torch.device(device)),
        dtype,
        tuple(index.shape),
        *(
            None if t is None else t.detach().cpu().contiguous().numpy().tobytes()
            for t in (index, weight.to(dtype), mask.to(torch.bool), alive)
        ),
    )
    with _matrix_cache_lock:
        entry = _matrix_cache.get(key)
        if entry is not None:
            _matrix_cache.move_to_end(key)
            return entry
    entry = _GossipMatrix(
        sparse_gossip_matrix(
            index.to(device),
            weight.to(device, dtype),
            mask.to(device),
            alive=None if alive is None else alive.to(device),
        )
    )
    with _matrix_cache_lock:
        _matrix_cache[key] = entry
        while len(_matrix_cache) > _MATRIX_CACHE_SIZE:
            _matrix_cache.popitem(last=False)
    return entry


def gather_rows(values: Tensor, index: Tensor, *, out: Tensor | None = None) -> Tensor:
    """``values[index]`` for ``values [n, *rest]`` and ``index [m, k]``: the ``[m, k, *rest]``
    rows each receiver reads, by ``torch.index_select`` (several times faster than advanced
    indexing on CPU), written into the front of ``out`` (at least ``m * k`` rows shaped like
    those of ``values``) when given, so that a buffer can be reused."""
    flat = index.reshape(-1)
    rest = tuple(values.shape[1:])
    if out is None:
        rows = torch.index_select(values, 0, flat)
    else:
        if out.shape[0] < flat.numel() or tuple(out.shape[1:]) != rest:
            raise ValueError(
                f"out: needs at least {flat.numel()} rows of shape {rest}, "
                f"got shape {tuple(out.shape)}"
            )
        rows = torch.index_select(values, 0, flat, out=out[: flat.numel()])
    return rows.view(*index.shape, *rest)


def keeps_state(aggregator: object) -> bool:
    """Whether a rule keeps batched state between calls: its ``stateful`` flag
    (``consensus.Rule.stateful``), else whether it overrides ``Rule.reset``."""
    flag = getattr(aggregator, "stateful", None)
    if isinstance(flag, bool):
        return flag
    reset = getattr(type(aggregator), "reset", None)
    return reset is not None and reset is not Rule.reset


def rows_for_budget(
    n: int, k: int, d: int, *, element_size: int = 4, budget_bytes: int = 1 << 23
) -> int:
    """How many receivers fit a ``[rows, k, d]`` gather in ``budget_bytes`` (default 8 MiB,
    about what stays in a CPU's last-level cache while the rule reads it back)."""
    per_row = max(k, 1) * d * element_size
    return max(1, min(n, budget_bytes // max(per_row, 1)))
