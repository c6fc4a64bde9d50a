"""Seeded partitions of a training set across peers: IID, Dirichlet label skew, sorted-label shards.

Every partition returns ``list[Tensor]``: peer ``i``'s training indices
(int64, ascending). The lists are disjoint, cover ``0 .. N-1`` exactly, and
no peer is empty; when that is impossible the function raises ``ValueError``
naming the bound. Same seed, same partition. Internally each rule computes one
``owner[N]`` array and groups it with a single stable sort, so the cost is
O(N log N) with no Python loop over samples or peers.

Example::

    >>> import torch
    >>> from workloads import partition
    >>> labels = torch.arange(100) % 10
    >>> parts = partition("dirichlet:alpha=0.1", labels, num_peers=8, seed=0)
    >>> sum(len(p) for p in parts)
    100
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from workloads._registry import Entry, Param, lookup, parse_spec

__all__ = [
    "PARTITIONS",
    "dirichlet",
    "iid",
    "label_histogram",
    "partition",
    "shards",
]


def _labels_array(labels: torch.Tensor | np.ndarray, what: str) -> np.ndarray:
    array = labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise ValueError(f"{what}: labels must be a 1-D integer tensor, got shape {array.shape}")
    if array.size and array.min() < 0:
        raise ValueError(f"{what}: labels must be >= 0")
    return array.astype(np.int64, copy=False)


def _check_peers(what: str, num_samples: int, num_peers: int, per_peer: int = 1) -> None:
    if not isinstance(num_peers, int) or num_peers < 1:
        raise ValueError(f"{what}: num_peers must be an int >= 1, got {num_peers!r}")
    if num_samples < num_peers * per_peer:
        raise ValueError(
            f"{what}: {num_samples} samples cannot give {num_peers} peers "
            f"{per_peer} sample(s) each; need num_samples >= {num_peers * per_peer}"
        )


def _group(owner: np.ndarray, num_peers: int) -> list[torch.Tensor]:
    """Indices grouped by owner, ascending within each peer: one stable argsort."""
    order = torch.from_numpy(np.argsort(owner, kind="stable").astype(np.int64))
    counts = np.bincount(owner, minlength=num_peers).tolist()
    return list(torch.split(order, counts))


def iid(labels: torch.Tensor, num_peers: int, seed: int = 0) -> list[torch.Tensor]:
    """Uniformly random, equal-size (±1) shares: a seeded permutation cut into ``num_peers`` runs."""
    array = _labels_array(labels, "iid")
    _check_peers("iid", len(array), num_peers)
    rng = np.random.default_rng(seed)
    owner = np.empty(len(array), dtype=np.int64)
    owner[rng.permutation(len(array))] = np.arange(len(array)) * num_peers // len(array)
    return _group(owner, num_peers)


def dirichlet(
    labels: torch.Tensor, num_peers: int, alpha: float = 0.5, seed: int = 0
) -> list[torch.Tensor]:
    """Label skew of Hsu, Qi & Brown 2019 (https://arxiv.org/abs/1909.06335): p_c ~ Dir(alpha * 1_n).

    For each class c, a share p_c ~ Dirichlet(alpha, ..., alpha) over the peers
    splits that class's (shuffled) samples. Small alpha: each peer sees few
    classes; large alpha: close to IID. A peer left empty by the draw takes one
    sample from the currently largest peer, so every peer holds data whenever
    ``num_samples >= num_peers``.
    """
    if not alpha > 0:
        raise ValueError(f"dirichlet: alpha must be > 0, got {alpha}")
    array = _labels_array(labels, "dirichlet")
    _check_peers("dirichlet", len(array), num_peers)
    rng = np.random.default_rng(seed)
    owner = np.empty(len(array), dtype=np.int64)
    for label in np.unique(array):  # one draw per class (classes << samples)
        members = rng.permutation(np.flatnonzero(array == label))
        shares = rng.dirichlet(np.full(num_peers, alpha))
        cuts = np.floor(np.cumsum(shares) * len(members)).astype(np.int64)
        owner[members] = np.searchsorted(cuts, np.arange(len(members)), side="right")
    np.minimum(owner, num_peers - 1, out=owner)  # guard against cumsum rounding to < 1
    counts = np.bincount(owner, minlength=num_peers)
    for empty in np.flatnonzero(counts == 0):  # rare at sane sizes; bounded by num_peers
        donor = int(np.argmax(counts))
        victim = rng.choice(np.flatnonzero(owner == donor))
        owner[victim] = empty
        counts[donor] -= 1
        counts[empty] += 1
    return _group(owner, num_peers)


def shards(
    labels: torch.Tensor, num_peers: int, shards_per_peer: int = 2, seed: int = 0
) -> list[torch.Tensor]:
    """Sorted-label shards of McMahan et al. 2017 (https://arxiv.org/abs/1602.05629).

    Samples sorted by label (ties broken at random) are cut into
    ``num_peers * shards_per_peer`` equal (±1) shards; each peer receives
    ``shards_per_peer`` shards chosen at random, so it sees about that many classes.
    """
    if not isinstance(shards_per_peer, int) or shards_per_peer < 1:
        raise ValueError(f"shards: shards_per_peer must be an int >= 1, got {shards_per_peer!r}")
    array = _labels_array(labels, "shards")
    _check_peers("shards", len(array), num_peers, shards_per_peer)
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(array))
    by_label = shuffled[np.argsort(array[shuffled], kind="stable")]
    num_shards = num_peers * shards_per_peer
    shard_of_position = np.arange(len(array)) * num_shards // len(array)
    peer_of_shard = np.empty(num_shards, dtype=np.int64)
    peer_of_shard[rng.permutation(num_shards)] = np.arange(num_shards) // shards_per_peer
    owner = np.empty(len(array), dtype=np.int64)
    owner[by_label] = peer_of_shard[shard_of_position]
    return _group(owner, num_peers)


PARTITIONS: dict[str, Entry[list[torch.Tensor]]] = {
    "iid": Entry("iid", iid, {}, "uniformly random equal shares"),
    "dirichlet": Entry(
        "dirichlet",
        dirichlet,
        {"alpha": Param(float, 0.5, "Dirichlet concentration; small = strong label skew")},
        "Dirichlet(alpha) label skew (Hsu et al. 2019)",
    ),
    "shards": Entry(
        "shards",
        shards,
        {"shards_per_peer": Param(int, 2, "sorted-label shards per peer")},
        "sorted-label shards (McMahan et al. 2017)",
    ),
}


def partition(
    spec: str, labels: torch.Tensor, num_peers: int, seed: int = 0, **params: Any
) -> list[torch.Tensor]:
    """Partition by spec string: ``"iid"``, ``"dirichlet:alpha=0.1"``, ``"shards:shards_per_peer=2"``."""
    name, given = parse_spec(spec, "partition")
    entry = lookup(PARTITIONS, name, "partition")
    resolved = entry.resolve({**given, **params})
    return entry.factory(labels, num_peers, seed=seed, **resolved)


def label_histogram(
    labels: torch.Tensor, parts: Sequence[torch.Tensor], num_classes: int
) -> torch.Tensor:
    """``[num_peers, num_classes]`` counts of each class on each peer (for skew diagnostics)."""
    peer = torch.repeat_interleave(
        torch.arange(len(parts)), torch.tensor([len(p) for p in parts], dtype=torch.int64)
    )
    flat = torch.cat(list(parts)) if parts else torch.empty(0, dtype=torch.int64)
    counts = torch.bincount(peer * num_classes + labels[flat], minlength=len(parts) * num_classes)
    return counts.reshape(len(parts), num_classes)
