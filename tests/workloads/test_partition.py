"""Partitions across peers: exact set properties (hypothesis), seeding, and visible label skew."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from workloads import PARTITIONS, contiguous, dirichlet, iid, label_histogram, partition, shards


def check_is_partition(parts: list[torch.Tensor], num_samples: int, num_peers: int) -> None:
    assert len(parts) == num_peers
    assert all(p.dtype == torch.int64 and p.ndim == 1 for p in parts)
    assert min(len(p) for p in parts) >= 1  # no empty peer
    for p in parts:
        assert torch.all(p[1:] > p[:-1])  # ascending, so no duplicates within a peer
    everything = torch.cat(parts).sort().values
    assert torch.equal(everything, torch.arange(num_samples))  # disjoint and covering


labels_strategy = st.integers(2, 12).flatmap(
    lambda classes: st.lists(st.integers(0, classes - 1), min_size=1, max_size=300)
)


@given(labels=labels_strategy, num_peers=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_iid_is_a_balanced_partition(labels: list[int], num_peers: int, seed: int) -> None:
    y = torch.tensor(labels)
    if len(labels) < num_peers:
        with pytest.raises(ValueError, match=f"need num_samples >= {num_peers}"):
            iid(y, num_peers, seed)
        return
    parts = iid(y, num_peers, seed)
    check_is_partition(parts, len(labels), num_peers)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@given(
    labels=labels_strategy,
    num_peers=st.integers(1, 40),
    alpha=st.floats(0.01, 100.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_dirichlet_is_a_partition_with_no_empty_peer(
    labels: list[int], num_peers: int, alpha: float, seed: int
) -> None:
    y = torch.tensor(labels)
    if len(labels) < num_peers:
        with pytest.raises(ValueError, match="cannot give"):
            dirichlet(y, num_peers, alpha, seed)
        return
    check_is_partition(dirichlet(y, num_peers, alpha, seed), len(labels), num_peers)


@given(
    labels=labels_strategy,
    num_peers=st.integers(1, 20),
    shards_per_peer=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_shards_is_a_partition_of_near_equal_shards(
    labels: list[int], num_peers: int, shards_per_peer: int, seed: int
) -> None:
    y = torch.tensor(labels)
    if len(labels) < num_peers * shards_per_peer:
        with pytest.raises(ValueError, match=f"need num_samples >= {num_peers * shards_per_peer}"):
            shards(y, num_peers, shards_per_peer, seed)
        return
    parts = shards(y, num_peers, shards_per_peer, seed)
    check_is_partition(parts, len(labels), num_peers)
    sizes = [len(p) for p in parts]
    # Shards differ by at most one sample, so peers differ by at most shards_per_peer.
    assert max(sizes) - min(sizes) <= shards_per_peer


@given(
    st.integers(min_value=1, max_value=200),
    st.integers(min_value=1, max_value=16),
)
def test_contiguous_is_equal_runs_in_order(num_samples: int, num_peers: int) -> None:
    labels = torch.arange(num_samples) % 10
    if num_samples < num_peers:
        with pytest.raises(ValueError, match="need num_samples >= "):
            contiguous(labels, num_peers)
        return
    parts = contiguous(labels, num_peers)
    assert len(parts) == num_peers
    assert torch.equal(torch.cat(parts), torch.arange(num_samples))  # peer 0 first, in order
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert all(torch.equal(p, q) for p, q in zip(parts, partition("contiguous", labels, num_peers)))


def test_same_seed_same_partition_other_seed_other_partition() -> None:
    y = torch.arange(300) % 10
    for spec in ["iid", "dirichlet:alpha=0.3", "shards:shards_per_peer=2"]:
        a = partition(spec, y, 7, seed=1)
        b = partition(spec, y, 7, seed=1)
        c = partition(spec, y, 7, seed=2)
        assert all(torch.equal(p, q) for p, q in zip(a, b))
        assert not all(torch.equal(p, q) for p, q in zip(a, c))


def mean_classes_per_peer(y: torch.Tensor, parts: list[torch.Tensor]) -> float:
    return float((label_histogram(y, parts, 10) > 0).sum(1).float().mean())


def test_dirichlet_skew_is_visible_at_small_alpha() -> None:
    y = torch.arange(2000) % 10
    skewed = dirichlet(y, 10, alpha=0.05, seed=0)
    near_iid = dirichlet(y, 10, alpha=1000.0, seed=0)
    uniform = iid(y, 10, seed=0)
    # At alpha = 0.05 a peer sees only a couple of classes; at alpha = 1000 all ten.
    assert mean_classes_per_peer(y, skewed) < 4
    assert mean_classes_per_peer(y, near_iid) == 10

    # Largest class share per peer: ~1/10 for IID, dominant for small alpha.
    def dominant_share(parts: list[torch.Tensor]) -> float:
        histogram = label_histogram(y, parts, 10).float()
        return float((histogram.max(1).values / histogram.sum(1)).mean())

    assert dominant_share(skewed) > 0.6
    assert dominant_share(uniform) < 0.2
    assert dominant_share(near_iid) < 0.2


def test_shards_give_each_peer_about_shards_per_peer_classes() -> None:
    y = torch.arange(1000) % 10
    parts = shards(y, 10, shards_per_peer=2, seed=0)
    # 20 shards of 50 align with the 10 classes of 100: every shard is one class.
    assert int((label_histogram(y, parts, 10) > 0).sum(1).max()) <= 2
    assert mean_classes_per_peer(y, parts) > 1  # and the shards were not simply paired by class
    assert [len(p) for p in parts] == [100] * 10


def test_label_histogram_counts() -> None:
    y = torch.tensor([0, 1, 1, 2, 2, 2])
    parts = [torch.tensor([0, 3]), torch.tensor([1, 2, 4, 5])]
    assert label_histogram(y, parts, 3).tolist() == [[1, 0, 1], [0, 2, 2]]


def test_partition_spec_errors() -> None:
    y = torch.arange(20) % 2
    with pytest.raises(
        ValueError,
        match="unknown partition 'pathological'; allowed: contiguous, dirichlet, iid, label-sets, shards",
    ):
        partition("pathological", y, 2)
    with pytest.raises(ValueError, match="dirichlet: parameter 'alpha' must be a float"):
        partition("dirichlet:alpha=lots", y, 2)
    with pytest.raises(ValueError, match=r"dirichlet: alpha must be > 0, got -1\.0"):
        partition("dirichlet:alpha=-1", y, 2)
    with pytest.raises(ValueError, match=r"iid: unknown parameter\(s\) alpha; allowed: \(none\)"):
        partition("iid:alpha=1", y, 2)
    with pytest.raises(ValueError, match="num_peers must be an int >= 1, got 0"):
        partition("iid", y, 0)
    with pytest.raises(ValueError, match="labels must be a 1-D integer tensor"):
        iid(torch.zeros(4, 2, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="shards_per_peer must be an int >= 1"):
        shards(y, 2, 0)
    assert partition("shards", y, 2, shards_per_peer=5)  # keyword overrides work
    assert set(PARTITIONS) == {"iid", "contiguous", "dirichlet", "label-sets", "shards"}
