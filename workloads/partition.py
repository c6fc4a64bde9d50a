"""Seeded partitions of a training set across peers: IID, Dirichlet label skew, sorted-label
shards, and explicit label sets (peer i holds only the classes it is given).

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

import operator
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from workloads._registry import REQUIRED, Entry, Param, lookup, parse_spec

__all__ = [
    "LABEL_FREE",
    "PARTITIONS",
    "check_partition_spec",
    "contiguous",
    "dirichlet",
    "iid",
    "label_histogram",
    "label_sets",
    "label_sets_from_spec",
    "parse_id_set",
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


def contiguous(labels: torch.Tensor, num_peers: int, seed: int = 0) -> list[torch.Tensor]:
    """Equal-size (±1) runs of consecutive samples, in the data set's own order: peer p holds
    samples ``[p N / n, (p + 1) N / n)``. On the text data set, whose samples follow its files,
    each peer holds its own files (documents), the non-iid split of a language model, where a
    split by class has no classes to go by; on a data set stored shuffled it is close to iid.
    Needs no labels; ``seed`` is not used (the split is the order's)."""
    array = _labels_array(labels, "contiguous")
    _check_peers("contiguous", len(array), num_peers)
    owner = np.arange(len(array), dtype=np.int64) * num_peers // len(array)
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


def parse_id_set(value: object, what: str) -> tuple[int, ...]:
    """A set of non-negative integer ids (class labels, peer ids), ascending and unique.

    ``value`` is an integer, a string of items separated by ``,`` or ``+`` where each item
    is an id ``a`` or an inclusive range ``a-b`` (``"0-4"``, ``"0-2+7"``, ``"1, 3, 5-6"``), or
    a list of such integers and strings (``[0, "2-4", 9]``). The same grammar serves label
    sets and named groups of peers. Raises ``ValueError`` naming ``what`` for anything else,
    a range with ``a > b``, or an empty set.

    >>> parse_id_set("0-2+7", "labels")
    (0, 1, 2, 7)
    >>> parse_id_set([5, "0-1"], "peers")
    (0, 1, 5)
    """
    items: list[object] = list(value) if isinstance(value, list | tuple) else [value]
    ids: set[int] = set()
    for item in items:
        if isinstance(item, bool):
            raise ValueError(f"{what}: ids are non-negative integers, got {item!r}")
        if isinstance(item, str):
            for part in filter(None, (p.strip() for p in item.replace("+", ",").split(","))):
                low, dash, high = (x.strip() for x in part.partition("-"))
                if not low.isdigit() or (dash and not high.isdigit()):
                    raise ValueError(
                        f"{what}: {part!r} is not an id 'a' or a range 'a-b' of non-negative "
                        "integers"
                    )
                first, last = int(low), int(high) if dash else int(low)
                if first > last:
                    raise ValueError(
                        f"{what}: range {part!r} is empty (a > b); write 'a-b' with a <= b"
                    )
                ids.update(range(first, last + 1))
            continue
        try:
            number = operator.index(item)  # type: ignore[arg-type]
        except TypeError:
            raise ValueError(
                f"{what}: expected ids and ranges like 3, '0-4' or [0, '2-4'], got {item!r}"
            ) from None
        if number < 0:
            raise ValueError(f"{what}: ids are non-negative integers, got {number}")
        ids.add(number)
    if not ids:
        raise ValueError(f"{what}: the set is empty; give at least one id")
    return tuple(sorted(ids))


def label_sets(
    labels: torch.Tensor,
    num_peers: int,
    peer_labels: Sequence[Iterable[int]],
    seed: int = 0,
) -> list[torch.Tensor]:
    """Explicit label sets: peer i holds samples of the classes ``peer_labels[i]`` only.

    Each class's (shuffled) samples are split in equal (±1) shares among the peers that hold
    it (the extra samples of successive classes go to different holders), so a class held by one peer goes to it whole, and peers holding the same classes
    (e.g. a clique that holds labels 0-4, as in He, Karimireddy & Jaggi 2022, Fig. 4) get IID
    shares of them. Raises ``ValueError`` naming the class or peer when a class that occurs
    in ``labels`` is held by nobody (every sample must have an owner), a label is not a class
    of ``labels``, a peer holds no label, or a class has fewer samples than holders.

    >>> labels = torch.arange(20) % 4
    >>> parts = label_sets(labels, 4, [[0, 1], [0, 1], [2, 3], [2, 3]], seed=0)
    >>> sorted(set(labels[parts[2]].tolist()))
    [2, 3]
    """
    array = _labels_array(labels, "label-sets")
    _check_peers("label-sets", len(array), num_peers)
    if len(peer_labels) != num_peers:
        raise ValueError(
            f"label-sets: needs one label set per peer ({num_peers}), got {len(peer_labels)}"
        )
    sets = [np.asarray(sorted(set(map(int, chosen))), dtype=np.int64) for chosen in peer_labels]
    empty = [peer for peer, chosen in enumerate(sets) if chosen.size == 0]
    if empty:
        raise ValueError(f"label-sets: peer {empty[0]} holds no label; give every peer a set")
    present = np.bincount(array) if array.size else np.zeros(0, dtype=np.int64)
    classes = present.size
    peer_of = np.repeat(np.arange(num_peers), [chosen.size for chosen in sets])
    label_of = np.concatenate(sets)
    unknown = label_of[(label_of < 0) | (label_of >= classes)]
    if unknown.size == 0:
        absent = label_of[present[label_of] == 0]
        unknown = absent
    if unknown.size:
        raise ValueError(
            f"label-sets: label {int(unknown[0])} is not a class of the training labels "
            f"(they are {', '.join(map(str, np.flatnonzero(present).tolist()))})"
        )
    holds = np.zeros((classes, num_peers), dtype=bool)
    holds[label_of, peer_of] = True
    holders = holds.sum(axis=1)
    orphan = np.flatnonzero((present > 0) & (holders == 0))
    if orphan.size:
        raise ValueError(
            f"label-sets: class {int(orphan[0])} is held by no peer; every class of the data "
            f"must be in some peer's set (classes held by nobody: {orphan.tolist()})"
        )
    short = np.flatnonzero(present < holders)
    if short.size:
        c = int(short[0])
        raise ValueError(
            f"label-sets: class {c} has {int(present[c])} samples for {int(holders[c])} peers "
            "holding it; every holder needs at least one"
        )
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(len(array))
    by_class = shuffled[np.argsort(array[shuffled], kind="stable")]
    starts = np.concatenate([[0], np.cumsum(present)[:-1]])
    sorted_labels = array[by_class]
    rank = np.arange(len(array)) - starts[sorted_labels]
    # holder lists per class, ascending peer ids first: [classes, num_peers]
    holder_table = np.argsort(~holds, axis=1, kind="stable")
    # equal shares; class c starts at holder c mod h, so the ±1 remainders of successive
    # classes land on different peers instead of piling up on the first holder
    count = holders[sorted_labels]
    slot = (rank * count // present[sorted_labels] + sorted_labels) % count
    owner = np.empty(len(array), dtype=np.int64)
    owner[by_class] = holder_table[sorted_labels, slot]
    return _group(owner, num_peers)


def label_sets_from_spec(sets: str, num_peers: int) -> list[tuple[int, ...]]:
    """Each peer's label set from the spec form ``S1|S2|...``: k sets for k contiguous,
    near-equal blocks of peers (peer i takes set ``i * k // num_peers``; k = num_peers gives
    one set per peer), each set in the grammar of :func:`parse_id_set`.

    >>> label_sets_from_spec("0-1|2", 4)
    [(0, 1), (0, 1), (2,), (2,)]
    """
    blocks = [block.strip() for block in str(sets).split("|")]
    if not 1 <= len(blocks) <= num_peers:
        raise ValueError(
            f"label-sets: sets gives {len(blocks)} label sets for {num_peers} peers; give "
            "between 1 and num_peers sets separated by '|', e.g. sets=0-4|5-9"
        )
    parsed = [parse_id_set(block, f"label-sets: set {i}") for i, block in enumerate(blocks)]
    k = len(parsed)
    return [parsed[peer * k // num_peers] for peer in range(num_peers)]


def _label_sets_spec(
    labels: torch.Tensor, num_peers: int, sets: str, seed: int = 0
) -> list[torch.Tensor]:
    """The registry's ``label-sets:sets=S1|S2|...`` (see :func:`label_sets_from_spec`)."""
    return label_sets(labels, num_peers, label_sets_from_spec(sets, num_peers), seed)


PARTITIONS: dict[str, Entry[list[torch.Tensor]]] = {
    "iid": Entry("iid", iid, {}, "uniformly random equal shares"),
    "contiguous": Entry(
        "contiguous",
        contiguous,
        {},
        "equal runs of consecutive samples in the data set's order (text: each peer its own files)",
    ),
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
    "label-sets": Entry(
        "label-sets",
        _label_sets_spec,
        {
            "sets": Param(
                str,
                REQUIRED,
                "label sets separated by '|', one per contiguous block of peers, each like "
                "0-4 or 0-2+7 (the simulator's workload.label_sets names groups instead)",
            )
        },
        "explicit label sets: each peer holds only its classes, split evenly among holders",
    ),
}


LABEL_FREE = ("iid", "contiguous")
"""The partitions that need no class labels (a language model's and a regression's)."""


def partition(
    spec: str, labels: torch.Tensor, num_peers: int, seed: int = 0, **params: Any
) -> list[torch.Tensor]:
    """Partition by spec string: ``"iid"``, ``"dirichlet:alpha=0.1"``, ``"shards:shards_per_peer=2"``,
    ``"label-sets:sets=0-4|5-9"`` (the first half of the peers holds classes 0-4, the second
    half 5-9; for other shapes call :func:`label_sets` with one set per peer), ``"contiguous"``.
    A language model's targets (next tokens ``[N, L]``) and a regression's (float ``[N, K]``)
    take the splits that need no labels: ``"iid"`` and ``"contiguous"``."""
    name, given = parse_spec(spec, "partition")
    entry = lookup(PARTITIONS, name, "partition")
    resolved = entry.resolve({**given, **params})
    labels_given = labels.ndim == 1 and not labels.is_floating_point()
    if not labels_given and name not in LABEL_FREE:
        what = (
            "a regression's values"
            if labels.is_floating_point()
            else f"a language model's next tokens {list(labels.shape)}"
        )
        raise ValueError(
            f"{name}: splits by class label, but these targets are {what}; allowed: "
            + ", ".join(LABEL_FREE)
        )
    if not labels_given:  # iid and contiguous count samples only
        labels = torch.zeros(len(labels), dtype=torch.int64)
    return entry.factory(labels, num_peers, seed=seed, **resolved)


def check_partition_spec(spec: str) -> None:
    """Check a partition spec without partitioning anything: a registered name with known,
    well typed parameters; ``ValueError`` saying what is wrong otherwise."""
    name, given = parse_spec(spec, "partition")
    lookup(PARTITIONS, name, "partition").resolve(given)


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
